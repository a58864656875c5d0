"""Predicted Outputs on chat completions: the `prediction` field checked and flattened to its text.

Source: OpenAI API reference, `prediction` (ChatCompletionPredictionContentParam: `{type:
"content", content: string | [{type: "text", text}]}`) and the Predicted Outputs guide's
restrictions: not with tools or functions, n > 1, logprobs, or presence / frequency
penalties above 0. max_completion_tokens is allowed here (OpenAI refuses it). The engine
drafts from the prediction's tokens (engine/speculative.py); the output never changes.
"""
from __future__ import annotations

from .errors import bad_request

# (field, the test that the request sets it in a way a prediction excludes)
EXCLUDED = (
    ("tools", lambda v: bool(v)),
    ("functions", lambda v: bool(v)),
    ("n", lambda v: v is not None and v > 1),
    ("logprobs", lambda v: bool(v)),
    ("top_logprobs", lambda v: v is not None),
    ("presence_penalty", lambda v: v is not None and v > 0),
    ("frequency_penalty", lambda v: v is not None and v > 0),
)


def prediction_text(value, request: dict) -> str | None:
    """The prediction's text (None when `value` is None), after checking it and the request.

    value: the raw `prediction` JSON value. request: the validated chat fields. Raises ApiError 400 naming
    `prediction`, `prediction.type`, `prediction.content` (or `prediction.content[i]...`), or the field a
    prediction excludes.
    """
    if value is None:
        return None
    if not isinstance(value, dict):
        raise bad_request("'prediction' must be an object: {\"type\": \"content\", \"content\": ...}.", "prediction")
    if value.get("type") != "content":
        raise bad_request(f"Invalid value for 'prediction.type': {value.get('type')!r}; the only supported "
                          "value is 'content'.", "prediction.type")
    content = value.get("content")
    if isinstance(content, str):
        text = content
    elif isinstance(content, list) and content:
        parts = []
        for i, part in enumerate(content):
            if not isinstance(part, dict) or part.get("type") != "text":
                raise bad_request("each part of 'prediction.content' must be {\"type\": \"text\", \"text\": ...}.",
                                  f"prediction.content[{i}].type")
            if not isinstance(part.get("text"), str):
                raise bad_request("a text part's 'text' must be a string.", f"prediction.content[{i}].text")
            parts.append(part["text"])
        text = "".join(parts)
    else:
        raise bad_request("'prediction.content' must be a string or a non-empty array of text parts.",
                          "prediction.content")
    for name, excludes in EXCLUDED:
        if excludes(request.get(name)):
            raise bad_request(f"'{name}' cannot be used with 'prediction' (Predicted Outputs).", name,
                              code="unsupported_parameter")
    return text
