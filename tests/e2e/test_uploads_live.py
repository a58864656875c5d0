"""Uploads through daphne: a file over the 32 MiB request limit (under METRALE_MAX_FILE_BYTES) is stored byte for byte,
and reaches disk without the server holding it in memory; one over the file limit is a 413 in OpenAI's shape."""
import hashlib
import os

import httpx
import pytest

from inference.bench.live_server import LiveServer
from tests.faults.live import wait_for

pytestmark = pytest.mark.e2e

SIZE = 80_000_000


def peak_rss_kb(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmHWM"))


@pytest.fixture(scope="module")
def bare_server(tmp_path_factory):
    """A daphne server that loads no model (the Files API needs none), files in its workdir's files/;
    one for the module (the large upload runs first, so its peak RSS is the upload's)."""
    tmp = tmp_path_factory.mktemp("uploads")
    server = LiveServer({"METRALE_LOAD_ON_START": "0", "METRALE_FILES_DIR": str(tmp / "files"),
                         "METRALE_MAX_FILE_BYTES": str(SIZE)}, tmp / "srv")
    wait_for(lambda: _alive(server.url), 60, "the server to answer")
    yield server
    server.stop()


def _alive(url: str) -> bool:
    try:
        return httpx.get(url + "/health/live", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def test_a_large_upload_is_stored_whole_without_being_held_in_memory(bare_server, tmp_path):
    path = tmp_path / "big.jsonl"
    block = b'{"custom_id": "x", "method": "POST", "url": "/v1/chat/completions", "body": {}}\n'
    with open(path, "wb") as f:
        f.write(block * (SIZE // len(block)))
    size = os.path.getsize(path)
    before = peak_rss_kb(bare_server.proc.pid)
    with open(path, "rb") as f:
        answer = httpx.post(bare_server.url + "/v1/files", files={"file": ("big.jsonl", f)},
                            data={"purpose": "batch"}, timeout=300)
    assert answer.status_code == 200, answer.text
    assert answer.json()["bytes"] == size
    grown_mb = (peak_rss_kb(bare_server.proc.pid) - before) / 1024
    assert grown_mb < size / 2**20 / 4, f"the server's peak memory grew {grown_mb:.0f} MB for a {size >> 20} MB upload"
    digest = hashlib.sha256()
    with httpx.stream("GET", f"{bare_server.url}/v1/files/{answer.json()['id']}/content", timeout=300) as r:
        for chunk in r.iter_bytes():
            digest.update(chunk)
    assert digest.hexdigest() == hashlib.sha256(path.read_bytes()).hexdigest()


def test_an_upload_over_the_file_limit_is_413(bare_server):
    answer = httpx.post(bare_server.url + "/v1/files", files={"file": ("big.jsonl", b"x" * (SIZE + (2 << 20)))},
                        data={"purpose": "batch"}, timeout=300)
    assert answer.status_code == 413 and answer.json()["error"]["code"] == "request_too_large"
