"""ApiError and OpenAI's error body: {"error": {"message", "type", "param", "code"}}.

Source: OpenAI API reference, "Error codes"; the official SDK maps the HTTP status
to its exception classes (400 BadRequestError, 401 AuthenticationError, 404
NotFoundError, 429 RateLimitError, ...).
"""
from __future__ import annotations


class ApiError(Exception):
    """A client-visible error with an HTTP status and OpenAI's error fields.

    headers: extra response headers (e.g. Retry-After for 429).
    """

    def __init__(
        self,
        status: int,
        message: str,
        *,
        type: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ):
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.param = param
        self.code = code
        self.headers = headers or {}

    def body(self) -> dict:
        """The JSON body OpenAI sends for this error."""
        return error_body(self.message, type=self.type, param=self.param, code=self.code)


def error_body(message: str, *, type: str = "invalid_request_error", param: str | None = None,
               code: str | None = None) -> dict:
    """OpenAI's error object; all four keys are always present (the schema requires them)."""
    return {"error": {"message": message, "type": type, "param": param, "code": code}}


def bad_request(message: str, param: str | None = None, code: str | None = None) -> ApiError:
    """A 400 invalid_request_error naming the offending field in `param`."""
    return ApiError(400, message, param=param, code=code)


def not_found(message: str, code: str | None = None, param: str | None = None) -> ApiError:
    """A 404 invalid_request_error (OpenAI answers unknown models and ids this way)."""
    return ApiError(404, message, param=param, code=code)


def engine_error(error) -> ApiError:
    """A blocking request's answer when its generation ended with `error` (a deltas.Error): a 500
    carrying its message and code; a cancelled one (code `cancelled`) also says `x-should-retry:
    false`, so the SDKs do not send again what an operator ended."""
    headers = {"x-should-retry": "false"} if error.code == "cancelled" else None
    return ApiError(500, error.message, type="server_error", code=error.code, headers=headers)


# Anthropic's error types by HTTP status (docs.claude.com/en/api/errors); any other 4xx is
# invalid_request_error there, any other 5xx api_error.
ANTHROPIC_ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 402: "billing_error",
                         403: "permission_error", 404: "not_found_error", 413: "request_too_large",
                         429: "rate_limit_error", 500: "api_error", 504: "timeout_error", 529: "overloaded_error"}


class ErrorShape:
    """How a route words its errors: OpenAI's body (OPENAI), Anthropic's (ANTHROPIC) or Ollama's (OLLAMA).

    A route's shape is a property of its view (`api.openai_endpoint(error_shape=...)`); every layer
    that answers for a route (the endpoint wrapper, the middleware, the ASGI guard, daphne's body
    limit, the drain gate) asks `inference.http.error_shapes.shape_for_path` and words its error here."""

    name = "openai"

    def status(self, status: int) -> int:
        """The HTTP status this shape sends for `status`."""
        return status

    def body(self, status: int, message: str, *, type: str | None = None, param: str | None = None,
             code: str | None = None, request_id: str | None = None) -> dict:
        """The JSON error body for an error of `status` (type None: from the status)."""
        kind = type or ("server_error" if status >= 500 else "invalid_request_error")
        return error_body(message, type=kind, param=param, code=code)

    def of(self, error: ApiError, request_id: str | None = None) -> tuple[int, dict]:
        """(status, body) of an ApiError in this shape."""
        return self.status(error.status), self.body(error.status, error.message, type=error.type,
                                                    param=error.param, code=error.code, request_id=request_id)


class AnthropicErrorShape(ErrorShape):
    """Anthropic's `{"type": "error", "error": {"type", "message"}, "request_id"}`, its type read
    from the status (ANTHROPIC_ERROR_TYPES). A 503 (the waiting queue is full, the model loads, the
    server drains) is Anthropic's 529 overloaded_error, which its SDK retries."""

    name = "anthropic"

    def status(self, status: int) -> int:
        return 529 if status == 503 else status

    def body(self, status: int, message: str, *, type: str | None = None, param: str | None = None,
             code: str | None = None, request_id: str | None = None) -> dict:
        status = self.status(status)
        kind = ANTHROPIC_ERROR_TYPES.get(status) or ("api_error" if status >= 500 else "invalid_request_error")
        body = {"type": "error", "error": {"type": kind, "message": message}}
        if request_id:
            body["request_id"] = request_id
        return body


class OllamaErrorShape(ErrorShape):
    """Ollama's `{"error": "<message>"}` and nothing else (its server/routes.go; docs/api.md "Errors"), at the
    status the error has: Ollama's own 400 / 404 / 500 / 503 and this server's others (401, 413, 429, 501)."""

    name = "ollama"

    def body(self, status: int, message: str, *, type: str | None = None, param: str | None = None,
             code: str | None = None, request_id: str | None = None) -> dict:
        return {"error": message}


OPENAI = ErrorShape()
ANTHROPIC = AnthropicErrorShape()
OLLAMA = OllamaErrorShape()
