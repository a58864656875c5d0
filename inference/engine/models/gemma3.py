"""Gemma 3 (text) over a packed token batch: the Llama-family machinery (fused linears, weight
formats, paged attention) with Gemma's layer.

What differs from Llama (transformers' modeling_gemma3.py, Gemma3ForCausalLM):
- RMSNorm scales by (1 + weight), computed in float32 and cast back (Gemma3RMSNorm); a block has
  four of them: input, post-attention (on the attention's output, before the residual add),
  pre-feedforward and post-feedforward; q and k get a per-head one before RoPE;
- the MLP is GELU-tanh gated (GeGLU);
- the embedding rows are multiplied by sqrt(hidden_size), the factor rounded to the model dtype;
- q·k is scaled by query_pre_attn_scalar ** -0.5;
- "sliding_attention" layers attend to the last `sliding_window` positions only, with RoPE base
  rope_local_theta; "full_attention" layers attend to all, with rope_theta (and rope_scaling);
- the LM head is tied to the embedding; logits are tanh-capped at final_logit_softcapping when set.
Parameter names are transformers' (`model.layers.N.pre_feedforward_layernorm.weight`, ...).
"""
from __future__ import annotations

import math

import torch
from torch import nn

from ..config import ModelConfig
from ..layers.embedding import embedding_table
from ..layers.norm import RMSNorm
from ..layers.rotary import RotaryEmbedding
from .llama import MLP, Attention, LlamaForCausalLM

ROPE_FIRST_ROWS = 2048  # positions of RoPE table built at load; more as contexts reach them


class GemmaRMSNorm(RMSNorm):
    """y = x / sqrt(mean(x^2) + eps) * (1 + weight), all in float32, cast back to x's dtype.

    x: [..., dim]; returns the same shape and dtype. Source: transformers' Gemma3RMSNorm (the
    weight is stored as the offset from 1, zero-initialised).
    """

    def __init__(self, dim: int, eps: float):
        super().__init__(dim, eps)
        self.weight = nn.Parameter(torch.zeros(dim))

    def factor(self) -> torch.Tensor:
        """1 + weight, float32 [dim]: computed once (layers/fused_decode.py reads it at load), not per step."""
        return (1.0 + self.weight.detach().float()).contiguous()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return (h * (1.0 + self.weight.float())).to(x.dtype)


class Gemma3Attention(Attention):
    """Llama's attention with Gemma's q/k norms, its scale, and the sliding window on local layers."""

    def __init__(self, cfg: ModelConfig, layer: int):
        super().__init__(cfg)
        self.q_norm = GemmaRMSNorm(cfg.head_dim, cfg.rms_norm_eps)
        self.k_norm = GemmaRMSNorm(cfg.head_dim, cfg.rms_norm_eps)
        self.scale = cfg.attention_scale
        self.sliding = cfg.is_sliding(layer)


class Gemma3DecoderLayer(nn.Module):
    """x + post_attn_norm(attn(input_norm(x))), then x + post_ff_norm(mlp(pre_ff_norm(x)))."""

    def __init__(self, cfg: ModelConfig, layer: int):
        super().__init__()
        self.self_attn = Gemma3Attention(cfg, layer)
        self.mlp = MLP(cfg)
        h, eps = cfg.hidden_size, cfg.rms_norm_eps
        self.input_layernorm = GemmaRMSNorm(h, eps)
        self.post_attention_layernorm = GemmaRMSNorm(h, eps)
        self.pre_feedforward_layernorm = GemmaRMSNorm(h, eps)
        self.post_feedforward_layernorm = GemmaRMSNorm(h, eps)

    def fused_norms(self) -> dict:
        """The compiled step's norms (kernels/decode_layer.c metrale_layer): ln1 before the attention,
        ln2 before the MLP, and the norms of their outputs."""
        return dict(ln1=self.input_layernorm, ln2=self.pre_feedforward_layernorm,
                    post_attn_norm=self.post_attention_layernorm, post_ff_norm=self.post_feedforward_layernorm)

    def forward(self, x, rope, k_cache, v_cache, meta, compact: slice | None = None):
        x = x + self.post_attention_layernorm(
            self.self_attn(self.input_layernorm(x), rope, k_cache, v_cache, meta, compact))
        return x + self.post_feedforward_layernorm(self.mlp(self.pre_feedforward_layernorm(x), compact))


class Gemma3Model(nn.Module):
    """Embedding, the decoder layers and the final norm (transformers' Gemma3TextModel's weights)."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.embed_tokens = embedding_table(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(Gemma3DecoderLayer(cfg, i) for i in range(cfg.num_hidden_layers))
        self.norm = GemmaRMSNorm(cfg.hidden_size, cfg.rms_norm_eps)


class Gemma3ForCausalLM(LlamaForCausalLM):
    """Gemma 3's causal LM; the interface is LlamaForCausalLM's (forward, compute_logits, fuse,
    set_weights, decode_logits). Its decode rows take the compiled decode step where the weights
    allow it (layers/fused_decode.py), the embedding scale and the logits' cap outside it."""

    @staticmethod
    def build_model(cfg: ModelConfig) -> nn.Module:
        return Gemma3Model(cfg)

    def init_rotary(self) -> None:
        """RoPE tables for the full-attention layers (rope_theta, rope_scaling) and the local ones
        (rope_local_theta, unscaled)."""
        cfg = self.config
        # Grown as contexts reach them: two full tables of the 270M's 32768 positions would be 128 MB.
        self.rotary = RotaryEmbedding(cfg.head_dim, cfg.max_position_embeddings, cfg.rope_theta, cfg.rope_scaling,
                                      first_rows=ROPE_FIRST_ROWS)
        self.rotary_local = RotaryEmbedding(cfg.head_dim, cfg.max_position_embeddings,
                                            cfg.rope_local_theta or cfg.rope_theta, None, first_rows=ROPE_FIRST_ROWS)

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        """Embedding rows times sqrt(hidden_size), that factor first rounded to the rows' dtype
        (Gemma3TextScaledWordEmbedding): [T, hidden_size]."""
        x = self.model.embed_tokens(input_ids)
        return x * torch.tensor(math.sqrt(self.config.hidden_size), dtype=x.dtype)

    def _layers(self, x, positions, kv_caches, meta, compact: slice | None) -> torch.Tensor:
        rope = self.rotary.tables(positions, x.dtype)
        rope_local = self.rotary_local.tables(positions, x.dtype)
        for layer, (k_cache, v_cache) in zip(self.model.layers, kv_caches):
            x = layer(x, rope_local if layer.self_attn.sliding else rope, k_cache, v_cache, meta, compact)
        return x

    def compute_logits(self, hidden: torch.Tensor, compact: slice | None = None) -> torch.Tensor:
        """float32 [N, vocab_size]; cap * tanh(logits / cap) with final_logit_softcapping set."""
        return self._cap(super().compute_logits(hidden, compact))

    def decode_logits(self, input_ids, positions, meta, fused, logit_rows: list[int]):
        """LlamaForCausalLM.decode_logits with the logits capped as compute_logits caps them."""
        hidden, logits = super().decode_logits(input_ids, positions, meta, fused, logit_rows)
        return hidden, self._cap(logits)

    def _cap(self, logits: torch.Tensor | None) -> torch.Tensor | None:
        cap = self.config.final_logit_softcapping
        return logits if cap is None or logits is None else torch.tanh(logits / cap) * cap
