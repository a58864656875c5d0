"""Pooling and normalisation of an embedding model, read from its sentence-transformers files.

Source: sentence-transformers' folder format: modules.json lists the modules in order (Transformer,
Pooling, Normalize); the Pooling module's config.json (e.g. 1_Pooling/config.json) names its modes,
either as `pooling_mode` (a name or a list) or as the older `pooling_mode_*_token(s)` booleans, whose
order is cls, max, mean, mean_sqrt_len_tokens, weightedmean, lasttoken; several modes are
concatenated in that order. sentence_bert_config.json's max_seq_length is the most tokens an input
may have (else the model's max_position_embeddings).
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch

from .config import ConfigError

POOLING_MODES = ("cls", "max", "mean", "mean_sqrt_len_tokens", "weightedmean", "lasttoken")
_LEGACY_KEYS = {
    "pooling_mode_cls_token": "cls", "pooling_mode_max_tokens": "max", "pooling_mode_mean_tokens": "mean",
    "pooling_mode_mean_sqrt_len_tokens": "mean_sqrt_len_tokens",
    "pooling_mode_weightedmean_tokens": "weightedmean", "pooling_mode_lasttoken": "lasttoken",
}


@dataclass(slots=True, frozen=True)
class PoolingSpec:
    """modes: the pooling modes in output order; normalize: L2-normalise the pooled vector;
    max_seq_length: the most tokens one input may hold (special tokens included)."""

    modes: tuple[str, ...]
    normalize: bool
    max_seq_length: int

    @classmethod
    def from_folder(cls, path: str | Path, max_position_embeddings: int) -> "PoolingSpec":
        """Read modules.json and its Pooling module's config; a folder without modules.json pools by the
        mean, unnormalised (what sentence-transformers builds for a plain transformers folder). Raises
        ConfigError for a module it cannot serve (Dense, a custom module) or an unknown mode."""
        path = Path(path)
        modules_file = path / "modules.json"
        modes, normalize = ("mean",), False
        if modules_file.is_file():
            modules = json.loads(modules_file.read_text())
            kinds = [m.get("type", "").rsplit(".", 1)[-1] for m in modules]
            unknown = [k for k in kinds if k not in ("Transformer", "Pooling", "Normalize")]
            if unknown:
                raise ConfigError(f"modules.json has modules this server cannot run: {unknown}")
            if kinds[:1] != ["Transformer"] or kinds.count("Pooling") != 1:
                raise ConfigError("modules.json must start with a Transformer and hold one Pooling module")
            pooling = modules[kinds.index("Pooling")]
            modes = _modes(json.loads((path / pooling.get("path", "") / "config.json").read_text()))
            normalize = "Normalize" in kinds
        max_len = max_position_embeddings
        st_config = path / "sentence_bert_config.json"
        if st_config.is_file():
            max_len = min(max_len, int(json.loads(st_config.read_text()).get("max_seq_length") or max_len))
        return cls(modes, normalize, max_len)

    def pool(self, hidden: torch.Tensor, seq_lens: list[int]) -> torch.Tensor:
        """Pooled (and normalised) vectors float32 [B, D * len(modes)] from the packed hidden states
        float32 [T, D] of B sequences of lengths seq_lens (every token counts: sentence-transformers'
        attention mask without padding)."""
        lens = torch.tensor(seq_lens, dtype=torch.int64)
        starts = torch.cumsum(lens, 0) - lens if set(self.modes) & {"cls", "lasttoken", "weightedmean"} else None
        # Each row's sequence (one sequence: all zeros, without repeat_interleave's cost on a short pass).
        seq = (torch.zeros(hidden.shape[0], dtype=torch.int64) if len(seq_lens) == 1
               else torch.repeat_interleave(torch.arange(len(seq_lens)), lens))
        d = hidden.shape[1]
        parts = []
        for mode in self.modes:
            if mode == "cls":
                parts.append(hidden[starts])
            elif mode == "lasttoken":
                parts.append(hidden[starts + lens - 1])
            elif mode == "max":
                out = torch.full((len(seq_lens), d), float("-inf"))
                parts.append(out.scatter_reduce_(0, seq[:, None].expand(-1, d), hidden, "amax"))
            elif mode == "weightedmean":  # weights 1..L by position (sentence-transformers' rule)
                w = (torch.arange(hidden.shape[0]) - starts[seq] + 1).float()
                sums = torch.zeros((len(seq_lens), d)).index_add_(0, seq, hidden * w[:, None])
                parts.append(sums / (lens * (lens + 1) / 2).float()[:, None])
            else:
                sums = torch.zeros((len(seq_lens), d)).index_add_(0, seq, hidden)
                denom = lens.float() if mode == "mean" else lens.float().sqrt()
                parts.append(sums / denom[:, None])
        out = torch.cat(parts, dim=1) if len(parts) > 1 else parts[0]
        if not self.normalize:
            return out
        # F.normalize's steps (its norm is torch.linalg.vector_norm's) without its Python dispatch.
        return out / torch.linalg.vector_norm(out, 2, 1, True).clamp_min_(1e-12).expand_as(out)


def _modes(cfg: dict) -> tuple[str, ...]:
    mode = cfg.get("pooling_mode")
    if mode is None:
        modes = tuple(name for key, name in _LEGACY_KEYS.items() if cfg.get(key))
    else:
        modes = (mode,) if isinstance(mode, str) else tuple(mode)
    if not modes:
        raise ConfigError("the Pooling module's config names no pooling mode")
    bad = [m for m in modes if m not in POOLING_MODES]
    if bad:
        raise ConfigError(f"unknown pooling modes {bad}; known: {', '.join(POOLING_MODES)}")
    if cfg.get("include_prompt") is False:
        raise ConfigError("include_prompt false (instruction prompts left out of pooling) is not served")
    return modes
