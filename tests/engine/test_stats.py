"""EngineStats on a real (tiny) engine: counters, vLLM's histograms and buckets, operator cancel and
the snapshot (tests/api/test_metrics.py reads the same through /metrics)."""
import asyncio

import pytest

from inference.engine.async_engine import AsyncEngine
from inference.engine.config import EngineConfig
from inference.engine.llm_engine import LLMEngine
from inference.engine.outputs import Finished, TokenEvent
from inference.engine.request import EngineRequest
from inference.engine.sampling_params import SamplingParams
from inference.engine.stats import (ITL_BUCKETS_S, REQUEST_LATENCY_BUCKETS_S, TTFT_BUCKETS_S, Histogram,
                                    build_1_2_5_buckets, percentile)

from .tiny_models import make_tiny_model


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    folder = make_tiny_model("llama", tmp_path_factory.mktemp("tiny") / "llama")
    ae = AsyncEngine(LLMEngine(EngineConfig(model_path=str(folder), kv_cache_bytes=4 << 20,
                                            weights="model")))
    yield ae
    ae.stop()


def run(coro):
    return asyncio.run(coro)


async def generate(engine, *args, **kwargs):
    return await collect(engine.submit(EngineRequest(*args, **kwargs)))


async def collect(handle):
    tokens, end = 0, None
    async for event in handle:
        if isinstance(event, TokenEvent):
            tokens += 1
        else:
            end = event
    return tokens, end


def numbers(stats) -> dict:
    """Every counter and histogram count, to compare before and after."""
    return {"prompt": stats.prompt_tokens, "generation": stats.generation_tokens,
            "queries": stats.prefix_cache_queries, "hits": stats.prefix_cache_hits,
            **{f"success_{k}": v for k, v in stats.request_success.items()},
            **{name: getattr(stats, name).count for name in (
                "ttft_s", "itl_s", "e2e_s", "queue_s", "prefill_s", "decode_s", "request_prompt_tokens",
                "request_generation_tokens")}}


def grew(before: dict, after: dict) -> dict:
    return {k: after[k] - before[k] for k in before if after[k] != before[k]}


def test_the_buckets_are_vllms():
    assert build_1_2_5_buckets(100) == (1, 2, 5, 10, 20, 50, 100)
    assert build_1_2_5_buckets(4096)[-1] == 2000
    assert TTFT_BUCKETS_S[0] == 0.001 and TTFT_BUCKETS_S[-1] == 2560.0 and len(TTFT_BUCKETS_S) == 22
    assert ITL_BUCKETS_S[0] == 0.01 and ITL_BUCKETS_S[-1] == 80.0 and len(ITL_BUCKETS_S) == 19
    assert REQUEST_LATENCY_BUCKETS_S[0] == 0.3 and REQUEST_LATENCY_BUCKETS_S[-1] == 7680.0


def test_a_histogram_reads_cumulative_with_its_count():
    h = Histogram((1, 2))
    for value in (0.5, 1, 1.5, 3):
        h.observe(value)
    cumulative, count, total = h.read()
    assert cumulative == [(1, 2), (2, 3), (float("inf"), 4)] and count == 4 and total == 6.0
    assert percentile([1, 2, 3, 4], 0.5) == 2 and percentile([1, 2, 3, 4], 0.99) == 4 and percentile([], 0.5) is None


def test_a_length_capped_request_counts_once_and_itl_counts_tokens_after_the_first(engine):
    stats = engine.engine.stats
    before = numbers(stats)
    tokens, end = run(generate(engine, list(range(3, 40)), SamplingParams(
        temperature=0, max_tokens=7, ignore_eos=True)))
    assert tokens == 7 and end.reason == "length"
    assert grew(before, numbers(stats)) == {
        "prompt": 37, "generation": 7, "queries": 37, "success_length": 1, "ttft_s": 1, "itl_s": 6,
        "e2e_s": 1, "queue_s": 1, "prefill_s": 1, "decode_s": 1, "request_prompt_tokens": 1,
        "request_generation_tokens": 1}
    assert engine.engine.scheduler.running == []


def test_a_repeated_prompt_grows_prefix_hits(engine):
    stats = engine.engine.stats
    prompt = list(range(5, 5 + 70))  # four full blocks of 16, and the tail
    params = SamplingParams(temperature=0, max_tokens=2, ignore_eos=True)
    run(generate(engine, prompt, params, cache_salt="t"))
    before = numbers(stats)
    _, end = run(generate(engine, prompt, params, cache_salt="t"))
    assert end.cached_tokens == 69  # four full blocks, and the first request's tail but the last token
    growth = grew(before, numbers(stats))
    assert growth["hits"] == 69 and growth["queries"] == 70


def test_an_operator_cancel_ends_the_request_in_band_and_counts_as_abort(engine):
    stats = engine.engine.stats
    before = numbers(stats)

    async def scenario():
        handle = engine.submit(EngineRequest(list(range(3, 20)), SamplingParams(
            temperature=0, max_tokens=200, ignore_eos=True), request_id="req_op-0"))
        seen = 0
        async for event in handle:
            if isinstance(event, TokenEvent):
                seen += 1
                if seen == 2:
                    assert await asyncio.wrap_future(engine.cancel("req_op")) == 1
            else:
                return seen, event
        raise AssertionError("no end")

    seen, end = run(scenario())
    assert isinstance(end, Finished) and end.reason == "cancelled" and seen < 200
    assert grew(before, numbers(stats))["success_abort"] == 1
    snap = snapshot_now(engine)
    assert snap["running"] == [] and snap["kv"]["blocks_used"] == 0
    assert engine.cancel("req_op").result(timeout=5) == 0


async def _snapshot(engine):
    return await asyncio.wrap_future(engine.snapshot())


def snapshot_now(engine):
    return engine.snapshot().result(timeout=5)


def test_a_client_that_leaves_counts_as_abort_and_leaves_running_within_a_step(engine):
    stats = engine.engine.stats
    before = numbers(stats)

    async def scenario():
        handle = engine.submit(EngineRequest(list(range(3, 20)), SamplingParams(
            temperature=0, max_tokens=200, ignore_eos=True)))
        async for event in handle:
            break
        handle.abort()
        # One snapshot is taken at the next step boundary: the abort was applied before it.
        return await _snapshot(engine)

    snap = run(scenario())
    assert snap["running"] == [] and snap["waiting"] == []
    assert grew(before, numbers(stats))["success_abort"] == 1


def test_the_snapshot_shows_running_requests_without_text(engine):
    async def scenario():
        handle = engine.submit(EngineRequest(list(range(3, 35)), SamplingParams(
            temperature=0, max_tokens=200, ignore_eos=True), request_id="req_snap-0"))
        async for event in handle:
            if isinstance(event, TokenEvent):
                break
        snap = await _snapshot(engine)
        handle.abort()
        return snap

    snap = run(scenario())
    [view] = snap["running"]
    assert view["request_id"] == "req_snap-0" and view["prompt_tokens"] == 32
    assert view["prefill_progress"] == 1.0 and view["generated_tokens"] >= 1 and view["age_s"] > 0
    assert set(view) == {"request_id", "state", "prompt_tokens", "prefill_tokens_done", "prefill_progress",
                         "cached_tokens", "generated_tokens", "max_tokens", "tokens_per_s", "age_s"}
    kv = snap["kv"]
    assert kv["blocks_used"] + kv["blocks_cached"] + kv["blocks_free"] == kv["blocks_total"]
    assert kv["blocks_used"] >= 2 and 0 < kv["usage"] <= 1
    points = snap["series"]["points"]
    assert points and points[-1]["generation_tokens_per_s"] > 0
    assert snap["series"]["window"]["ttft_p50_s"] is not None
    assert snap["engine"]["block_size"] == 16


def test_counters_only_grow(engine):
    stats = engine.engine.stats
    reads = []

    async def scenario():
        handles = [engine.submit(EngineRequest(list(range(3, 30 + i)), SamplingParams(
            temperature=0, max_tokens=12, ignore_eos=True))) for i in range(4)]
        task = asyncio.gather(*(collect(h) for h in handles))
        while not task.done():
            reads.append(numbers(stats))
            await asyncio.sleep(0.002)
        await task
        reads.append(numbers(stats))

    run(scenario())
    assert len(reads) > 2
    for earlier, later in zip(reads, reads[1:]):
        assert all(later[k] >= earlier[k] for k in earlier)
    assert reads[-1]["success_length"] - reads[0]["success_length"] == 4


def test_a_failing_snapshot_or_stats_never_stop_the_engine(engine, monkeypatch):
    from inference.engine import async_engine

    def broken(*args):
        raise RuntimeError("dashboard bug")

    monkeypatch.setattr(async_engine, "engine_snapshot", broken)
    with pytest.raises(RuntimeError, match="dashboard bug"):
        engine.snapshot().result(timeout=5)
    monkeypatch.setattr(engine.engine.stats, "record_step", broken)
    tokens, end = run(generate(engine, list(range(3, 20)), SamplingParams(temperature=0, max_tokens=3,
                                                                           ignore_eos=True)))
    assert tokens == 3 and end.reason == "length"
