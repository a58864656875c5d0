"""Paged attention over a block pool, in plain torch (scaled_dot_product_attention).

The KV cache of one layer is two tensors [num_blocks, block_size, n_kv_heads,
head_dim]. Each sequence's block table lists its blocks in order; token t of a
sequence lives in block table[t // block_size] at offset t % block_size (vLLM's
PagedAttention layout, Kwon et al. 2023). Nothing CUDA-only is used.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from .. import kernels
from . import kv_quant


@dataclass(slots=True)
class PrefillSlice:
    """One sequence's prefill chunk in the packed batch.

    q_start/q_end: its rows in the packed token dimension. block_table: int64
    [num_blocks]. mask: bool [q_len, num_blocks * block_size], True where a query
    may attend (causal, offset by the tokens computed before this chunk). start: that
    offset in tokens (0 for a first chunk, which needs no mask).
    """

    q_start: int
    q_end: int
    block_table: torch.Tensor
    mask: torch.Tensor
    start: int = 0  # tokens of the sequence computed before this chunk
    causal: bool = True  # False: `mask` is more than causal (a sliding window), never skipped


@dataclass(slots=True)
class AttentionMetadata:
    """Per-step attention inputs, built once per step by the model runner and shared by all layers.

    slot_mapping: int64 [T], the flat KV slot (block * block_size + offset) each new
    token's K/V is written to. The first `num_decodes` packed tokens attend as decode
    rows, each with its own block table row and length: the decodes, and (when the
    model runner sends them through the compiled layers) prompt rows of short
    contexts; decode_block_tables: int64 [D, max_blocks] (padding points at block 0
    and is masked); decode_mask: bool [D, 1, 1, max_blocks * block_size], None when
    the compiled kernel runs them; decode_lens: int64 [D], tokens each row attends.
    prefills: the prefill chunks after them.
    window: the sliding-window (local) layers' metadata when it differs from this one (some row's
    context is longer than the window): the same slots, each row's block table cut to the blocks
    its window touches and masked to the window (ModelRunner.prepare); None: local layers use this.
    window_starts, window_lens: int64 [D] where the decode rows' tables are cut to a window: each
    row's first key and its keys' end in its cut table (the compiled kernel attends keys
    [window_starts, window_lens) of decode_block_tables); None otherwise.
    """

    slot_mapping: torch.Tensor
    num_decodes: int = 0
    decode_block_tables: torch.Tensor | None = None
    decode_mask: torch.Tensor | None = None
    decode_lens: torch.Tensor | None = None
    prefills: list[PrefillSlice] = field(default_factory=list)
    window: "AttentionMetadata | None" = None
    window_starts: torch.Tensor | None = None
    window_lens: torch.Tensor | None = None

    def prefill_part(self) -> "AttentionMetadata":
        """The metadata of the prefill rows alone, as if the decodes were not in the batch."""
        d = self.num_decodes
        return AttentionMetadata(
            slot_mapping=self.slot_mapping[d:],
            prefills=[PrefillSlice(p.q_start - d, p.q_end - d, p.block_table, p.mask, p.start, p.causal)
                      for p in self.prefills],
            window=self.window.prefill_part() if self.window is not None else None)

    def for_layer(self, sliding: bool) -> "AttentionMetadata":
        """The metadata a layer attends with: `window` for a sliding-window layer when set."""
        return self.window if sliding and self.window is not None else self


def paged_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    meta: AttentionMetadata,
    scale: float | None = None,
) -> torch.Tensor:
    """Write this step's K/V into the cache, then attend each query over its sequence's blocks.

    q: [T, n_heads, head_dim]; k, v: [T, n_kv_heads, head_dim]; caches: [num_blocks,
    block_size, n_kv_heads, head_dim], in the KV dtype (may be narrower than q's; K/V are
    cast back for the attention), or int8 [..., head_dim + 4] (layers/kv_quant.py: quantised
    on write, dequantised on read). Returns [T, n_heads, head_dim].
    Grouped-query attention folds the query heads of one KV head into the query-length
    axis, so K/V are never repeated. scale: the factor on q·k (None: head_dim ** -0.5).
    """
    num_blocks, block_size, n_kv, row = k_cache.shape
    n_heads, head_dim = q.shape[1], q.shape[2]
    group = n_heads // n_kv
    kv_quant.store(k_cache, meta.slot_mapping, k)
    kv_quant.store(v_cache, meta.slot_mapping, v)
    convert = k_cache.dtype != q.dtype
    out = torch.empty_like(q)
    scale = head_dim ** -0.5 if scale is None else scale

    d = meta.num_decodes
    if d and meta.decode_mask is None:  # the model runner chose the compiled kernel
        out[:d] = kernels.paged_decode_attention(q[:d], k_cache, v_cache, meta.decode_block_tables,
                                                 meta.decode_lens, scale)
    elif d:
        tables = meta.decode_block_tables
        length = tables.shape[1] * block_size
        kd = k_cache[tables].view(d, length, n_kv, row).transpose(1, 2)
        vd = v_cache[tables].view(d, length, n_kv, row).transpose(1, 2)
        if convert:
            kd, vd = kv_quant.load(kd, q.dtype), kv_quant.load(vd, q.dtype)
        qd = q[:d].view(d, n_kv, group, head_dim)
        od = F.scaled_dot_product_attention(qd, kd, vd, attn_mask=meta.decode_mask, scale=scale)
        out[:d] = od.reshape(d, n_heads, head_dim)

    for p in meta.prefills:
        q_len = p.q_end - p.q_start
        length = p.block_table.shape[0] * block_size
        kp = k_cache[p.block_table].view(length, n_kv, row).transpose(0, 1)
        vp = v_cache[p.block_table].view(length, n_kv, row).transpose(0, 1)
        if convert:
            kp, vp = kv_quant.load(kp, q.dtype), kv_quant.load(vp, q.dtype)
        if p.start == 0 and p.causal:
            # A first chunk is plainly causal: the flash kernel skips the masked half (about 2x).
            qp = q[p.q_start:p.q_end].transpose(0, 1)[None]
            op = F.scaled_dot_product_attention(qp, kp[None, :, :q_len], vp[None, :, :q_len], is_causal=True,
                                                enable_gqa=True, scale=scale)
            out[p.q_start:p.q_end] = op[0].transpose(0, 1)
            continue
        qp = q[p.q_start:p.q_end].view(q_len, n_kv, group, head_dim).permute(1, 2, 0, 3)
        qp = qp.reshape(1, n_kv, group * q_len, head_dim)
        mask = p.mask.repeat(group, 1)[None, None]
        # 4-D inputs take torch's flash kernel for CPU; 3-D ones fall back to the math path (bmm + softmax).
        op = F.scaled_dot_product_attention(qp, kp[None], vp[None], attn_mask=mask, scale=scale)
        op = op.view(n_kv, group, q_len, head_dim).permute(2, 0, 1, 3)
        out[p.q_start:p.q_end] = op.reshape(q_len, n_heads, head_dim)
    return out
