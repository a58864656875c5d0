"""The generating surfaces' one flow from a validated body to its answer: prepare -> wire, shared by the views and the Batch API.

A view parses its body, takes the runtime, and answers `surface.call(...)`'s prepared request
through `views.respond` (admission, streaming); a batch line (batches/lines.py) runs the
same call's `blocking_run`, so a line's body is exactly what the endpoint answers. Source:
issue 17 ("each line runs through the same preparation and engine as the synchronous
endpoint").
"""
from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from dataclasses import dataclass

from .serving import chat
from .serving import completions as legacy_completions
from .serving.choices import Choices
from .serving.deltas import Usage
from .serving.prepare import Prepared, prepare
from .stored_completions import save_chat_completion


@dataclass(slots=True)
class Call:
    """One prepared generating request and the surface's wire that answers it. param: the field a
    refused submission names."""

    prepared: Prepared
    wire: object
    param: str

    async def blocking_run(self, rt) -> tuple[dict, Usage]:
        """Submit and run to the end: (the blocking body the endpoint answers, its usage). Raises
        RequestRejected / EngineOverloaded from the engine's submit and ApiError from the wire."""
        run = Choices(rt.engine, rt.tokenizer, self.prepared)
        return await self.wire.body(run), run.usage


async def chat_call(req: dict, rt, *, tenant, request_id: str | None, cache_salt: str,
                    priority: int = 0) -> Call:
    """POST /v1/chat/completions's validated body (chat.parse) prepared; `tenant` owns a stored
    completion (store: true). priority: EngineRequest.priority (0 interactive). Raises what
    prepare raises (ApiError)."""
    greq = dataclasses.replace(chat.generation_request(req), priority=priority)
    prepared = await prepare(greq, rt, request_id=request_id, cache_salt=cache_salt)
    wire = chat.ChatWire(req, prepared, save=functools.partial(save_chat_completion, tenant))
    return Call(prepared, wire, "messages")


async def completions_call(req: dict, rt, *, tenant, request_id: str | None, cache_salt: str,
                           priority: int = 0) -> Call:
    """POST /v1/completions's validated body (completions.parse) prepared. Raises what prepare raises."""
    greq = dataclasses.replace(legacy_completions.generation_request(req), priority=priority)
    prepared = await prepare(greq, rt, request_id=request_id, cache_salt=cache_salt)
    return Call(prepared, legacy_completions.CompletionWire(req, prepared, rt.tokenizer), "prompt")


# endpoint -> (parse raw body -> validated dict, prepare it -> Call)
SURFACES: dict[str, tuple[Callable, Callable]] = {
    "/v1/chat/completions": (chat.parse, chat_call),
    "/v1/completions": (legacy_completions.parse, completions_call),
}
