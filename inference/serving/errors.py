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
