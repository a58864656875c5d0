"""Load an HF-format folder's safetensors weights into a model class from the registry."""
from __future__ import annotations

from pathlib import Path

import torch
from safetensors.torch import load_file

from ..config import ModelConfig
from .registry import MODEL_REGISTRY


class WeightLoadError(ValueError):
    """The folder's weights do not match the model the config describes."""


def load_model(path: str | Path, cfg: ModelConfig, dtype: torch.dtype, device: torch.device, fuse: bool = True,
               int8_decode: bool = False, int8_prefill: bool = False):
    """Build the registered class for `cfg.architecture` and load every `*.safetensors` file in `path`.

    Tensors are cast to `dtype` and moved to `device`. Raises WeightLoadError when a
    weight is missing, unexpected or of the wrong shape (tied embeddings may omit
    lm_head.weight). Returns the model in eval mode, fused unless `fuse` is False, with
    int8 copies of the linears for decode rows when `int8_decode` and for prefill rows
    when `int8_prefill` (CPU only; prefill needs the compiled kernels).
    """
    files = sorted(Path(path).glob("*.safetensors"))
    if not files:
        raise WeightLoadError(f"no *.safetensors file in {path}")
    with torch.device("meta"):
        model = MODEL_REGISTRY[cfg.architecture](cfg)
    state: dict[str, torch.Tensor] = {}
    for f in files:
        state.update(load_file(str(f)))
    if cfg.tie_word_embeddings:
        state.pop("lm_head.weight", None)
    expected = dict(model.named_parameters())
    missing = sorted(set(expected) - set(state))
    unexpected = sorted(k for k in set(state) - set(expected) if "rotary_emb" not in k)
    if missing or unexpected:
        raise WeightLoadError(f"weights do not match {cfg.architecture}: missing {missing[:5]}, unexpected {unexpected[:5]}")
    for name, param in expected.items():
        if tuple(state[name].shape) != tuple(param.shape):
            raise WeightLoadError(f"{name}: shape {tuple(state[name].shape)} != expected {tuple(param.shape)}")
    model.load_state_dict({k: state[k].to(dtype) for k in expected}, assign=True, strict=False)
    model.rotary = type(model.rotary)(cfg.head_dim, cfg.max_position_embeddings, cfg.rope_theta, cfg.rope_scaling)
    model.to(device)
    model.eval()
    model.requires_grad_(False)
    if fuse:
        model.fuse()
        if int8_decode or int8_prefill:
            model.enable_int8(decode=int8_decode, prefill=int8_prefill)
    return model
