"""Drive an in-process AsyncEngine (no HTTP) with a fixed concurrency and record per-request timings."""
from __future__ import annotations

import asyncio
import time

from inference.engine.outputs import TokenEvent
from inference.engine.request import EngineRequest
from inference.engine.sampling_params import SamplingParams

from .stats import RequestTiming
from .workload import BenchRequest


def chat_prompt_ids(tokenizer, text: str) -> list[int]:
    """The templated single-user-message prompt, as the HTTP path builds it."""
    return tokenizer.encode(tokenizer.apply_chat_template([{"role": "user", "content": text}],
                                                          add_generation_prompt=True))


async def _one(engine, tokenizer, req: BenchRequest) -> RequestTiming:
    params = SamplingParams(temperature=0, max_tokens=req.output_tokens, ignore_eos=True)
    t0 = time.perf_counter()
    handle = engine.submit(EngineRequest(chat_prompt_ids(tokenizer, req.prompt), params))
    first = None
    n = 0
    async for ev in handle:
        if isinstance(ev, TokenEvent):
            n += 1
            if first is None:
                first = time.perf_counter()
    end = time.perf_counter()
    return RequestTiming((first or end) - t0, end - t0, n)


def run_offline(engine, tokenizer, requests: list[BenchRequest], concurrency: int) -> tuple[list[RequestTiming], float]:
    """Run `requests` with at most `concurrency` in flight. Returns (timings, wall seconds)."""

    async def main():
        sem = asyncio.Semaphore(concurrency)

        async def guarded(r):
            async with sem:
                return await _one(engine, tokenizer, r)

        t0 = time.perf_counter()
        timings = await asyncio.gather(*(guarded(r) for r in requests))
        return list(timings), time.perf_counter() - t0

    return asyncio.run(main())
