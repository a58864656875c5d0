"""Stress: many random requests with cancels, timeouts and failures on a small pool; all end as asked
and the KV pool is whole afterwards."""
import asyncio
import random

import pytest

from inference.engine.async_engine import AsyncEngine
from inference.engine.outputs import Failed, Finished, TokenEvent
from inference.engine.sampling_params import SamplingParams
from inference.engine.request import EngineRequest

from .test_async_engine import LLMEngine_block_bytes, make_engine
from .tiny_models import make_tiny_model


@pytest.fixture(scope="module")
def tiny_folder(tmp_path_factory):
    return make_tiny_model("llama", tmp_path_factory.mktemp("tiny") / "llama")


def test_it_ends_64_random_requests_as_asked_and_leaves_the_pool_whole(tiny_folder):
    # 24 blocks of 16 tokens: far fewer than 64 requests need, so preemption happens.
    engine = make_engine(tiny_folder, kv_cache_bytes=24 * LLMEngine_block_bytes(tiny_folder),
                         max_num_batched_tokens=64, max_num_seqs=16)
    ae = AsyncEngine(engine)
    rng = random.Random(7)

    async def one(i):
        prompt = [rng.randrange(3, 320) for _ in range(rng.randint(1, 120))]
        params = SamplingParams(temperature=rng.choice([0.0, 0.8]), top_k=rng.choice([0, 20]),
                                max_tokens=rng.randint(1, 80), seed=rng.choice([None, i]),
                                repetition_penalty=rng.choice([1.0, 1.2]), ignore_eos=rng.random() < 0.5)
        kind = rng.choice(["finish", "finish", "cancel", "timeout"])
        handle = ae.submit(EngineRequest(prompt, params, timeout_s=0.02 if kind == "timeout" else None))
        n, end = 0, None
        async for ev in handle:
            if isinstance(ev, TokenEvent):
                n += 1
                if kind == "cancel" and n == 2:
                    handle.abort()
            else:
                end = ev
        return kind, params, n, end

    async def run():
        return await asyncio.gather(*(one(i) for i in range(64)))

    results = asyncio.run(run())
    for kind, params, n, end in results:
        assert isinstance(end, Finished), end
        assert n <= params.max_tokens
        if kind == "finish":
            assert end.reason in ("stop", "length")
            assert end.reason == "stop" or n == params.max_tokens
        elif kind == "cancel":
            assert end.reason in ("cancelled", "stop", "length")
        else:
            assert end.reason in ("timeout", "stop", "length")
    assert engine.scheduler.num_preemptions > 0
    bm = engine.block_manager
    assert bm.num_free_blocks == bm.num_blocks
    assert all(b.ref_count == 0 for b in bm.blocks)
    assert not engine.scheduler.running and not engine.scheduler.waiting
    ae.stop()


def test_an_engine_error_on_every_retry_fails_the_live_requests_frees_their_blocks_and_keeps_serving(
        tiny_folder, monkeypatch):
    engine = make_engine(tiny_folder)
    ae = AsyncEngine(engine)
    real = engine.runner.execute
    state = {"calls": 0, "broken": False}

    def flaky(batch):
        state["calls"] += 1
        if state["calls"] == 3:  # from the third forward on, every forward fails (retries too)
            state["broken"] = True
        if state["broken"]:
            raise RuntimeError("injected failure")
        return real(batch)

    monkeypatch.setattr(engine.runner, "execute", flaky)

    async def collect(prompt):
        events = [ev async for ev in ae.submit(EngineRequest(prompt, SamplingParams(temperature=0, max_tokens=20, ignore_eos=True)))]
        return events[-1]

    async def run():
        failed = await asyncio.gather(collect([5] * 10), collect([6] * 12))
        state["broken"] = False
        after = await collect([7] * 9)
        return failed, after

    failed, after = asyncio.run(run())
    assert all(isinstance(e, Failed) and "injected failure" in e.message for e in failed)
    assert isinstance(after, Finished) and after.reason == "length"
    assert engine.block_manager.num_free_blocks == engine.block_manager.num_blocks
    ae.stop()


def test_a_step_that_fails_once_is_retried_and_every_request_gets_its_tokens(tiny_folder, monkeypatch):
    engine = make_engine(tiny_folder)
    ae = AsyncEngine(engine)
    real = engine.runner.execute
    params = [SamplingParams(temperature=0, max_tokens=12, ignore_eos=True),
              SamplingParams(temperature=1.0, seed=5, max_tokens=12, ignore_eos=True)]

    async def run():
        return await asyncio.gather(*(
            collect_tokens(ae, EngineRequest([5 + i] * (10 + i), params[i % 2])) for i in range(4)))

    clean = asyncio.run(run())
    calls = {"n": 0}

    def once(batch):
        calls["n"] += 1
        if calls["n"] == 4:
            raise RuntimeError("transient")
        return real(batch)

    monkeypatch.setattr(engine.runner, "execute", once)
    assert asyncio.run(run()) == clean and calls["n"] > 4
    ae.stop()


async def collect_tokens(ae, request):
    tokens, end = [], None
    async for ev in ae.submit(request):
        if isinstance(ev, TokenEvent):
            tokens.append(ev.token_id)
        else:
            end = ev
    assert isinstance(end, Finished), end
    return tokens
