"""A batch's input lines: validated as a whole (the batch fails on any bad line), then each run like its endpoint.

Source: OpenAI API reference, "Batch" (input lines {custom_id, method, url, body}; output
lines {id, custom_id, response: {status_code, request_id, body}, error}); LiteLLM's rules
(one url for every line, no stream: true, unique custom_ids); contracts-next.md section 2.
A line whose body its endpoint refuses is not a validation error: it runs, and its 4xx (with
OpenAI's error body) goes to the error file.
"""
from __future__ import annotations

import json
import secrets
from dataclasses import dataclass

from inference.engine.outputs import EngineOverloaded, RequestRejected
from inference.engine.request import BATCH_PRIORITY
from inference.serving.embeddings import vectors_json
from inference.serving.errors import ApiError
from inference.serving.json_body import check_depth
from inference.serving.prepare import cpu_work
from inference.http.surfaces import SURFACES
from inference.http.views import engine_refusal, hold_model
from inference.operations.model_specs import CHAT, EMBEDDING
from responses_api import protocol as responses_protocol
from responses_api.service import responses_call

MAX_LINES = 50_000
# endpoint -> (parse its raw body, prepare it on its model -> a call with `param` and `blocking_run(model)`)
ENDPOINTS = {**SURFACES, "/v1/responses": (responses_protocol.parse_create, responses_call)}
REQUIRED = ("custom_id", "method", "url", "body")


@dataclass(slots=True)
class Line:
    """One valid input line: its 1-based number, custom_id and body (the endpoint's JSON body)."""

    number: int
    custom_id: str
    body: dict


class Invalid(Exception):
    """The input file's line-level errors (OpenAI's errors.data entries: code, line, message, param)."""

    def __init__(self, errors: list[dict]):
        super().__init__(f"{len(errors)} invalid lines")
        self.errors = errors


def _error(code: str, line: int | None, message: str, param: str | None = None) -> dict:
    return {"code": code, "line": line, "message": message, "param": param}


def parse_input(data: bytes, endpoint: str) -> list[Line]:
    """The lines of a batch's input file (blank lines skipped). Raises Invalid with every
    problem: a line that is not a JSON object (or nests past the request bodies' depth limit), a
    missing key, method not POST, a url other than the batch's endpoint, a repeated custom_id,
    `stream: true`, no lines or more than MAX_LINES."""
    lines, errors, seen = [], [], set()
    for number, raw in enumerate(data.splitlines(), start=1):
        if not raw.strip():
            continue
        try:
            check_depth(raw)
            obj = json.loads(raw)
        except ApiError as exc:  # nested past the request bodies' limit (json would recurse past Python's)
            errors.append(_error("invalid_json_line", number, f"This line is not accepted: {exc.message}"))
            continue
        except (ValueError, UnicodeDecodeError):
            errors.append(_error("invalid_json_line", number, "This line is not parseable as valid JSON."))
            continue
        if not isinstance(obj, dict):
            errors.append(_error("invalid_json_line", number, "This line is not a JSON object."))
            continue
        missing = [key for key in REQUIRED if key not in obj]
        if missing:
            errors.append(_error("missing_required_parameter", number,
                                 f"This line is missing the required parameter '{missing[0]}'.", missing[0]))
            continue
        custom_id, body = obj["custom_id"], obj["body"]
        if not isinstance(custom_id, str) or not custom_id or len(custom_id) > 512:
            errors.append(_error("invalid_custom_id", number, "custom_id must be a string of 1 to 512 "
                                                              "characters.", "custom_id"))
        elif custom_id in seen:
            errors.append(_error("duplicate_custom_id", number, f"The custom_id '{custom_id}' is used by an "
                                                                "earlier line; custom_ids must be unique.",
                                 "custom_id"))
        elif obj["method"] != "POST":
            errors.append(_error("invalid_method", number, "method must be 'POST'.", "method"))
        elif obj["url"] != endpoint:
            errors.append(_error("mismatched_endpoint", number, f"The url '{obj['url']}' is not this batch's "
                                                                f"endpoint '{endpoint}'.", "url"))
        elif not isinstance(body, dict):
            errors.append(_error("invalid_body", number, "body must be a JSON object.", "body"))
        elif body.get("stream") is True:
            errors.append(_error("stream_not_supported", number, "Batch lines cannot be streamed: remove "
                                                                 "'stream': true.", "body.stream"))
        else:
            lines.append(Line(number, custom_id, body))
        if isinstance(custom_id, str):
            seen.add(custom_id)
    if not errors and not lines:
        errors.append(_error("empty_file", None, "The input file has no requests."))
    if len(lines) > MAX_LINES:
        errors.append(_error("too_many_requests", None, f"A batch holds at most {MAX_LINES} requests."))
    if errors:
        raise Invalid(errors)
    return lines


def output_line(custom_id: str, status_code: int | None = None, request_id: str | None = None,
                body: dict | None = None, *, error: dict | None = None) -> str:
    """One line of the output or error file (BatchRequestOutput), as JSON: the response the line's
    request got, or (for a request never run, e.g. batch_expired) `error` {code, message} and a
    null response."""
    response = None if error is not None else {"status_code": status_code, "request_id": request_id, "body": body}
    # Written as the endpoint writes its answer (an embedding's float32 numbers: serving/embeddings.vectors_json).
    return vectors_json({"id": f"batch_req_{secrets.token_hex(16)}", "custom_id": custom_id, "response": response,
                         "error": error}).decode()


async def run_line(endpoint: str, line: Line, registry, *, tenant, cache_salt: str):
    """Run one line as its endpoint would (the same parse, the model its `model` names from `registry`
    (operations/registry.ModelRegistry; loaded on demand, held while the line runs), the same preparation,
    engine and wire body as the view, at BATCH_PRIORITY). Returns (status_code, request_id, body, usage or None); the
    endpoint's 4xx/5xx ApiError becomes (status, ..., OpenAI's error body, None). Raises
    EngineOverloaded when the engine's waiting queue is full (the caller retries the line) and
    CancelledError when cancelled."""
    parse, prepare_call = ENDPOINTS[endpoint]
    request_id = f"req_{secrets.token_hex(16)}"
    try:
        raw = json.dumps(line.body).encode()
        req = await cpu_work(parse, raw)
        kind = EMBEDDING if endpoint == "/v1/embeddings" else CHAT
        hold = await hold_model(registry, req.get("model") or "", kind, req.get("keep_alive"), cache_salt)
        try:
            call = await prepare_call(req, hold.model, tenant=tenant, request_id=request_id, cache_salt=cache_salt,
                                      priority=BATCH_PRIORITY)
            try:
                run_body, usage = await call.blocking_run(hold.model)
            except RequestRejected as exc:
                raise engine_refusal(exc, call.param) from exc
        finally:
            hold.release()
    except EngineOverloaded:
        raise
    except ApiError as exc:
        return exc.status, request_id, exc.body(), None
    return 200, request_id, run_body, usage
