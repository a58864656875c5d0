"""Rotary position embeddings (RoPE) with rope_theta and llama3-style rope_scaling."""
from __future__ import annotations

import math

import torch


def inv_frequencies(head_dim: int, rope_theta: float, rope_scaling: dict | None) -> torch.Tensor:
    """The per-pair inverse frequencies, float32 [head_dim // 2].

    rope_scaling {"rope_type": "llama3", factor, low_freq_factor, high_freq_factor,
    original_max_position_embeddings} follows transformers'
    `_compute_llama3_parameters`; "linear" divides by factor; "default"/None is plain RoPE.
    Raises ValueError for other rope types.
    """
    inv = 1.0 / (rope_theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
    if not rope_scaling:
        return inv
    kind = rope_scaling.get("rope_type") or rope_scaling.get("type") or "default"
    if kind == "default":
        return inv
    if kind == "linear":
        return inv / float(rope_scaling["factor"])
    if kind == "llama3":
        factor = float(rope_scaling["factor"])
        low = float(rope_scaling.get("low_freq_factor", 1.0))
        high = float(rope_scaling.get("high_freq_factor", 4.0))
        old_len = float(rope_scaling.get("original_max_position_embeddings", 8192))
        low_wavelen = old_len / low
        high_wavelen = old_len / high
        wavelen = 2 * math.pi / inv
        scaled = torch.where(wavelen > low_wavelen, inv / factor, inv)
        smooth = (old_len / wavelen - low) / (high - low)
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
        return torch.where(medium, smoothed, scaled)
    raise ValueError(f"rope_scaling type {kind!r} is not supported")


class RotaryEmbedding(torch.nn.Module):
    """Precomputed cos/sin tables. `tables(positions, dtype)` looks up one step's rows once;
    `rotate(q, k, cos, sin)` applies them in every layer.

    Uses the "rotate half" layout of transformers' Llama (not interleaved pairs).
    q: [T, n_heads, head_dim], k: [T, n_kv_heads, head_dim], positions: int64 [T];
    cos, sin: [T, 1, head_dim] in the activations' dtype.
    `first_rows`: build only the tables' first rows and grow them (doubling, up to max_positions)
    when `tables` (or `cover`) meets a later position: the same values, resident only as far as
    contexts go (the compiled decode step covers its positions before it reads `cos` / `sin`).
    """

    def __init__(self, head_dim: int, max_positions: int, rope_theta: float, rope_scaling: dict | None,
                 first_rows: int | None = None):
        super().__init__()
        self.max_positions = max_positions
        self.register_buffer("inv", inv_frequencies(head_dim, rope_theta, rope_scaling), persistent=False)
        self.register_buffer("cos", torch.empty(0), persistent=False)
        self.register_buffer("sin", torch.empty(0), persistent=False)
        self._build(min(first_rows or max_positions, max_positions))

    def _build(self, rows: int) -> None:
        t = torch.arange(rows, dtype=torch.float32, device=self.inv.device)
        freqs = torch.outer(t, self.inv)
        emb = torch.cat((freqs, freqs), dim=-1)
        self.cos, self.sin = emb.cos(), emb.sin()

    def cover(self, last: int) -> bool:
        """Grow the tables (doubling, up to max_positions) to hold position `last`; True when they grew."""
        if last < self.cos.shape[0] or self.cos.shape[0] >= self.max_positions:
            return False
        self._build(min(self.max_positions, max(last + 1, 2 * self.cos.shape[0])))
        return True

    def tables(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        if positions.numel() and self.cos.shape[0] < self.max_positions:
            self.cover(int(positions.max()))
        return self.cos[positions].unsqueeze(1).to(dtype), self.sin[positions].unsqueeze(1).to(dtype)

    @staticmethod
    def rotate(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
        return _rotate(q, cos, sin), _rotate(k, cos, sin)

    def forward(self, positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor):
        return self.rotate(q, k, *self.tables(positions, q.dtype))


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin
