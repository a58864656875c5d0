"""The KV cache's storage per dtype, and the int8 one's rule (METRALE_KV_CACHE_DTYPE=int8).

float32, bfloat16 and float16 caches hold K/V as they are, [num_blocks, block_size, n_kv, head_dim].
An int8 cache holds each (token, KV head) row as head_dim int8 values followed by the 4 bytes of its
float32 scale, [num_blocks, block_size, n_kv, head_dim + 4] int8: scale = amax / 127 and
q = round-half-even(x * (127 / amax)), 0 where amax is 0, so the value read back is q * scale
(an error of at most scale / 2 per element). The compiled kernels (kernels/cpu_kernels.c reads it,
kernels/decode_layer.c's write_kv writes it) take the same steps in float32.
"""
from __future__ import annotations

import torch

SCALE_BYTES = 4  # one float32 scale after each int8 head row


def cache_shape(num_blocks: int, block_size: int, n_kv: int, head_dim: int, dtype: torch.dtype) -> tuple[int, ...]:
    """The shape of one layer's K (or V) cache in `dtype` (int8: each head row carries its scale)."""
    return (num_blocks, block_size, n_kv, head_dim + SCALE_BYTES if dtype == torch.int8 else head_dim)


def head_row_bytes(head_dim: int, dtype: torch.dtype) -> int:
    """Bytes one token's K (or V) of one KV head takes in a `dtype` cache."""
    if dtype == torch.int8:
        return head_dim + SCALE_BYTES
    return head_dim * torch.empty((), dtype=dtype).element_size()


def quantize(x: torch.Tensor) -> torch.Tensor:
    """float32 [..., head_dim] -> int8 [..., head_dim + 4]: the int8 values, then the scale's bytes."""
    x = x.float()
    amax = x.abs().amax(-1, keepdim=True)
    inv = torch.where(amax > 0, torch.tensor(127.0, device=x.device) / amax, torch.zeros((), device=x.device))
    q = torch.round(x * inv).clamp_(-127, 127).to(torch.int8)
    scale = (amax / 127.0).contiguous().view(torch.int8)  # [..., 4]: the float32's bytes
    return torch.cat([q, scale], dim=-1)


def dequantize(rows: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """int8 [..., head_dim + 4] (quantize's output, or a gather of cache rows) -> `dtype` [..., head_dim]."""
    values = rows[..., :-SCALE_BYTES].float()
    scale = rows[..., -SCALE_BYTES:].contiguous().view(torch.float32)  # [..., 1]
    return (values * scale).to(dtype)


def store(cache: torch.Tensor, slots: torch.Tensor, x: torch.Tensor) -> None:
    """Write x [T, n_kv, head_dim] into the flat slots `slots` (int64 [T]) of one layer's cache,
    converted (float caches) or quantised (int8)."""
    n_kv = cache.shape[2]
    row = quantize(x) if cache.dtype == torch.int8 else x.to(cache.dtype)
    cache.view(-1, n_kv, cache.shape[3]).index_copy_(0, slots, row)


def load(rows: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Gathered cache rows [..., head_dim (+ 4)] as `dtype` [..., head_dim] for the torch attention."""
    if rows.dtype == torch.int8:
        return dequantize(rows, dtype)
    return rows if rows.dtype == dtype else rows.to(dtype)
