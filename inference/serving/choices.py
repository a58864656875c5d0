"""Several engine requests behind one API request (n > 1, several prompts), merged into (index, delta) pairs.

Each choice is its own engine request (the engine shares their prompt blocks);
deltas of one choice keep their order, choices interleave as the engine produces
them. Leaving the merge early (client gone, error) aborts every request.
"""
from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from .deltas import Error, Finish, StreamDelta, Usage
from .pipeline import Generation, GenerationInput


class Choices:
    """Submits every input at construction (RequestRejected is raised then, after aborting any
    already submitted); `merged()` yields (choice index, delta) until every choice has ended."""

    def __init__(self, engine, tokenizer, inputs: list[GenerationInput]):
        self.generations: list[Generation] = []
        try:
            for gen in inputs:
                self.generations.append(Generation(engine, tokenizer, gen))
        except BaseException:
            self.abort()
            raise

    def __len__(self) -> int:
        return len(self.generations)

    def abort(self) -> None:
        """Drop every engine request still running."""
        for g in self.generations:
            g.abort()

    @property
    def engine_s(self) -> float | None:
        """Seconds from the first submit to the last end seen, when every choice has ended."""
        ends = [g.finished_at for g in self.generations]
        if not ends or None in ends:
            return None
        return max(ends) - min(g.submitted_at for g in self.generations)

    async def merged(self) -> AsyncIterator[tuple[int, StreamDelta]]:
        """(index, delta) pairs; each choice ends with its Finish or Error."""
        if len(self.generations) == 1:
            try:
                async for delta in self.generations[0].deltas():
                    yield 0, delta
            finally:
                self.abort()
            return
        queue: asyncio.Queue = asyncio.Queue()

        async def pump(index: int, generation: Generation) -> None:
            try:
                async for delta in generation.deltas():
                    queue.put_nowait((index, delta))
            except Exception as exc:  # a bug in the pipeline ends this choice in-band, not the process
                queue.put_nowait((index, Error(f"internal error: {exc}")))
            finally:
                queue.put_nowait((index, None))

        tasks = [asyncio.create_task(pump(i, g)) for i, g in enumerate(self.generations)]
        try:
            live = len(tasks)
            while live:
                index, delta = await queue.get()
                if delta is None:
                    live -= 1
                else:
                    yield index, delta
        finally:
            self.abort()
            for task in tasks:
                task.cancel()


def total_usage(finishes: list[Finish]) -> Usage:
    """One request's usage from its choices' Finish deltas: the prompt counted once (as OpenAI does),
    completion tokens summed."""
    if not finishes:
        return Usage()
    first = finishes[0].usage
    return Usage(first.prompt_tokens, sum(f.usage.completion_tokens for f in finishes), first.cached_prompt_tokens,
                 sum(f.usage.reasoning_tokens for f in finishes))
