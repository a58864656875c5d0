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

import numpy as np

from inference.serving.embeddings import float32_array, vectors_json


def openai_request(model: str, texts: list[str], truncate: bool, dimensions: int | None = None) -> dict:
    """The validated /v1/embeddings fields (serving/embeddings.parse's shape) of an Ollama request's texts; an
    over-long input's 400 names Ollama's `truncate`."""
    return {"model": model, "input": ("text", texts), "encoding_format": "float", "dimensions": dimensions,
            "truncate_prompt_tokens": -1 if truncate else None, "truncate_advice": "set 'truncate' to true to cut it"}


def normalized(vector: np.ndarray) -> np.ndarray:
    """A float32 vector [D] scaled to length 1 (L2, summed in float64), as it is when its length is 0."""
    wide = vector.astype(np.float64)
    norm = float(np.sqrt(np.dot(wide, wide)))
    return (wide / norm).astype(np.float32) if norm > 0 else vector


def embed_json(model: str, vectors: list[bytes], metrics: dict, normalizes: bool) -> bytes:
    """/api/embed's body: {model, embeddings (each L2-normalized), **metrics} as JSON bytes (CPU work).
    `normalizes`: the model's own pooling normalized them already, so they are written as computed, the same bits
    as /v1/embeddings and /api/embeddings give (normalizing again moves elements by a float32 rounding)."""
    arrays = [float32_array(v) for v in vectors]
    return vectors_json({"model": model, "embeddings": arrays if normalizes else [normalized(a) for a in arrays],
                         **metrics})


def embeddings_json(vector: bytes | None) -> bytes:
    """/api/embeddings' body: {embedding} ([] for no prompt) as JSON bytes."""
    return vectors_json({"embedding": float32_array(vector) if vector is not None else []})
