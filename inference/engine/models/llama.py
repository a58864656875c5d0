"""The Llama-family decoder (Llama, Mistral, Qwen2, Qwen3) over a packed token batch.

Parameter names follow transformers' modeling_llama.py exactly
(`model.layers.N.self_attn.q_proj.weight`, ...) so an HF checkpoint loads without
a rename table. After loading, `fuse()` concatenates q/k/v and gate/up into one
matrix each (two GEMMs fewer per layer), and `enable_int8()` adds int8 copies used
for decode rows and, when asked, prefill rows (layers/linear.py).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..config import ModelConfig
from ..layers.attention import AttentionMetadata, paged_attention
from ..layers.linear import PackedLinear
from ..layers.norm import RMSNorm
from ..layers.rotary import RotaryEmbedding


class Attention(nn.Module):
    """Self-attention with GQA, optional qkv bias (Qwen2) and per-head q/k RMSNorm (Qwen3)."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.n_heads = cfg.num_attention_heads
        self.n_kv = cfg.num_key_value_heads
        self.head_dim = cfg.head_dim
        bias = cfg.attention_bias
        self.q_proj = nn.Linear(cfg.hidden_size, self.n_heads * self.head_dim, bias=bias)
        self.k_proj = nn.Linear(cfg.hidden_size, self.n_kv * self.head_dim, bias=bias)
        self.v_proj = nn.Linear(cfg.hidden_size, self.n_kv * self.head_dim, bias=bias)
        self.o_proj = nn.Linear(self.n_heads * self.head_dim, cfg.hidden_size, bias=False)
        if cfg.qk_norm:
            self.q_norm = RMSNorm(self.head_dim, cfg.rms_norm_eps)
            self.k_norm = RMSNorm(self.head_dim, cfg.rms_norm_eps)
        else:
            self.q_norm = self.k_norm = None
        self.qkv: PackedLinear | None = None
        self.out: PackedLinear | None = None

    def fuse(self):
        """Concatenate q/k/v weights (and biases) into one [q+2kv, hidden] matrix."""
        bias = None
        if self.q_proj.bias is not None:
            bias = torch.cat([self.q_proj.bias, self.k_proj.bias, self.v_proj.bias])
        self.qkv = PackedLinear(torch.cat([self.q_proj.weight, self.k_proj.weight, self.v_proj.weight]), bias)
        self.out = PackedLinear(self.o_proj.weight)
        del self.q_proj, self.k_proj, self.v_proj, self.o_proj

    def packed(self) -> list[PackedLinear]:
        return [self.qkv, self.out]

    def forward(self, x, rope, k_cache, v_cache, meta: AttentionMetadata, int8: slice | None = None):
        """rope: this step's (cos, sin) rows from RotaryEmbedding.tables."""
        t = x.shape[0]
        q_size = self.n_heads * self.head_dim
        kv_size = self.n_kv * self.head_dim
        if self.qkv is not None:
            q, k, v = self.qkv(x, int8).split([q_size, kv_size, kv_size], dim=-1)
        else:
            q, k, v = self.q_proj(x), self.k_proj(x), self.v_proj(x)
        q = q.view(t, self.n_heads, self.head_dim)
        k = k.view(t, self.n_kv, self.head_dim)
        v = v.reshape(t, self.n_kv, self.head_dim)
        if self.q_norm is not None:
            q = self.q_norm(q)
            k = self.k_norm(k)
        q, k = RotaryEmbedding.rotate(q, k, *rope)
        o = paged_attention(q, k, v, k_cache, v_cache, meta).view(t, q_size)
        return self.out(o, int8) if self.out is not None else self.o_proj(o)


class MLP(nn.Module):
    """SwiGLU feed-forward: down(silu(gate(x)) * up(x))."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.gate_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.up_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)
        self.gate_up: PackedLinear | None = None
        self.down: PackedLinear | None = None

    def fuse(self):
        """Concatenate gate and up weights into one [2 * intermediate, hidden] matrix."""
        self.gate_up = PackedLinear(torch.cat([self.gate_proj.weight, self.up_proj.weight]))
        self.down = PackedLinear(self.down_proj.weight)
        del self.gate_proj, self.up_proj, self.down_proj

    def packed(self) -> list[PackedLinear]:
        return [self.gate_up, self.down]

    def forward(self, x, int8: slice | None = None):
        if self.gate_up is None:
            return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))
        gate, up = self.gate_up(x, int8).chunk(2, dim=-1)
        return self.down(F.silu(gate) * up, int8)


class DecoderLayer(nn.Module):
    """Pre-norm residual block: x + attn(norm(x)), then x + mlp(norm(x))."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.self_attn = Attention(cfg)
        self.mlp = MLP(cfg)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def forward(self, x, rope, k_cache, v_cache, meta, int8: slice | None = None):
        x = x + self.self_attn(self.input_layernorm(x), rope, k_cache, v_cache, meta, int8)
        return x + self.mlp(self.post_attention_layernorm(x), int8)


class LlamaModel(nn.Module):
    """Embedding, the decoder layers and the final norm (transformers' `model.*`)."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(cfg) for _ in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)


class LlamaForCausalLM(nn.Module):
    """The causal LM: packed tokens in, hidden states out; `compute_logits` for the rows that sample.

    forward(input_ids int64 [T], positions int64 [T], kv_caches: list of (k, v)
    per layer, meta) -> hidden [T, hidden_size] in the model dtype. With int8 enabled,
    the first meta.num_decodes rows (the decodes) use the int8 weights, and the prefill
    rows too when `int8_prefill` is set (compiled kernels only: see enable_int8).
    compute_logits(hidden [N, hidden_size], int8: the rows slice) -> float32 [N, vocab_size].
    """

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.config = cfg
        self.model = LlamaModel(cfg)
        self.lm_head = None if cfg.tie_word_embeddings else nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        self.rotary = RotaryEmbedding(cfg.head_dim, cfg.max_position_embeddings, cfg.rope_theta, cfg.rope_scaling)
        self.head: PackedLinear | None = None
        self.int8_decode = False
        self.int8_prefill = False

    def fuse(self):
        """Fuse q/k/v and gate/up in every layer (call once, after loading weights)."""
        for layer in self.model.layers:
            layer.self_attn.fuse()
            layer.mlp.fuse()
        self.head = PackedLinear(self.model.embed_tokens.weight if self.lm_head is None else self.lm_head.weight)

    def packed(self) -> list[PackedLinear]:
        """Every fused linear, the LM head included (after fuse())."""
        out = [self.head]
        for layer in self.model.layers:
            out += layer.self_attn.packed() + layer.mlp.packed()
        return out

    def enable_int8(self, decode: bool = True, prefill: bool = False) -> None:
        """Add int8 copies of every fused linear (CPU only; call after fuse()), used for decode rows
        when `decode` and for prefill rows when `prefill` and the compiled kernels packed them
        (torch's fallback int8 kernel is slower than float32 GEMMs on prefill-sized batches)."""
        for lin in self.packed():
            lin.enable_int8()
        has_int8 = all(lin.q is not None for lin in self.packed())
        self.int8_decode = decode and has_int8
        self.int8_prefill = prefill and has_int8 and all(lin.packed for lin in self.packed())

    def int8_rows(self, num_decodes: int, num_rows: int) -> slice | None:
        """The rows of a packed batch (decodes first) that use the int8 weights, or None."""
        start = 0 if self.int8_decode else num_decodes
        stop = num_rows if self.int8_prefill else num_decodes
        return slice(start, stop) if stop > start else None

    def forward(self, input_ids, positions, kv_caches, meta: AttentionMetadata, fused=None) -> torch.Tensor:
        """fused: a layers.fused_decode.FusedDecoder; when given, the decode rows run through it
        and only the prefill rows take the torch layers."""
        d = meta.num_decodes
        if fused is not None and d:
            x = self.model.embed_tokens(input_ids)
            decodes = x[:d].contiguous()
            fused.run(decodes, positions[:d], meta)
            if d == x.shape[0]:
                return self.model.norm(decodes)
            prefill = self._layers(x[d:], positions[d:], kv_caches, meta.prefill_part(),
                                   slice(None) if self.int8_prefill else None)
            return self.model.norm(torch.cat([decodes, prefill]))
        return self.model.norm(self._layers(self.model.embed_tokens(input_ids), positions, kv_caches, meta,
                                            self.int8_rows(d, input_ids.shape[0])))

    def _layers(self, x, positions, kv_caches, meta: AttentionMetadata, int8: slice | None) -> torch.Tensor:
        rope = self.rotary.tables(positions, x.dtype)  # once per step, shared by every layer
        for layer, (k_cache, v_cache) in zip(self.model.layers, kv_caches):
            x = layer(x, rope, k_cache, v_cache, meta, int8)
        return x

    def compute_logits(self, hidden: torch.Tensor, int8: slice | None = None) -> torch.Tensor:
        if self.head is None:
            weight = self.model.embed_tokens.weight if self.lm_head is None else self.lm_head.weight
            return F.linear(hidden, weight).float()
        return self.head(hidden, int8).float()
