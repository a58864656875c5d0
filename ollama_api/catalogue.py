"""What Ollama's model routes say about a served model: /api/tags' entries, /api/show's body, /api/ps' entries.

Source: Ollama's docs/api.md ("List Local Models", "Show Model Information", "List Running Models") and
api/types.go (ListModelResponse, ShowResponse, ProcessModelResponse, ModelDetails); the `ollama` client reads
`model`, `modified_at`, `digest`, `size`, `details` and requires `model_info` on show. Facts come from the
model's folder (no torch, nothing loaded): family and the numbers from config.json, the parameter count from
the decoder's shapes (an encoder's: its safetensors header), the quantization from the GGUF blocks the folder
keeps (else its dtype), size from its files, digest the SHA-256 of its files (serving/fingerprint.folder_digest,
computed once per process), modified_at the newest file's time. Capabilities: completion (chat models), tools
(a tool parser reads its calls: serving/text_setup.tools_parser), thinking (it has a reasoning parser), insert
(its vocabulary has fill-in-the-middle tokens), embedding (embedding models).
"""
from __future__ import annotations

import json
import math
import struct
from collections import Counter
from dataclasses import dataclass
from datetime import datetime, timedelta
from functools import lru_cache
from pathlib import Path

from inference.engine.config import ConfigError
from inference.engine.model_folder import ModelFolder
from inference.operations.model_settings import GO_MAX_DURATION_S
from inference.operations.model_specs import CHAT, EMBEDDING
from inference.serving.fingerprint import folder_digest
from inference.serving.prompts import fim_tokens
from inference.serving.text_setup import model_reasoning_parser, tools_parser

LATEST = ":latest"
# Ollama's "forever" (a negative keep_alive, or one past Go's longest Duration) shows as an expiry this far away.
FOREVER = timedelta(seconds=GO_MAX_DURATION_S)


def tag_name(name: str) -> str:
    """A served name as Ollama lists it: with its tag (`:latest` unless it has one)."""
    return name if ":" in name.rpartition("/")[2] else name + LATEST


def local_time(seconds: float) -> str:
    """A Unix time as RFC 3339 in local time with its offset (how Ollama writes modified_at, expires_at)."""
    return datetime.fromtimestamp(seconds).astimezone().isoformat()


def human_count(n: int) -> str:
    """A parameter count as Ollama writes parameter_size (its format.HumanNumber): billions with one decimal
    ("7.6B"), millions with two ("134.52M"), none when whole ("8B"), thousands with none ("12K")."""
    for unit, size, decimals in (("B", 1e9, 1), ("M", 1e6, 2)):
        if n >= size:
            value = n / size
            return f"{value:.0f}{unit}" if value == int(value) else f"{value:.{decimals}f}{unit}"
    return f"{n / 1e3:.0f}K" if n >= 1e3 else str(n)


@dataclass(frozen=True, slots=True)
class Facts:
    """A model folder's facts (module doc). Sizes in bytes; modified: Unix seconds; digest: 64 hex digits ("" for
    a folder not there yet)."""

    architecture: str
    family: str
    parameter_count: int
    quantization: str
    format: str
    context_length: int | None
    embedding_length: int | None
    block_count: int | None
    size: int
    digest: str
    modified: float


def _files(folder: Path) -> list[Path]:
    return sorted(p for p in folder.iterdir() if p.is_file()) if folder.is_dir() else []


def _safetensors_count(folder: Path) -> int:
    """Elements of the float tensors in the folder's safetensors headers (an encoder's parameters)."""
    total = 0
    for path in folder.glob("*.safetensors"):
        with path.open("rb") as f:
            (size,) = struct.unpack("<Q", f.read(8))
            header = json.loads(f.read(size))
        for name, tensor in header.items():
            if name != "__metadata__" and tensor["dtype"].startswith(("F", "BF")):
                total += math.prod(tensor["shape"])
    return total


def _decoder_count(config) -> int:
    """A decoder's parameters from its shapes (Llama-family and Gemma 3 layers: attention, gated MLP, norms)."""
    h, q, kv = config.hidden_size, config.num_attention_heads * config.head_dim, \
        config.num_key_value_heads * config.head_dim
    layer = h * (q + 2 * kv) + q * h + 3 * h * config.intermediate_size + 2 * h
    if config.qk_norm:
        layer += 2 * config.head_dim
    embeddings = config.vocab_size * h * (1 if config.tie_word_embeddings else 2)
    return embeddings + config.num_hidden_layers * layer + h


def _quantization(config: dict) -> tuple[str, str]:
    """(quantization_level, format): the GGUF's own name for its mix ("Q4_K_M", kept at import), else the GGUF
    block type most weights keep ("Q4_1"), else the dtype ("F32")."""
    quant = config.get("quantization_config") or {}
    kinds = Counter((quant.get("weights") or {}).values())
    if quant.get("file_type") and kinds:
        return str(quant["file_type"]), "gguf"
    if kinds:
        return kinds.most_common(1)[0][0].upper(), "gguf"
    dtype = str(config.get("torch_dtype") or "float32")
    return {"float32": "F32", "float16": "F16", "bfloat16": "BF16"}.get(dtype, dtype.upper()), "safetensors"


@lru_cache(maxsize=32)
def _facts(folder: str, kind: str, stamp: tuple) -> Facts:
    path = Path(folder)
    files = _files(path)
    config = ModelFolder.read(path).config or {}
    quantization, fmt = _quantization(config)
    family = str(config.get("model_type") or "")
    count = 0
    block_count = config.get("num_hidden_layers")
    if kind == CHAT:
        try:
            count = _decoder_count(ModelFolder.read(path).model_config)
        except ConfigError:
            count = 0
    elif files:
        count = _safetensors_count(path)
    context = config.get("max_position_embeddings")
    return Facts(family or "unknown", family, count, quantization, fmt, context if isinstance(context, int) else None,
                 config.get("hidden_size") if isinstance(config.get("hidden_size"), int) else None,
                 block_count if isinstance(block_count, int) else None, sum(p.stat().st_size for p in files),
                 folder_digest(path) if files else "", max((p.stat().st_mtime for p in files), default=0.0))


def facts(folder: Path, kind: str) -> Facts:
    """The facts of the model folder `folder` of `kind` (CHAT or EMBEDDING), remembered while its files are
    unchanged (CPU work the first time: the digest reads every file; run it on the prepare pool)."""
    stamp = tuple((p.name, p.stat().st_size, p.stat().st_mtime_ns) for p in _files(folder))
    return _facts(str(folder), kind, stamp)


def details(f: Facts) -> dict:
    """Ollama's ModelDetails."""
    return {"parent_model": "", "format": f.format, "family": f.family, "families": [f.family] if f.family else None,
            "parameter_size": human_count(f.parameter_count) if f.parameter_count else "",
            "quantization_level": f.quantization}


def tag_entry(name: str, f: Facts) -> dict:
    """One /api/tags model."""
    return {"name": tag_name(name), "model": tag_name(name), "modified_at": local_time(f.modified), "size": f.size,
            "digest": f.digest, "details": details(f)}


def capabilities(kind: str, model_type: str, tokenizer) -> list[str]:
    """The capabilities (module doc) of a model of `kind`; `tokenizer` (engine Tokenizer, chat models): its
    chat template and vocabulary."""
    if kind == EMBEDDING:
        return ["embedding"]
    template = tokenizer.chat_template
    found = ["completion"]
    if tools_parser(model_type, template) is not None:
        found.append("tools")
    if fim_tokens(tokenizer) is not None:
        found.append("insert")
    if model_reasoning_parser(model_type, template) is not None:
        found.append("thinking")
    return found


def model_info(f: Facts, vocab_size: int | None) -> dict:
    """Ollama's model_info map (GGUF metadata keys) from the facts."""
    arch = f.family or "unknown"
    info: dict = {"general.architecture": arch, "general.parameter_count": f.parameter_count,
                  "general.file_type": f.quantization}
    for key, value in (("context_length", f.context_length), ("embedding_length", f.embedding_length),
                       ("block_count", f.block_count), ("vocab_size", vocab_size)):
        if value is not None:
            info[f"{arch}.{key}"] = value
    return info


def parameters_text(sampling_defaults: dict) -> str:
    """Ollama's `parameters`: one line per default, the key padded to 30 characters, Ollama's names."""
    names = {"temperature": "temperature", "top_p": "top_p", "top_k": "top_k", "min_p": "min_p",
             "repetition_penalty": "repeat_penalty", "max_tokens": "num_predict"}
    return "\n".join(f"{names[k]:<30}{v}" for k, v in sampling_defaults.items() if k in names)


def expires_at(seconds: float, now: float) -> str:
    """/api/ps' expires_at of a model the reaper may unload `seconds` from `now` (Unix seconds; inf: never)."""
    if math.isinf(seconds):
        return (datetime.fromtimestamp(now).astimezone() + FOREVER).isoformat()
    return local_time(now + seconds)
