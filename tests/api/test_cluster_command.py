"""manage.py cluster (make cluster): a missing service is named with the address it was looked for at; stopping
when nothing runs says so. (Starting one is what tests/services/test_router_cluster.py's processes do.)"""
import io

import pytest
from django.core.management import CommandError, call_command

from inference.management.commands import cluster


@pytest.fixture
def folder(tmp_path, monkeypatch):
    monkeypatch.setattr(cluster, "data_dir", lambda: tmp_path)
    return tmp_path / "cluster"


def test_start_names_each_service_that_is_not_running(folder):
    with pytest.raises(CommandError) as refused:
        call_command("cluster", "start", "--database-url", "postgresql://postgres@127.0.0.1:1/metrale",
                     "--redis-url", "redis://127.0.0.1:2/0")
    message = str(refused.value)
    assert "PostgreSQL is not running at 127.0.0.1:1 (DATABASE_URL=postgresql://postgres@127.0.0.1:1/metrale)" in message
    assert "Redis is not running at 127.0.0.1:2 (REDIS_URL=redis://127.0.0.1:2/0)" in message
    assert not (folder / "pids.json").exists()


def test_stop_with_nothing_running_says_so(folder):
    out = io.StringIO()
    call_command("cluster", "stop", stdout=out)
    assert out.getvalue().strip() == "No cluster is running."
