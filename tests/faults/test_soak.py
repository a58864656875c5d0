"""The soak: 64 concurrent streams against the real SmolLM2 engine behind the ASGI application,
in-process, for a bounded time: chat streams (n=1 and n=2) and Responses streams with random
lengths and sampling parameters, a fifth of them left by the client at a random point.

Every stream that runs to its end is well formed (tests/stream_checks.py), none is lost (each
ends, or was left by its client), a stored Responses stream replays exactly; afterwards the KV
pool is whole, no request is running, and the RSS is within 10% of its level after a warm-up (WARM_S
seconds of the same load).

METRALE_SOAK_S sets the soak's length after the warm-up (default 10 s, at least one stream per
client; `make soak` runs 600 s).
"""
from __future__ import annotations

import asyncio
import gc
import json
import os
import random
import sys
import time
from collections import Counter
from dataclasses import dataclass, field

import pytest
from asgiref.sync import async_to_sync

from inference.operations.registry import serving
from inference.engine.async_engine import AsyncEngine
from inference.engine.config import EngineConfig
from inference.engine.tokenizer import Tokenizer
from inference.operations.runtime import Runtime
from tests.api.asgi_client import AsgiRequest
from tests.api.registries import registry_of
from tests.stream_checks import TERMINAL, check_chat_stream, check_responses_stream, sse_data

pytestmark = [pytest.mark.slow, pytest.mark.django_db]

CONCURRENCY = 64
SOAK_S = float(os.environ.get("METRALE_SOAK_S", "10"))
WARM_S = 10.0
DISCONNECT_P = 0.2
CHUNK_TIMEOUT_S = 300.0
WORDS = ("river stone light cloud seven apple quiet north engine garden paper window silver "
         "orange market little forest music yellow winter").split()


def rss_bytes() -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS in /proc/self/status")


@pytest.fixture(scope="module")
def smollm2_engine(smollm2_dir):
    engine = AsyncEngine(config=EngineConfig(
        model_path=str(smollm2_dir), kv_cache_bytes=256 << 20, max_model_len=1024,
        max_num_seqs=CONCURRENCY * 2))
    yield engine
    engine.stop()


@pytest.fixture
def real_runtime(smollm2_engine, smollm2_dir, monkeypatch, raw_asgi_requests, db):
    """The engine behind the ASGI application, with the GIL switch interval the server sets
    (metrale_site/asgi.py): at the default 5 ms the engine thread waits on the event loop."""
    interval = sys.getswitchinterval()
    sys.setswitchinterval(0.0005)
    rt = Runtime(smollm2_engine, Tokenizer.from_folder(smollm2_dir), "smollm2-135m-instruct",
                 smollm2_dir, int(time.time()))
    with serving(registry_of(rt)):
        yield rt
    sys.setswitchinterval(interval)


@dataclass
class Tally:
    streams: Counter = field(default_factory=Counter)
    disconnected: int = 0
    completed: int = 0
    chunks: int = 0
    replays: int = 0


def chat_body(rng: random.Random) -> tuple[dict, int]:
    n = rng.choice((1, 1, 2))
    body = {"model": "smollm2-135m-instruct", "stream": True, "n": n, "max_tokens": rng.randint(1, 16),
            "messages": [{"role": "user", "content": " ".join(rng.choices(WORDS, k=rng.randint(1, 30)))}]}
    options = {"temperature": rng.choice((0, 0.7, 1.3)), "top_p": rng.choice((1.0, 0.9, 0.5)),
               "top_k": rng.choice((-1, 20)), "min_p": rng.choice((0.0, 0.05)),
               "seed": rng.randint(0, 2**31), "presence_penalty": rng.choice((0, 0.5)),
               "frequency_penalty": rng.choice((0, 0.3)), "ignore_eos": rng.random() < 0.3,
               "stop": rng.choice((None, ["."], ["the", "\n"])),
               "stream_options": rng.choice((None, {"include_usage": True}))}
    body.update({k: v for k, v in options.items() if v is not None and rng.random() < 0.6})
    if rng.random() < 0.2:
        body.update(logprobs=True, top_logprobs=rng.randint(0, 3))
    return body, n


def responses_body(rng: random.Random) -> dict:
    body = {"model": "smollm2-135m-instruct", "stream": True, "store": rng.random() < 0.5,
            "input": " ".join(rng.choices(WORDS, k=rng.randint(1, 30))),
            "max_output_tokens": rng.randint(1, 16), "temperature": rng.choice((0, 0.8)),
            "ignore_eos": rng.random() < 0.3}
    if rng.random() < 0.3:
        body["instructions"] = "Answer briefly."
    return body


async def one_stream(rng: random.Random, tally: Tally) -> None:
    """One client: a random request, read to the end or left at a random point; checked."""
    kind = rng.choice(("chat", "chat", "responses"))
    if kind == "chat":
        body, n = chat_body(rng)
        path = "/v1/chat/completions"
    else:
        body, n = responses_body(rng), 1
        path = "/v1/responses"
    leave_after = rng.randint(0, 3) if rng.random() < DISCONNECT_P else None
    data = json.dumps(body).encode()
    request = AsgiRequest("POST", path, {"content-type": "application/json",
                                         "content-length": str(len(data))}, data)
    await request.start(timeout_s=CHUNK_TIMEOUT_S)
    assert request.status == 200, (body, request.status)
    tally.streams[kind] += 1
    raw, received = "", 0
    while not request.finished:
        if leave_after is not None and received >= leave_after:
            await request.disconnect(timeout_s=CHUNK_TIMEOUT_S)
            tally.disconnected += 1
            payloads = sse_data(raw.rsplit("\n\n", 1)[0] + "\n\n") if "\n\n" in raw else []
            check_prefix(kind, payloads)
            return
        raw += (await request.chunk(timeout_s=CHUNK_TIMEOUT_S)).decode()
        received += 1
        tally.chunks += 1
    await asyncio.wait_for(request.task, CHUNK_TIMEOUT_S)
    payloads = sse_data(raw)
    if kind == "chat":
        check_chat_stream(payloads, n)
    else:
        final = check_responses_stream(payloads)
        if body["store"]:
            replay = await AsgiRequest("GET", f"/v1/responses/{final['id']}?stream=true").start()
            assert sse_data((await replay.read_all(CHUNK_TIMEOUT_S)).decode()) == payloads
            tally.replays += 1
    tally.completed += 1


def check_prefix(kind: str, payloads: list) -> None:
    """What a client that left saw is the beginning of a well-formed stream."""
    if kind == "chat":
        seen: set[int] = set()
        for chunk in payloads:
            if chunk == "[DONE]":
                continue
            assert "error" not in chunk, chunk
            for choice in chunk["choices"]:
                if choice["index"] not in seen:
                    assert choice["delta"].get("role") == "assistant"
                    seen.add(choice["index"])
    else:
        assert [e["sequence_number"] for e in payloads] == list(range(len(payloads)))
        assert sum(e["type"] in TERMINAL for e in payloads) <= 1


async def soak(seconds: float, seed: int, tally: Tally) -> None:
    """CONCURRENCY clients, each starting a new stream as soon as its last one ended, until the
    time is up (each runs one at least)."""
    deadline = time.monotonic() + seconds

    async def client(i: int):
        rng = random.Random(seed * 1000 + i)
        await one_stream(rng, tally)
        while time.monotonic() < deadline:
            await one_stream(rng, tally)

    await asyncio.gather(*(client(i) for i in range(CONCURRENCY)))


def wait_idle(engine: AsyncEngine, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while engine.engine.has_work() or engine._handles:
        assert time.monotonic() < deadline, "requests were left running"
        time.sleep(0.05)


def test_soak_64_streams_with_disconnects_leaves_the_engine_whole(real_runtime):
    engine = real_runtime.engine
    warm = Tally()
    # Seconds of the same load: batches of every size, caches, and the allocator's arenas grown to their
    # level. Run alone after one stream per client, soaks of 10 s and of 40 s both ended about 250 MB
    # (+26-30%) above it, a level, not a leak; after 10 s of warm-up the next 10 s added 1.7%.
    async_to_sync(soak)(WARM_S, 1, warm)
    wait_idle(engine)
    gc.collect()
    rss_warm = rss_bytes()

    tally = Tally()
    started = time.monotonic()
    async_to_sync(soak)(SOAK_S, 2, tally)
    elapsed = time.monotonic() - started
    wait_idle(engine)
    gc.collect()
    rss_after = rss_bytes()

    blocks = engine.engine.block_manager
    total = sum(tally.streams.values())
    print(f"\nsoak: {total} streams ({dict(tally.streams)}) in {elapsed:.0f} s, "
          f"{tally.disconnected} left by their client ({tally.disconnected / total:.0%}), "
          f"{tally.completed} checked to the end, {tally.replays} replays, {tally.chunks} chunks; "
          f"RSS after warm-up {rss_warm / 2**20:.0f} MiB, after {rss_after / 2**20:.0f} MiB "
          f"({rss_after / rss_warm - 1:+.1%}); KV blocks free {blocks.num_free_blocks}/"
          f"{blocks.num_blocks}")
    assert tally.completed + tally.disconnected == total  # none lost
    assert tally.streams["chat"] and tally.streams["responses"] and tally.disconnected
    assert blocks.num_free_blocks == blocks.num_blocks
    assert not engine.engine.scheduler.running and not engine.engine.scheduler.waiting
    assert rss_after <= rss_warm * 1.10
