"""Import a Llama-family or Gemma 3 GGUF file into an HF-format model folder (config, safetensors, tokenizer).

The folder holds config.json, model.safetensors (HF tensor names), tokenizer.json,
tokenizer_config.json and generation_config.json. By default (dtype "blocks") the
Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K and Q6_K tensors stay in their GGUF blocks, as shipped
(layers/blocks.py: `<name>.qweight` / `.scales` / `.mins`, listed under config.json's
`quantization_config`), and every other tensor is dequantized to float32; with dtype
"float32" or "bfloat16" everything is dequantized, a folder transformers reads too.
A tensor type outside SUPPORTED_TENSOR_TYPES is refused by name before anything is written.
The rules mirror
transformers' own GGUF loader (`modeling_gguf_pytorch_utils.py`) and llama.cpp's
`convert_hf_to_gguf.py`, which this reverses. What is Gemma 3's own (architecture "gemma3":
its config, tensor names, the norms llama.cpp stores plus one) lives in the gemma3_* functions.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import uuid
from pathlib import Path

import numpy as np
import torch
from gguf import GGMLQuantizationType as QType
from gguf import GGUFReader, LlamaFileType
from gguf.quants import dequantize
from safetensors.torch import save_file
from tqdm import tqdm

from ..layers.blocks import BlockWeight, quantization_config
from .gguf_tokenizer import build_spm_tokenizer, build_tokenizer

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
IMPORT_DTYPES = ("blocks", *DTYPES)  # "blocks": the GGUF's BLOCK_TYPES tensors as shipped, float32 otherwise
# The GGUF tensor types kept as blocks by a "blocks" import (the kernels compute on them), and their
# layers/blocks.py names.
BLOCK_TYPES = {QType.Q4_0: "q4_0", QType.Q4_1: "q4_1", QType.Q5_0: "q5_0", QType.Q5_1: "q5_1", QType.Q8_0: "q8_0",
               QType.Q4_K: "q4_k", QType.Q5_K: "q5_k", QType.Q6_K: "q6_k"}

# The tensor types the engine runs: BLOCK_TYPES as shipped, the others dequantized at import (gguf.quants
# dequantizes them at a usable speed) and quantised again at load as EngineConfig.weights asks.
SUPPORTED_TENSOR_TYPES = frozenset(
    {
        QType.F32,
        QType.F16,
        QType.BF16,
        QType.Q4_0,
        QType.Q4_1,
        QType.Q5_0,
        QType.Q5_1,
        QType.Q8_0,
        QType.Q2_K,
        QType.Q3_K,
        QType.Q4_K,
        QType.Q5_K,
        QType.Q6_K,
    }
)

_GLOBAL_TENSORS = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
_LAYER_TENSORS = {
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
}
_LAYER_NAME = re.compile(r"^blk\.(\d+)\.([a-z_]+)\.weight$")
# Gemma 3's block (llama.cpp's gguf-py constants: MODEL_ARCH.GEMMA3's tensors): ffn_norm is the
# pre-feedforward norm there, post_attention_norm the norm of the attention's output.
_GEMMA3_LAYER_TENSORS = {
    **{k: v for k, v in _LAYER_TENSORS.items() if k != "ffn_norm"},
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "post_attention_norm": "post_attention_layernorm",
    "ffn_norm": "pre_feedforward_layernorm",
    "post_ffw_norm": "post_feedforward_layernorm",
}


class GGUFImportError(ValueError):
    """The GGUF file is missing, malformed, or uses something this importer does not support."""


def read_metadata(reader: GGUFReader) -> dict:
    """Every key/value field of the file, as Python values (str, int, float, bool, lists)."""
    return {
        name: field.contents()
        for name, field in reader.fields.items()
        if not name.startswith("GGUF.")
    }


def file_type_name(meta: dict) -> str | None:
    """llama.cpp's name of the file's `general.file_type` ("Q4_K_M", "Q8_0", "F16": gguf-py's LlamaFileType
    without its MOSTLY_ / ALL_ prefix), as Ollama reports a model's quantization_level; None when the file
    does not say or says a number gguf-py does not know."""
    try:
        name = LlamaFileType(int(meta["general.file_type"])).name
    except (KeyError, TypeError, ValueError):
        return None
    return name.removeprefix("MOSTLY_").removeprefix("ALL_")


def hf_tensor_name(gguf_name: str, config: dict | None = None) -> str:
    """The HF name for a GGUF tensor name (Llama's, or Gemma 3's for a config.json of
    Gemma3ForCausalLM). Raises GGUFImportError for an unknown one."""
    if gguf_name in _GLOBAL_TENSORS:
        return _GLOBAL_TENSORS[gguf_name]
    layer_tensors = _GEMMA3_LAYER_TENSORS if _is_gemma3(config) else _LAYER_TENSORS
    m = _LAYER_NAME.match(gguf_name)
    if m and m.group(2) in layer_tensors:
        return f"model.layers.{m.group(1)}.{layer_tensors[m.group(2)]}.weight"
    if gguf_name == "rope_freqs.weight":
        raise GGUFImportError("rope_freqs (Llama 3.1-style RoPE scaling) is not supported")
    raise GGUFImportError(f"tensor {gguf_name!r} has no HF Llama equivalent")


def expected_tensor_names(config: dict) -> set[str]:
    """The HF tensor names a Llama (or Gemma 3) with this config.json needs."""
    names = {"model.embed_tokens.weight", "model.norm.weight"}
    if not config["tie_word_embeddings"]:
        names.add("lm_head.weight")
    layer_tensors = _GEMMA3_LAYER_TENSORS if _is_gemma3(config) else _LAYER_TENSORS
    for i in range(config["num_hidden_layers"]):
        names.update(f"model.layers.{i}.{part}.weight" for part in layer_tensors.values())
    return names


def _is_gemma3(config: dict | None) -> bool:
    return bool(config) and config.get("architectures") == ["Gemma3ForCausalLM"]


def gemma3_config(meta: dict, tensor_names: set[str], dtype: str) -> dict:
    """config.json (transformers' Gemma3TextConfig fields) for a gemma3 GGUF's metadata.

    What llama.cpp reads (src/models/gemma3.cpp): the window from gemma3.attention.sliding_window,
    every 6th layer full unless gemma3.attention.sliding_window_pattern says otherwise (a period,
    or one flag per layer, true = sliding), the local RoPE base gemma3.rope.freq_base_swa
    (10000 when absent), q·k scaled by head_dim ** -0.5 (hidden / heads for the 62-layer 27B).
    """
    def need(key: str):
        if f"gemma3.{key}" not in meta:
            raise GGUFImportError(f"metadata key gemma3.{key} is missing")
        return meta[f"gemma3.{key}"]

    hidden, n_heads, layers = int(need("embedding_length")), int(need("attention.head_count")), int(need("block_count"))
    head_dim = int(meta.get("gemma3.attention.key_length", 256))
    pattern = meta.get("gemma3.attention.sliding_window_pattern", 6)
    window = meta.get("gemma3.attention.sliding_window")
    if not window:
        types = ["full_attention"] * layers
    elif isinstance(pattern, list):
        if len(pattern) != layers:
            raise GGUFImportError("gemma3.attention.sliding_window_pattern does not name every layer")
        types = ["sliding_attention" if flag else "full_attention" for flag in pattern]
    else:
        types = ["sliding_attention" if (i + 1) % int(pattern) else "full_attention" for i in range(layers)]
    scaling = meta.get("gemma3.rope.scaling.type", "none")
    if scaling not in ("none", "linear"):
        raise GGUFImportError(f"RoPE scaling {scaling!r} is not supported")
    config = {
        "architectures": ["Gemma3ForCausalLM"],
        "model_type": "gemma3_text",
        "vocab_size": int(meta.get("gemma3.vocab_size") or len(meta["tokenizer.ggml.tokens"])),
        "hidden_size": hidden,
        "intermediate_size": int(need("feed_forward_length")),
        "num_hidden_layers": layers,
        "num_attention_heads": n_heads,
        "num_key_value_heads": int(meta.get("gemma3.attention.head_count_kv", n_heads)),
        "head_dim": head_dim,
        "hidden_activation": "gelu_pytorch_tanh",
        "rms_norm_eps": float(need("attention.layer_norm_rms_epsilon")),
        "rope_theta": float(meta.get("gemma3.rope.freq_base", 1_000_000.0)),
        "rope_local_base_freq": float(meta.get("gemma3.rope.freq_base_swa", 10_000.0)),
        "rope_scaling": None,
        "sliding_window": int(window) if window else None,
        "layer_types": types,
        "query_pre_attn_scalar": hidden // n_heads if layers == 62 else head_dim,
        "final_logit_softcapping": meta.get("gemma3.final_logit_softcapping"),
        "attn_logit_softcapping": None,
        "max_position_embeddings": int(need("context_length")),
        "attention_bias": False,
        "tie_word_embeddings": "output.weight" not in tensor_names,
        "bos_token_id": meta.get("tokenizer.ggml.bos_token_id"),
        "eos_token_id": meta.get("tokenizer.ggml.eos_token_id"),
        "torch_dtype": dtype,
    }
    if scaling == "linear":
        config["rope_scaling"] = {"rope_type": "linear", "factor": float(need("rope.scaling.factor"))}
    if "tokenizer.ggml.padding_token_id" in meta:
        config["pad_token_id"] = meta["tokenizer.ggml.padding_token_id"]
    return config


def gemma3_tensor(name: str, weight: np.ndarray) -> np.ndarray:
    """A gemma3 GGUF tensor as transformers stores it: llama.cpp's convert adds 1 to every
    `*norm.weight` (Gemma3Model.norm_shift, since Gemma3RMSNorm scales by 1 + weight); this
    takes it off again."""
    return weight - np.float32(1.0) if name.endswith("norm.weight") else weight


# A gemma3 GGUF without tokenizer.chat_template (a base model's) gets Gemma's turn format: a system
# message opens the first user turn, the assistant's turns are "model" turns.
GEMMA3_CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{%- set ns = namespace(system='') -%}"
    "{%- for message in messages -%}"
    "{%- set content = message['content'] if message['content'] is string else "
    "(message['content'] | selectattr('type', 'equalto', 'text') | map(attribute='text') | join('\n\n')) -%}"
    "{%- if message['role'] == 'system' -%}{%- set ns.system = ns.system + content | trim + '\n\n' -%}"
    "{%- else -%}"
    "{{ '<start_of_turn>' + ('model' if message['role'] == 'assistant' else message['role']) + '\n' }}"
    "{%- if message['role'] == 'user' -%}{{ ns.system }}{%- set ns.system = '' -%}{%- endif -%}"
    "{{ content | trim }}{{ '<end_of_turn>\\n' }}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<start_of_turn>model\\n' }}{%- endif -%}"
)


def gemma3_files(meta: dict, files: dict[str, str]) -> dict[str, str]:
    """Gemma 3's tokenizer files: Gemma's turn format when the GGUF has no chat template, and
    <end_of_turn> among the end-of-generation ids (llama.cpp's vocab counts it as one too)."""
    tokens = meta["tokenizer.ggml.tokens"]
    tokenizer_config = json.loads(files["tokenizer_config.json"])
    if not tokenizer_config.get("chat_template"):
        tokenizer_config["chat_template"] = GEMMA3_CHAT_TEMPLATE
    generation = json.loads(files["generation_config.json"])
    eos = generation.get("eos_token_id")
    eos_ids = [eos] if isinstance(eos, int) else list(eos or [])
    if "<end_of_turn>" in tokens and tokens.index("<end_of_turn>") not in eos_ids:
        eos_ids.append(tokens.index("<end_of_turn>"))
    generation["eos_token_id"] = eos_ids
    return {**files, "tokenizer_config.json": json.dumps(tokenizer_config, indent=2, ensure_ascii=False),
            "generation_config.json": json.dumps(generation, indent=2)}


def unpermute_qk(weight: np.ndarray, n_head: int) -> np.ndarray:
    """Undo llama.cpp's Q/K row permutation (convert_hf_to_gguf.py `LlamaModel.permute`).

    weight: [n_head * head_dim, hidden]. llama.cpp turns HF's "first half / second
    half" rotary layout of each head into interleaved pairs; this turns it back.
    For K, n_head is the number of KV heads.
    """
    rows = weight.shape[0]
    w = weight.reshape(n_head, rows // n_head // 2, 2, *weight.shape[1:])
    return w.swapaxes(1, 2).reshape(weight.shape)


def hf_config(meta: dict, tensor_names: set[str], dtype: str) -> dict:
    """config.json for a llama or gemma3 GGUF's metadata (keys as in transformers' GGUF_CONFIG_MAPPING)."""
    arch = meta.get("general.architecture")
    if arch == "gemma3":
        return gemma3_config(meta, tensor_names, dtype)
    if arch != "llama":
        raise GGUFImportError(f"architecture {arch!r} is not supported; 'llama' and 'gemma3' are")
    scaling = meta.get("llama.rope.scaling.type", "none")
    if scaling not in ("none", "linear"):
        raise GGUFImportError(f"RoPE scaling {scaling!r} is not supported")

    def need(key: str):
        if f"llama.{key}" not in meta:
            raise GGUFImportError(f"metadata key llama.{key} is missing")
        return meta[f"llama.{key}"]

    hidden, n_heads = int(need("embedding_length")), int(need("attention.head_count"))
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": int(meta.get("llama.vocab_size") or len(meta["tokenizer.ggml.tokens"])),
        "hidden_size": hidden,
        "intermediate_size": int(need("feed_forward_length")),
        "num_hidden_layers": int(need("block_count")),
        "num_attention_heads": n_heads,
        "num_key_value_heads": int(meta.get("llama.attention.head_count_kv", n_heads)),
        "head_dim": int(meta.get("llama.rope.dimension_count", hidden // n_heads)),
        "hidden_act": "silu",
        "rms_norm_eps": float(need("attention.layer_norm_rms_epsilon")),
        "rope_theta": float(meta.get("llama.rope.freq_base", 10000.0)),
        "rope_scaling": None,
        "max_position_embeddings": int(need("context_length")),
        "attention_bias": False,
        "mlp_bias": False,
        "tie_word_embeddings": "output.weight" not in tensor_names,
        "bos_token_id": meta.get("tokenizer.ggml.bos_token_id"),
        "eos_token_id": meta.get("tokenizer.ggml.eos_token_id"),
        "torch_dtype": dtype,
    }
    if scaling == "linear":
        config["rope_scaling"] = {
            "rope_type": "linear",
            "factor": float(need("rope.scaling.factor")),
        }
    if "tokenizer.ggml.padding_token_id" in meta:
        config["pad_token_id"] = meta["tokenizer.ggml.padding_token_id"]
    return config


def _token_text(meta: dict, key: str) -> str | None:
    token_id = meta.get(f"tokenizer.ggml.{key}")
    return None if token_id is None else meta["tokenizer.ggml.tokens"][token_id]


def tokenizer_files(meta: dict) -> dict[str, str]:
    """tokenizer.json, tokenizer_config.json and generation_config.json, as text by file name."""
    model = meta.get("tokenizer.ggml.model")
    if model not in ("gpt2", "llama"):
        raise GGUFImportError(
            f"tokenizer model {model!r} is not supported; 'gpt2' (byte-level BPE) and 'llama' "
            "(SentencePiece-style BPE with byte fallback) are"
        )
    try:
        if model == "llama":
            tokenizer = build_spm_tokenizer(
                meta["tokenizer.ggml.tokens"],
                meta.get("tokenizer.ggml.scores") or [],
                meta.get("tokenizer.ggml.token_type") or [],
                add_bos=bool(meta.get("tokenizer.ggml.add_bos_token", True)),
                bos_id=meta.get("tokenizer.ggml.bos_token_id"),
                add_space_prefix=bool(meta.get("tokenizer.ggml.add_space_prefix", True)),
            )
        else:
            tokenizer = build_tokenizer(
                meta["tokenizer.ggml.tokens"],
                meta.get("tokenizer.ggml.merges") or [],
                meta.get("tokenizer.ggml.token_type") or [],
                meta.get("tokenizer.ggml.pre"),
            )
    except ValueError as exc:
        raise GGUFImportError(str(exc)) from exc
    tokenizer_config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": _token_text(meta, "bos_token_id"),
        "eos_token": _token_text(meta, "eos_token_id"),
        "pad_token": _token_text(meta, "padding_token_id"),
        "unk_token": _token_text(meta, "unknown_token_id"),
        "add_bos_token": bool(meta.get("tokenizer.ggml.add_bos_token", False)),
        "add_eos_token": bool(meta.get("tokenizer.ggml.add_eos_token", False)),
        "model_max_length": int(meta.get(f"{meta.get('general.architecture')}.context_length", 2048)),
        "chat_template": meta.get("tokenizer.chat_template"),
    }
    generation_config = {
        key: meta[f"tokenizer.ggml.{gguf_key}"]
        for key, gguf_key in (
            ("bos_token_id", "bos_token_id"),
            ("eos_token_id", "eos_token_id"),
            ("pad_token_id", "padding_token_id"),
        )
        if f"tokenizer.ggml.{gguf_key}" in meta
    }
    files = {
        "tokenizer.json": tokenizer.to_str(),
        "tokenizer_config.json": json.dumps(tokenizer_config, indent=2, ensure_ascii=False),
        "generation_config.json": json.dumps(generation_config, indent=2),
    }
    return gemma3_files(meta, files) if meta.get("general.architecture") == "gemma3" else files


def _qk_heads(name: str, config: dict) -> int | None:
    if _is_gemma3(config):  # llama.cpp's Gemma 3 keeps HF's rotary layout (NeoX RoPE): nothing to undo
        return None
    if name.endswith("q_proj.weight"):
        return config["num_attention_heads"]
    if name.endswith("k_proj.weight"):
        return config["num_key_value_heads"]
    return None


def convert_tensors(reader: GGUFReader, config: dict, dtype: str, progress: bool) -> tuple[dict, dict]:
    """Every tensor under its HF name, Q and K rows un-permuted: (safetensors tensors, HF weight
    name -> block format of those kept as blocks). dtype "blocks" keeps BLOCK_TYPES' tensors
    as blocks and dequantizes the rest to float32; "float32" / "bfloat16" dequantize all."""
    tensors, formats = {}, {}
    for t in tqdm(reader.tensors, desc="tensors", unit="tensor", disable=not progress):
        name = hf_tensor_name(t.name, config)
        heads = _qk_heads(name, config)
        if dtype == "blocks" and t.tensor_type in BLOCK_TYPES and len(t.shape) == 2:
            rows = int(t.shape[1])
            blocks = BlockWeight.from_gguf(np.asarray(t.data).reshape(rows, -1), BLOCK_TYPES[t.tensor_type])
            if heads:
                blocks = blocks.rows(torch.from_numpy(unpermute_qk(np.arange(rows), heads)))
            tensors.update(blocks.tensors(name))
            formats[name] = blocks.format
            continue
        weight = dequantize(t.data, t.tensor_type)
        # ggml lists dims innermost first; HF wants [out, in].
        weight = weight.reshape([int(d) for d in reversed(t.shape)])
        if heads:
            weight = unpermute_qk(weight, heads)
        if _is_gemma3(config):
            weight = gemma3_tensor(name, weight)
        tensors[name] = torch.from_numpy(np.array(weight, dtype=np.float32, order="C")).to(
            DTYPES.get(dtype, torch.float32))
    return tensors, formats


def unsupported_tensor_types(reader: GGUFReader) -> None:
    """Refuse a file with a tensor type outside SUPPORTED_TENSOR_TYPES: GGUFImportError naming each such
    type, a tensor of it and how many there are, and the types that run."""
    bad: dict[str, list[str]] = {}
    for t in reader.tensors:
        if t.tensor_type not in SUPPORTED_TENSOR_TYPES:
            bad.setdefault(t.tensor_type.name, []).append(t.name)
    if bad:
        found = "; ".join(f"{kind} ({len(names)} tensors, e.g. {names[0]})" for kind, names in sorted(bad.items()))
        runs = ", ".join(sorted(q.name for q in SUPPORTED_TENSOR_TYPES))
        raise GGUFImportError(f"tensor type {found} cannot be run by this engine; it runs {runs}")


def _open(path: Path) -> GGUFReader:
    if not path.is_file():
        raise GGUFImportError(f"{path} does not exist or is not a file")
    with path.open("rb") as f:
        if f.read(4) != b"GGUF":
            raise GGUFImportError(f"{path} is not a GGUF file (no GGUF magic)")
    try:
        return GGUFReader(path)
    except (ValueError, OSError, IndexError) as exc:
        raise GGUFImportError(f"{path} is not a readable GGUF file: {exc}") from exc


def import_gguf(
    gguf_path: str | Path,
    out_dir: str | Path,
    dtype: str = "blocks",
    overwrite: bool = False,
    progress: bool = True,
) -> Path:
    """Write the HF-format folder for a llama GGUF file at `out_dir`; return its path.

    dtype: "blocks" (BLOCK_TYPES' tensors kept as shipped, the rest float32), or
    "float32" / "bfloat16" (every tensor dequantized to it). The folder is
    written next to `out_dir` under a temporary name and renamed into place, so
    a failed import leaves nothing behind. Raises GGUFImportError for a missing
    or non-GGUF file, an architecture other than llama, an unsupported tensor
    type or tokenizer, a bad dtype, or an existing `out_dir` without overwrite.
    """
    gguf_path, out_dir = Path(gguf_path), Path(out_dir)
    if dtype not in IMPORT_DTYPES:
        raise GGUFImportError(
            f"dtype {dtype!r} is not supported; choose one of {', '.join(IMPORT_DTYPES)}"
        )
    if out_dir.exists() and not overwrite:
        raise GGUFImportError(f"{out_dir} already exists (overwrite it with --force)")
    reader = _open(gguf_path)
    meta = read_metadata(reader)
    config = hf_config(meta, {t.name for t in reader.tensors}, "float32" if dtype == "blocks" else dtype)
    # Fail on an unknown or missing tensor before writing anything.
    missing = expected_tensor_names(config) - {hf_tensor_name(t.name, config) for t in reader.tensors}
    if missing:
        raise GGUFImportError(f"the file lacks tensors for {', '.join(sorted(missing)[:5])}")
    unsupported_tensor_types(reader)
    files = tokenizer_files(meta)

    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = out_dir.parent / f".{out_dir.name}.tmp-{uuid.uuid4().hex[:8]}"
    tmp.mkdir()
    try:
        tensors, formats = convert_tensors(reader, config, dtype, progress)
        if formats:
            config["quantization_config"] = quantization_config(formats, file_type_name(meta))
        save_file(tensors, tmp / "model.safetensors", metadata={"format": "pt"})
        # safetensors creates the file owner-only; a model folder is readable data like the rest.
        os.chmod(tmp / "model.safetensors", 0o644)
        del tensors
        (tmp / "config.json").write_text(json.dumps(config, indent=2))
        for name, text in files.items():
            (tmp / name).write_text(text, encoding="utf-8")
        _replace(tmp, out_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out_dir


def _replace(tmp: Path, out_dir: Path) -> None:
    """Rename `tmp` to `out_dir`, moving an existing `out_dir` aside first and deleting it after."""
    old = None
    if out_dir.exists():
        old = out_dir.parent / f".{out_dir.name}.old-{uuid.uuid4().hex[:8]}"
        out_dir.rename(old)
    tmp.rename(out_dir)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
