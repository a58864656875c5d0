"""Load an HF-format folder's safetensors weights (float, or GGUF blocks listed in config.json) into a model class from the registry."""
from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file

from ..config import ModelConfig
from ..layers.blocks import BlockFormatError, BlockWeight, block_formats
from .registry import MODEL_REGISTRY


class WeightLoadError(ValueError):
    """The folder's weights do not match the model the config describes."""


def _module(model, weight_name: str):
    module = model
    for part in weight_name.removesuffix(".weight").split("."):
        module = getattr(module, part)
    return module


def load_model(path: str | Path, cfg: ModelConfig, dtype: torch.dtype, device: torch.device, fuse: bool = True,
               weights: str = "model", prefill: str = "same"):
    """Build the registered class for `cfg.architecture` and load every `*.safetensors` file in `path`.

    Float tensors are cast to `dtype` and moved to `device`; the weights config.json's
    `quantization_config` lists (layers/blocks.py) are read as GGUF blocks and kept as
    such. Raises WeightLoadError when a weight is missing, unexpected or of the wrong
    shape (tied embeddings may omit lm_head.weight). Returns the model in eval mode,
    fused unless `fuse` is False (then every weight is float), with its linears in the
    format `weights` asks for ("model", "int8", "q4", "q8", "auto": LlamaForCausalLM.set_weights;
    `prefill` "same" or "model" says which weights prompt rows use).
    """
    path = Path(path)
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise WeightLoadError(f"no *.safetensors file in {path}")
    try:
        formats = block_formats(json.loads((path / "config.json").read_text()))
    except (OSError, json.JSONDecodeError):
        formats = {}
    except BlockFormatError as exc:
        raise WeightLoadError(str(exc)) from exc
    with torch.device("meta"):
        model = MODEL_REGISTRY[cfg.architecture](cfg)
    state: dict[str, torch.Tensor] = {}
    for f in files:
        state.update(load_file(str(f)))
    if cfg.tie_word_embeddings:
        formats.pop("lm_head.weight", None)
        for suffix in ("weight", "qweight", "scales", "mins"):
            state.pop(f"lm_head.{suffix}", None)
    blocks: dict[str, BlockWeight] = {}
    try:
        for name, fmt in formats.items():
            blocks[name] = BlockWeight.pop_from(state, name, fmt)
    except BlockFormatError as exc:
        raise WeightLoadError(str(exc)) from exc
    expected = dict(model.named_parameters())
    missing = sorted(set(expected) - set(state) - set(blocks))
    unexpected = sorted(k for k in (set(state) | set(blocks)) - set(expected) if "rotary_emb" not in k)
    if missing or unexpected:
        raise WeightLoadError(f"weights do not match {cfg.architecture}: missing {missing[:5]}, unexpected {unexpected[:5]}")
    for name, param in expected.items():
        shape = blocks[name].shape if name in blocks else tuple(state[name].shape)
        if tuple(shape) != tuple(param.shape):
            raise WeightLoadError(f"{name}: shape {tuple(shape)} != expected {tuple(param.shape)}")
    if not fuse:  # the unfused modules run float weights only
        state.update({name: bw.dequantize() for name, bw in blocks.items()})
        blocks = {}
    # Copies (not views of load_file's mapping): a view would keep the whole file mapped, every page
    # of it resident beside the block weights' own copies.
    model.load_state_dict({k: state[k].to(dtype, copy=True) for k in expected if k in state}, assign=True,
                          strict=False)
    del state
    for name, bw in blocks.items():  # kept as blocks: fuse() and set_weights() read `module.blocks`
        module = _module(model, name)
        module.weight = None
        module.blocks = bw
    model.to(device)
    model.eval()
    model.requires_grad_(False)
    if fuse:
        model.fuse()
        model.set_weights(weights, prefill, device)
    return model
