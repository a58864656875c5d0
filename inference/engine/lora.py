"""LoRA adapters from PEFT folders: read, checked against the served model, their updates scaled once.

A PEFT LoRA folder holds `adapter_config.json` (`r`, `lora_alpha`, `target_modules`,
optional `rank_pattern` / `alpha_pattern`, `use_rslora`) and `adapter_model.safetensors`
with, per targeted linear, `base_model.model.<module>.lora_A.weight` [r, in] and
`.lora_B.weight` [out, r]. The update of a targeted linear is
`y += scaling * B (A x)` with scaling = alpha / r (alpha / sqrt(r) with rsLoRA); the
scaling is folded into B here, once. Source: PEFT `tuners/lora/layer.py` (Linear.forward,
update_layer) and `utils/other.get_pattern_key` for the patterns.
"""
from __future__ import annotations

import itertools
import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path

import torch

from .config import ModelConfig

# The projections an adapter may target, and the block of the decoder layer each belongs to.
TARGET_MODULES = {"q_proj": "self_attn", "k_proj": "self_attn", "v_proj": "self_attn", "o_proj": "self_attn",
                  "gate_proj": "mlp", "up_proj": "mlp", "down_proj": "mlp"}
_KEY = re.compile(r"^base_model\.model\.(model\.layers\.(\d+)\.(self_attn|mlp)\.(\w+))\.lora_([AB])\.weight$")
_uids = itertools.count(1)


class LoraError(ValueError):
    """An adapter folder that cannot serve this model (missing files, other base, modules or shapes)."""


class LoraNotFound(LoraError):
    """No adapter folder at the path given."""


def module_shape(cfg: ModelConfig, module: str) -> tuple[int, int]:
    """(in_features, out_features) of a decoder layer's projection `module` in the served model."""
    q, kv, h, i = cfg.num_attention_heads * cfg.head_dim, cfg.num_key_value_heads * cfg.head_dim, \
        cfg.hidden_size, cfg.intermediate_size
    return {"q_proj": (h, q), "k_proj": (h, kv), "v_proj": (h, kv), "o_proj": (q, h),
            "gate_proj": (h, i), "up_proj": (h, i), "down_proj": (i, h)}[module]


def _pattern_value(patterns: dict, module_name: str, default):
    """PEFT's get_pattern_key: the first pattern key matching the module name's tail, else `default`."""
    for key, value in patterns.items():
        if re.match(rf"(.*\.)?({key})$", module_name):
            return value
    return default


@dataclass(eq=False)
class LoraAdapter:
    """One adapter's weights, ready for the slots: per (layer, module) a pair (A float32 [r, in],
    Bt float32 [r, out]) with Bt = (scaling * B)ᵀ, so that the update of a row x is (x Aᵀ) Bt.

    uid: unique per load (a reload under the same name gets a new one); the prefix cache keys
    blocks by it, so KV computed with one adapter (or one version of it) never serves another.
    """

    name: str
    path: str
    rank: int
    modules: dict[tuple[int, str], tuple[torch.Tensor, torch.Tensor]]
    base_model: str | None = None
    uid: int = field(default_factory=lambda: next(_uids))
    slot: int = -1  # its slot once resident (layers/lora.LoraSlots.add)

    @property
    def num_bytes(self) -> int:
        return sum(a.numel() * a.element_size() + b.numel() * b.element_size() for a, b in self.modules.values())


def read_config(path: Path) -> dict:
    """The adapter_config.json of a PEFT LoRA folder. Raises LoraNotFound when the folder or file is
    absent, LoraError when it is not a LoRA config this engine serves."""
    if not path.is_dir():
        raise LoraNotFound(f"no adapter folder at {path}")
    cfg_path = path / "adapter_config.json"
    if not cfg_path.is_file():
        raise LoraNotFound(f"{path} has no adapter_config.json")
    try:
        cfg = json.loads(cfg_path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise LoraError(f"{cfg_path} is not valid JSON: {exc}") from exc
    if not isinstance(cfg, dict):
        raise LoraError(f"{cfg_path} does not hold a JSON object")
    if cfg.get("peft_type", "LORA") != "LORA":
        raise LoraError(f"{path}: peft_type {cfg.get('peft_type')!r} is not LORA")
    for flag, why in (("use_dora", "DoRA"), ("modules_to_save", "modules_to_save"), ("fan_in_fan_out", "fan_in_fan_out")):
        if cfg.get(flag):
            raise LoraError(f"{path}: {why} adapters are not supported")
    if cfg.get("bias", "none") != "none":
        raise LoraError(f"{path}: bias {cfg['bias']!r} is not supported (only 'none')")
    targets = cfg.get("target_modules")
    if isinstance(targets, list):
        other = sorted(set(targets) - set(TARGET_MODULES))
        if other:
            raise LoraError(f"{path}: target modules {other} are not supported; an adapter may target "
                            f"{', '.join(TARGET_MODULES)}")
    for key in ("r", "lora_alpha"):
        if not isinstance(cfg.get(key, 8), (int, float)) or cfg.get(key, 8) <= 0:
            raise LoraError(f"{path}: {key} must be a positive number")
    return cfg


def _base_fits(base: str | None, served: Path) -> bool:
    """Whether the adapter's base_model_name_or_path names the served folder (its last path part,
    case-insensitively; hub ids and local folders of one model share it). An empty base fits."""
    if not base:
        return True
    return Path(base.rstrip("/")).name.lower() == served.name.lower()


def load_adapter(name: str, path: str | Path, cfg: ModelConfig, served_path: str | Path,
                 max_rank: int, check_base: bool = True) -> LoraAdapter:
    """Read a PEFT LoRA folder for the served model.

    Returns a LoraAdapter whose tensors are float32 on the CPU. Raises LoraNotFound when there is
    no adapter at `path`, LoraError when its base model (`base_model_name_or_path`, when
    `check_base`), its modules (only q/k/v/o and gate/up/down projections of existing layers) or
    its shapes do not fit `cfg`, or when a rank exceeds `max_rank`.
    """
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    folder = Path(path)
    config = read_config(folder)
    base = config.get("base_model_name_or_path")
    if check_base and not _base_fits(base, Path(served_path)):
        raise LoraError(f"adapter {name!r} was trained on {base!r}, not on the served model {Path(served_path).name!r}")
    weights = folder / "adapter_model.safetensors"
    if not weights.is_file():
        raise LoraNotFound(f"{folder} has no adapter_model.safetensors")
    try:
        state = load_file(str(weights))
    except (SafetensorError, OSError) as exc:
        raise LoraError(f"{weights} cannot be read: {exc}") from exc
    pairs: dict[tuple[int, str], dict[str, torch.Tensor]] = {}
    names: dict[tuple[int, str], str] = {}
    for key, tensor in state.items():
        m = _KEY.match(key)
        if m is None:
            raise LoraError(f"adapter {name!r}: weight {key!r} is not a LoRA update of a layer projection")
        module_name, layer, block, module, which = m.group(1), int(m.group(2)), m.group(3), m.group(4), m.group(5)
        if TARGET_MODULES.get(module) != block:
            raise LoraError(f"adapter {name!r}: {block}.{module} is not a supported target module")
        if layer >= cfg.num_hidden_layers:
            raise LoraError(f"adapter {name!r}: layer {layer} does not exist (the model has {cfg.num_hidden_layers})")
        pairs.setdefault((layer, module), {})[which] = tensor
        names[(layer, module)] = module_name
    if not pairs:
        raise LoraError(f"adapter {name!r}: {weights.name} holds no LoRA weights")
    r_default, alpha_default = config.get("r", 8), config.get("lora_alpha", 8)
    modules: dict[tuple[int, str], tuple[torch.Tensor, torch.Tensor]] = {}
    top = 0
    for (layer, module), ab in sorted(pairs.items()):
        if set(ab) != {"A", "B"}:
            raise LoraError(f"adapter {name!r}: layer {layer} {module} lacks lora_{'B' if 'A' in ab else 'A'}")
        a, b = ab["A"].float(), ab["B"].float()
        k, n = module_shape(cfg, module)
        rank = a.shape[0]
        if a.dim() != 2 or b.dim() != 2 or a.shape[1] != k or b.shape != (n, rank):
            raise LoraError(f"adapter {name!r}: layer {layer} {module} has lora_A {tuple(a.shape)} and lora_B "
                            f"{tuple(b.shape)}; the served model needs [r, {k}] and [{n}, r]")
        want = _pattern_value(config.get("rank_pattern") or {}, names[(layer, module)], r_default)
        if rank != want:
            raise LoraError(f"adapter {name!r}: layer {layer} {module} has rank {rank}, its config says {want}")
        if rank > max_rank:
            raise LoraError(f"adapter {name!r}: rank {rank} exceeds METRALE_MAX_LORA_RANK ({max_rank})")
        alpha = _pattern_value(config.get("alpha_pattern") or {}, names[(layer, module)], alpha_default)
        scaling = alpha / math.sqrt(rank) if config.get("use_rslora") else alpha / rank
        modules[(layer, module)] = (a.contiguous(), (b * scaling).t().contiguous())
        top = max(top, rank)
    return LoraAdapter(name=name, path=str(folder), rank=top, modules=modules, base_model=base)
