"""kill -9 of a live server (the embedded default: its own thread runs the batch) in the middle of a batch, then a
restart on the same database: the batch finishes, every line's result is there once, and no line written before
the kill is run again."""
import json

import openai
import pytest

from inference.bench.live_server import LiveServer
from tests.batch_checks import chat_lines, check_every_line_once, create_batch, wait_batch

from .live import ServerDb, model_env, wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


def written(db: ServerDb, batch_id: str) -> dict[str, str]:
    """custom_id -> the output line's id, for the lines the server has written."""
    return {c: json.loads(d)["id"] for c, d in db.rows(
        "select custom_id, data from batches_batchresult where batch_id = ?", batch_id)}


def test_kill_9_mid_batch_then_restart_runs_each_line_once(smollm2_dir, tmp_path):
    env = model_env(smollm2_dir, METRALE_FILES_DIR=str(tmp_path / "files"))
    rows = chat_lines(16, max_tokens=16)
    server = LiveServer(env, tmp_path)
    try:
        server.wait_ready()
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="k", max_retries=0, timeout=60)
        batch = create_batch(client, rows)
        db = ServerDb(server.db)
        wait_for(lambda: len(written(db, batch.id)) >= 3, 240, "three lines written")
        server.proc.kill()  # no drain, no heartbeat stop
        server.proc.wait()
        before = written(db, batch.id)  # what reached the database before the process died
        assert len(before) < len(rows), "the batch finished before the kill: nothing was tested"
    finally:
        server.stop()

    restarted = LiveServer(env, tmp_path)
    try:
        restarted.wait_ready()
        client = openai.OpenAI(base_url=restarted.url + "/v1", api_key="k", max_retries=0, timeout=60)
        done = wait_batch(client, batch.id, timeout_s=600)
        check_every_line_once(client, done, rows, before)
        assert "Traceback" not in restarted.log()
    finally:
        restarted.stop()
