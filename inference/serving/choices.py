"""One API request's engine requests (n choices, several prompts) merged into (index, delta) pairs, with its usage.

Each choice is its own engine request (the engine shares their prompt blocks);
deltas of one choice keep their order, choices interleave as the engine produces
them. Leaving the merge early (client gone, error) aborts every request. Usage
follows OpenAI: each prompt counted once, completion tokens summed over choices.
"""
from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from inference.http.request_context import current_record

from .beam_search import BeamChoices
from .deltas import Error, Finish, StreamDelta, Usage
from .pipeline import Generation


class Choices:
    """Submits every choice of a prepared request at construction (RequestRejected and
    EngineOverloaded are raised then, after aborting any already submitted); `merged()` yields
    (choice index, delta) until every choice has ended. `usage` is the request's usage so far
    (final once every choice has finished)."""

    def __init__(self, engine, tokenizer, prepared):
        self.prepared = prepared
        self.generations: list[Generation] = []
        self.finishes: dict[int, Finish] = {}
        self._generated = [0] * len(prepared.inputs)
        # The request log's record of the HTTP request this generation answers (request_log.RequestRecord).
        self._record = current_record.get()
        if self._record is not None:
            self._record.attach(self)
        try:
            if getattr(prepared, "beam", None) is not None:
                self.generations = BeamChoices(engine, tokenizer, prepared).generations
            for gen in prepared.inputs if not self.generations else ():
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

    @property
    def usage(self) -> Usage:
        """Token counts so far: each prompt once (with its cached tokens, from the first of its
        choices to finish), completion and reasoning tokens summed over choices."""
        p = self.prepared
        usage = Usage()
        for k, ids in enumerate(p.prompt_ids):
            first = next((self.finishes[j] for j in range(k * p.n, (k + 1) * p.n) if j in self.finishes), None)
            usage.prompt_tokens += first.usage.prompt_tokens if first else len(ids)
            usage.cached_prompt_tokens += first.usage.cached_prompt_tokens if first else 0
        for j, generated in enumerate(self._generated):
            finish = self.finishes.get(j)
            usage.completion_tokens += finish.usage.completion_tokens if finish else generated
            usage.reasoning_tokens += finish.usage.reasoning_tokens if finish else 0
            if finish:
                usage.accepted_prediction_tokens += finish.usage.accepted_prediction_tokens
                usage.rejected_prediction_tokens += finish.usage.rejected_prediction_tokens
        return usage

    def _seen(self, index: int, delta: StreamDelta) -> None:
        if self._record is not None:
            self._record.on_delta(index, delta)
        if isinstance(delta, Finish):
            self.finishes[index] = delta
        else:
            self._generated[index] += len(getattr(delta, "token_ids", None) or ())

    async def merged(self) -> AsyncIterator[tuple[int, StreamDelta]]:
        """(index, delta) pairs; each choice ends with its Finish or Error."""
        if len(self.generations) == 1:
            try:
                async for delta in self.generations[0].deltas():
                    self._seen(0, delta)
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
                    self._seen(index, delta)
                    yield index, delta
        finally:
            self.abort()
            for task in tasks:
                task.cancel()
