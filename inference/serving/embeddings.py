"""POST /v1/embeddings: OpenAI's request and response shapes (no torch; the engine's EmbeddingRunner embeds).

Source: OpenAI API reference, "Embeddings": `input` is a string, an array of strings, an array of
token ids or an array of such arrays; at most 2,048 inputs and 300,000 tokens summed over a request;
no input empty; `encoding_format` "float" (default) or "base64" (each vector's float32 bytes,
little-endian, base64: what the openai SDK decodes with numpy's frombuffer); `dimensions` only for
models trained for it (the text-embedding-3 family, Matryoshka); `user` ignored. vLLM's
`truncate_prompt_tokens` cuts an input to that many tokens (-1: the model's limit) instead of the
over-length 400. Response: `{object: "list", data: [{object: "embedding", index, embedding}], model,
usage: {prompt_tokens, total_tokens}}`.
"""
from __future__ import annotations

import base64
from dataclasses import dataclass

import numpy as np
import orjson
from rest_framework import serializers

from .errors import bad_request
from .fields import KeepAliveField, NumberField, StrictField, StringField, check_number
from .protocol import opt, parse_json_body, validate

MAX_INPUTS = 2048
MAX_REQUEST_TOKENS = 300_000
MAX_INPUT_CHARS = 1 << 20  # a text longer than this cannot be a few hundred tokens (checked before tokenizing)


class EmbeddingInputField(StrictField):
    """`input`: a string, strings, token ids or arrays of token ids -> ("text", [str]) or ("tokens", [[int]])."""

    def to_internal_value(self, data):
        if isinstance(data, str):
            return "text", [data]
        if not isinstance(data, list) or not data:
            raise serializers.ValidationError("must be a string, an array of strings, an array of token ids or an "
                                              "array of arrays of token ids, and not empty.")
        if len(data) > MAX_INPUTS:
            raise serializers.ValidationError(f"accepts at most {MAX_INPUTS} inputs; got {len(data)}.")
        if all(isinstance(x, str) for x in data):
            return "text", data
        if all(isinstance(x, int) and not isinstance(x, bool) for x in data):
            return "tokens", [[check_number(t, integer=True, low=0) for t in data]]
        if all(isinstance(x, list) for x in data):
            out = []
            for i, item in enumerate(data):
                if not all(isinstance(t, int) and not isinstance(t, bool) for t in item):
                    raise serializers.ValidationError(f"input[{i}] must be an array of token ids.")
                out.append([check_number(t, integer=True, low=0) for t in item])
            return "tokens", out
        raise serializers.ValidationError("must not mix strings, token ids and arrays of token ids.")


class EncodingFormatField(StringField):
    def to_internal_value(self, data):
        value = super().to_internal_value(data)
        if value not in ("float", "base64"):
            raise serializers.ValidationError("must be 'float' or 'base64'.")
        return value


class EmbeddingRequest(serializers.Serializer):
    """POST /v1/embeddings (OpenAI's fields, vLLM's truncate_prompt_tokens)."""

    model = StringField(required=False, default="")
    keep_alive = KeepAliveField(required=False, allow_null=True, default=None)
    input = EmbeddingInputField()
    encoding_format = EncodingFormatField(**opt())
    dimensions = NumberField(**opt(integer=True, low=1))
    user = StringField(**opt())
    truncate_prompt_tokens = NumberField(**opt(integer=True, low=-1))


@dataclass(slots=True)
class EmbeddingCall:
    """A validated request: the model name, each input's token ids, the encoding and the token count."""

    model: str
    inputs: list[list[int]]
    encoding_format: str
    prompt_tokens: int


def parse(raw_body: bytes) -> dict:
    """The request's validated fields. Raises ApiError 400 (invalid JSON or a bad field, named)."""
    req = validate(EmbeddingRequest, parse_json_body(raw_body))
    if req.get("truncate_prompt_tokens") == 0:
        raise bad_request("'truncate_prompt_tokens' must be -1 (the model's limit) or a positive number of tokens.",
                          "truncate_prompt_tokens")
    return req


# How an over-long input's 400 says to cut it (a surface with its own truncation field words its own: the request's
# "truncate_advice", e.g. Ollama's `truncate`).
TRUNCATE_ADVICE = "set 'truncate_prompt_tokens' to cut it"


def prepare(req: dict, model) -> EmbeddingCall:
    """Tokenize and check a parsed request against the embedding model (CPU work: the prepare pool).

    model: the served embedding model (runtime.EmbeddingService: name, dimensions, max_input_tokens,
    vocab_size, tokenize, truncate). Raises ApiError 400: `dimensions` (the model has no Matryoshka
    training), an empty input or one over max_input_tokens (naming input[i]; truncate_prompt_tokens
    cuts instead, and the message says so: req's "truncate_advice", else TRUNCATE_ADVICE), a token id
    outside the vocabulary, more than 300,000 tokens in all."""
    if req.get("dimensions") is not None:
        raise bad_request(f"The model '{model.name}' does not support 'dimensions': its {model.dimensions}-dimension "
                          "embeddings were not trained to be shortened (Matryoshka representation learning), so "
                          "only the full vector is served. Leave 'dimensions' out.", "dimensions")
    kind, items = req["input"]
    limit = model.max_input_tokens
    cut = req.get("truncate_prompt_tokens")
    cut = None if cut is None else (limit if cut == -1 else min(cut, limit))
    advice = req.get("truncate_advice") or TRUNCATE_ADVICE
    if kind == "text":
        for i, text in enumerate(items):
            if not text:
                raise bad_request(f"input[{i}] is empty; every input must hold at least one character.",
                                  f"input[{i}]")
            if len(text) > MAX_INPUT_CHARS and cut is None:
                raise bad_request(f"input[{i}] is {len(text)} characters, far over the model's {limit}-token limit; "
                                  f"shorten it or {advice}.", f"input[{i}]")
        texts = [t[:MAX_INPUT_CHARS] for t in items] if cut is not None else items
        inputs = model.tokenize(texts)
    else:
        inputs = items
        for i, ids in enumerate(inputs):
            if not ids:
                raise bad_request(f"input[{i}] is empty; every input must hold at least one token.", f"input[{i}]")
            bad = next((t for t in ids if t >= model.vocab_size), None)
            if bad is not None:
                raise bad_request(f"input[{i}] holds token id {bad}, outside the model's vocabulary "
                                  f"(0 to {model.vocab_size - 1}).", f"input[{i}]")
    total = 0
    for i, ids in enumerate(inputs):
        if cut is not None:
            inputs[i] = ids = model.truncate(ids, cut, from_text=kind == "text")
        elif len(ids) > limit:
            raise bad_request(f"input[{i}] is {len(ids)} tokens, over the model's limit of {limit} tokens; shorten "
                              f"it or {advice}.", f"input[{i}]", code="context_length_exceeded")
        total += len(ids)
    if total > MAX_REQUEST_TOKENS:
        raise bad_request(f"The request holds {total} tokens; at most {MAX_REQUEST_TOKENS} tokens may be embedded in "
                          "one request.", "input", code="max_tokens_per_request")
    return EmbeddingCall(req["model"], inputs, req.get("encoding_format") or "float", total)


def response_body(call: EmbeddingCall, model_name: str, vectors: list[bytes]) -> dict:
    """OpenAI's embedding list from each input's vector (float32 little-endian bytes): base64 strings, or
    float32 arrays (float32_array) that vectors_json writes as numbers. The endpoint's answer and a batch
    line's body (batches/lines.output_line) are this, written by vectors_json."""
    data = []
    for i, raw in enumerate(vectors):
        embedding = (base64.b64encode(raw).decode("ascii") if call.encoding_format == "base64"
                     else float32_array(raw))
        data.append({"object": "embedding", "index": i, "embedding": embedding})
    return {"object": "list", "data": data, "model": model_name,
            "usage": {"prompt_tokens": call.prompt_tokens, "total_tokens": call.prompt_tokens}}


def response_json(call: EmbeddingCall, model_name: str, vectors: list[bytes]) -> bytes:
    """response_body as JSON bytes (CPU work: 2,048 vectors of floats are not encoded on the event loop).

    A float vector's elements are written as the shortest decimal that reads back as the same float32
    (orjson's numpy float32 form: "0.0063856714", as OpenAI's own answers print them; a JSON reader's
    double cast to float32 is the vector's value bit for bit), about half the characters of each
    float32's exact double, encoded some 25 times faster than json.dumps of Python floats (a 384-float
    vector 17 us against 450 on the 2-vCPU EPYC). A NaN or infinite element (no JSON number holds one:
    only a broken model makes it) is written null, as orjson writes one."""
    return vectors_json(response_body(call, model_name, vectors))


def float32_array(raw: bytes) -> np.ndarray:
    """A vector's float32 little-endian bytes (EmbeddingRunner's output) as a read-only float32 array [D]."""
    return np.frombuffer(raw, dtype="<f4")


def vectors_json(body: dict) -> bytes:
    """`body` as compact UTF-8 JSON bytes, its float32 arrays (float32_array) written as each element's
    shortest float32 decimal (response_json's rule; Ollama's Go server writes its float32 vectors the same
    way), a non-string key as its string (as json.dumps writes one), a NaN or infinity as null."""
    return orjson.dumps(body, option=orjson.OPT_SERIALIZE_NUMPY | orjson.OPT_NON_STR_KEYS)
