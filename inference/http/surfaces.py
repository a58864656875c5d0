"""The generating surfaces' one flow from a validated body to its answer: prepare -> wire, shared by the views and the Batch API.

A view parses its body, takes the model its `model` names from the registry, and answers `surface.call(...)`'s prepared request
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

from ..serving import chat
from ..serving import embeddings as embeddings_api
from ..serving.errors import ApiError
from ..serving import completions as legacy_completions
from ..serving.choices import Choices
from ..serving.deltas import Usage
from ..serving.prepare import Prepared, light_work, prepare
from ..stored.completions import save_chat_completion


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
                    priority: int = 0, size: int | None = None) -> Call:
    """POST /v1/chat/completions's validated body (chat.parse) prepared; `tenant` owns a stored
    completion (store: true). priority: EngineRequest.priority (0 interactive). size: the body's bytes
    (prepare's: a small one is templated on the event loop). Raises what prepare raises (ApiError)."""
    greq = dataclasses.replace(chat.generation_request(req), priority=priority)
    prepared = await prepare(greq, rt, request_id=request_id, cache_salt=cache_salt, size=size)
    wire = chat.ChatWire(req, prepared, save=functools.partial(save_chat_completion, tenant))
    return Call(prepared, wire, "messages")


async def completions_call(req: dict, rt, *, tenant, request_id: str | None, cache_salt: str,
                           priority: int = 0, size: int | None = None) -> Call:
    """POST /v1/completions's validated body (completions.parse) prepared; size as chat_call's. Raises
    what prepare raises."""
    greq = dataclasses.replace(legacy_completions.generation_request(req), priority=priority)
    prepared = await prepare(greq, rt, request_id=request_id, cache_salt=cache_salt, size=size)
    return Call(prepared, legacy_completions.CompletionWire(req, prepared, rt.tokenizer), "prompt")


@dataclass(slots=True)
class EmbeddingsCall:
    """One prepared embeddings request (serving/embeddings.EmbeddingCall) and the model that runs it."""

    call: embeddings_api.EmbeddingCall
    service: object  # operations.runtime.EmbeddingService
    param: str = "input"

    async def vectors(self) -> list[bytes]:
        """Embed the inputs: each vector's float32 little-endian bytes. Raises ApiError 500 when this
        request's pass failed in the engine (other requests are unaffected)."""
        try:
            return await self.service.runner.submit(self.call.inputs)
        except RuntimeError as exc:
            raise ApiError(500, f"The embedding failed: {exc}", type="server_error", code="embedding_failed") from exc

    async def blocking_run(self, rt) -> tuple[dict, Usage]:
        """(OpenAI's embedding list, its usage: the inputs' tokens). Raises ApiError."""
        body = embeddings_api.response_body(self.call, self.service.name, await self.vectors())
        return body, Usage(prompt_tokens=self.call.prompt_tokens)


async def embeddings_call(req: dict, service, *, tenant, request_id: str | None, cache_salt: str,
                          priority: int = 0, size: int | None = None) -> EmbeddingsCall:
    """POST /v1/embeddings's validated body (embeddings.parse) tokenized and checked against `service`, the
    embedding model its `model` names (views.ready_model / the batch runner take it from the registry), on
    the prepare pool, or inline for a body of at most prepare.INLINE_BYTES (`size`, its bytes).
    Raises ApiError (serving/embeddings.prepare's 400s)."""
    prepared = await light_work(embeddings_api.prepare, size, req, service)
    return EmbeddingsCall(prepared, service)


# endpoint -> (parse raw body -> validated dict, prepare it -> Call)
SURFACES: dict[str, tuple[Callable, Callable]] = {
    "/v1/chat/completions": (chat.parse, chat_call),
    "/v1/completions": (legacy_completions.parse, completions_call),
    "/v1/embeddings": (embeddings_api.parse, embeddings_call),
}
