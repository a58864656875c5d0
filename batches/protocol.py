"""Validation of the Files and Batch API requests (DRF serializers) -> ApiError 400 naming the field.

Source: OpenAI API reference, "Upload file", "List files", "Create batch", "List batches";
contracts-next.md section 2 (endpoint literals, metadata limits, expires_after ranges).
"""
from __future__ import annotations

from rest_framework import serializers

from inference.serving.errors import bad_request
from inference.serving.fields import MetadataField, ObjectField, StringField
from inference.serving.protocol import parse_json_body, validate

# The endpoints a batch may name (OpenAI's), and those this server runs.
OPENAI_ENDPOINTS = ("/v1/responses", "/v1/chat/completions", "/v1/embeddings", "/v1/completions",
                    "/v1/moderations", "/v1/images/generations", "/v1/images/edits", "/v1/videos")
SERVED_ENDPOINTS = ("/v1/chat/completions", "/v1/completions", "/v1/responses", "/v1/embeddings")
OPENAI_PURPOSES = ("assistants", "batch", "fine-tune", "vision", "user_data", "evals")
# expires_after.seconds of a file or of a batch's output (OpenAI: one hour to 30 days).
MIN_EXPIRY_S, MAX_EXPIRY_S = 3600, 2_592_000


def expires_after_s(anchor, seconds, param: str) -> int | None:
    """An `expires_after` {anchor: created_at, seconds} as seconds, None when both are absent.
    Raises ApiError 400 naming `param`."""
    if anchor is None and seconds is None:
        return None
    if anchor != "created_at":
        raise bad_request(f"'{param}[anchor]' must be 'created_at'.", f"{param}.anchor")
    try:
        value = int(seconds)
    except (TypeError, ValueError):
        raise bad_request(f"'{param}[seconds]' must be an integer.", f"{param}.seconds") from None
    if isinstance(seconds, bool) or not MIN_EXPIRY_S <= value <= MAX_EXPIRY_S:
        raise bad_request(f"'{param}[seconds]' must be between {MIN_EXPIRY_S} and {MAX_EXPIRY_S}.",
                          f"{param}.seconds")
    return value


def check_purpose(purpose: str | None) -> str:
    """The upload's purpose: `batch` is served; a missing or other one is a 400 naming purpose."""
    if not purpose:
        raise bad_request("'purpose' is required: upload batch input files with purpose 'batch'.", "purpose")
    if purpose != "batch":
        known = "is an OpenAI purpose this server does not serve" if purpose in OPENAI_PURPOSES else "is not a purpose"
        raise bad_request(f"'{purpose}' {known}; this server stores files with purpose 'batch'.", "purpose",
                          code="invalid_purpose")
    return purpose


class FileListQuery(serializers.Serializer):
    """GET /v1/files: purpose, after, limit (1-10000, default 10000), order (default desc)."""

    purpose = serializers.CharField(required=False, default=None, max_length=64)
    after = serializers.CharField(required=False, default=None, max_length=64)
    limit = serializers.IntegerField(required=False, default=10000, min_value=1, max_value=10000)
    order = serializers.ChoiceField(choices=("asc", "desc"), required=False, default="desc")


class BatchListQuery(serializers.Serializer):
    """GET /v1/batches: after, limit (1-100, default 20)."""

    after = serializers.CharField(required=False, default=None, max_length=64)
    limit = serializers.IntegerField(required=False, default=20, min_value=1, max_value=100)


class CreateBatch(serializers.Serializer):
    """POST /v1/batches."""

    input_file_id = StringField(max_length=64)
    endpoint = StringField(max_length=64)
    completion_window = StringField(max_length=16)
    metadata = MetadataField(required=False, allow_null=True, default=None)
    output_expires_after = ObjectField(required=False, allow_null=True, default=None)


def parse_create_batch(raw_body: bytes) -> dict:
    """The validated Create batch body; output_expires_after as seconds (or None). Raises
    ApiError 400: an endpoint this server does not run, a completion_window other than 24h."""
    req = validate(CreateBatch, parse_json_body(raw_body))
    if req["endpoint"] not in SERVED_ENDPOINTS:
        what = "an OpenAI endpoint this server does not batch" if req["endpoint"] in OPENAI_ENDPOINTS \
            else "not a batch endpoint"
        raise bad_request(f"'{req['endpoint']}' is {what}; use one of {', '.join(SERVED_ENDPOINTS)}.", "endpoint",
                          code="invalid_endpoint")
    if req["completion_window"] != "24h":
        raise bad_request("'completion_window' must be '24h'.", "completion_window")
    expiry = req["output_expires_after"] or {}
    req["output_expires_after"] = expires_after_s(expiry.get("anchor"), expiry.get("seconds"),
                                                  "output_expires_after") if expiry else None
    return req
