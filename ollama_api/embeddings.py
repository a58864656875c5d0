"""/api/embed and /api/embeddings onto /v1/embeddings' preparation (serving/embeddings.py), and their bodies.

Source: Ollama's docs/api.md ("Generate Embeddings", "Generate Embedding") and api/types.go (EmbedRequest,
EmbedResponse, EmbeddingRequest, EmbeddingResponse); contracts-wave4 §1.6:
- /api/embed: `input` a string or strings; `truncate` (default true) cuts an over-long input to the model's
  limit, false makes it a 400; `dimensions` as /v1/embeddings answers it (a 400: these models were not trained
  to be shortened); each vector L2-normalized; {model, embeddings, total_duration, load_duration,
  prompt_eval_count};
- /api/embeddings: one `prompt`, {embedding} as the model computes it (not normalized again).
An empty input or prompt loads the model and answers no vectors (the views).
"""
from __future__ import annotations

import json
import math

from inference.serving.embeddings import vector_floats


def openai_request(model: str, texts: list[str], truncate: bool, dimensions: int | None = None) -> dict:
    """The validated /v1/embeddings fields (serving/embeddings.parse's shape) of an Ollama request's texts."""
    return {"model": model, "input": ("text", texts), "encoding_format": "float", "dimensions": dimensions,
            "truncate_prompt_tokens": -1 if truncate else None}


def normalized(values: list[float]) -> list[float]:
    """`values` scaled to length 1 (L2), as they are when their length is 0."""
    norm = math.sqrt(math.fsum(v * v for v in values))
    return [v / norm for v in values] if norm > 0 else values


def embed_json(model: str, vectors: list[bytes], metrics: dict) -> bytes:
    """/api/embed's body: {model, embeddings (each L2-normalized), **metrics} as JSON bytes (CPU work)."""
    body = {"model": model, "embeddings": [normalized(vector_floats(v)) for v in vectors], **metrics}
    return json.dumps(body, separators=(",", ":")).encode()


def embeddings_json(vector: bytes | None) -> bytes:
    """/api/embeddings' body: {embedding} ([] for no prompt) as JSON bytes."""
    embedding = vector_floats(vector) if vector is not None else []
    return json.dumps({"embedding": embedding}, separators=(",", ":")).encode()

