"""The Llama-family decoder (Llama, Mistral, Qwen2, Qwen3) over a packed token batch.

Parameter names follow transformers' modeling_llama.py exactly
(`model.layers.N.self_attn.q_proj.weight`, ...) so an HF checkpoint loads without
a rename table. After loading, `fuse()` concatenates q/k/v and gate/up into one
matrix each (two GEMMs fewer per layer; weights loaded as GGUF blocks stay blocks),
and `set_weights()` keeps each linear in the weight format asked for (float, int8 or
blocks, layers/linear.py), with the embedding rows read from the LM head's blocks
when they are tied.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .. import kernels
from ..config import ModelConfig
from ..layers.attention import AttentionMetadata, paged_attention
from ..layers.blocks import BLOCK, K_FORMATS, BlockWeight
from ..layers.embedding import embedding_table
from ..layers.linear import PackedLinear
from ..layers.norm import RMSNorm
from ..layers.rotary import RotaryEmbedding


def source(linear: nn.Module) -> torch.Tensor | BlockWeight:
    """A loaded linear's (or embedding's) weight: the GGUF blocks the loader attached as
    `blocks`, else its float weight."""
    blocks = getattr(linear, "blocks", None)
    return blocks if blocks is not None else linear.weight


class BlockEmbedding(nn.Module):
    """Embedding rows read from a block-format weight (the tied LM head's blocks, or the
    embedding's own): forward(ids int64 [T]) -> [T, hidden] in `dtype`, gguf-py's dequantised
    values (kernels.block_rows)."""

    def __init__(self, weight: kernels.KernelWeight, dtype: torch.dtype):
        super().__init__()
        self.weight_blocks = weight
        self.dtype = dtype

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return kernels.block_rows(self.weight_blocks, ids).to(self.dtype)


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
        # The factor on q·k (None: head_dim ** -0.5, SDPA's default) and whether this layer attends
        # through a sliding window (AttentionMetadata.for_layer); Gemma 3 sets both.
        self.scale: float | None = None
        self.sliding = False

    def fuse(self):
        """Concatenate q/k/v weights (and biases) into one [q+2kv, hidden] matrix."""
        bias = None
        if self.q_proj.bias is not None:
            bias = torch.cat([self.q_proj.bias, self.k_proj.bias, self.v_proj.bias])
        self.qkv = PackedLinear.concat([source(self.q_proj), source(self.k_proj), source(self.v_proj)], bias)
        self.out = PackedLinear(source(self.o_proj))
        del self.q_proj, self.k_proj, self.v_proj, self.o_proj

    def packed(self) -> list[PackedLinear]:
        return [self.qkv, self.out]

    def forward(self, x, rope, k_cache, v_cache, meta: AttentionMetadata, compact: slice | None = None):
        """rope: this step's (cos, sin) rows from RotaryEmbedding.tables; compact: the rows that use
        the compact weights."""
        t = x.shape[0]
        q_size = self.n_heads * self.head_dim
        kv_size = self.n_kv * self.head_dim
        if self.qkv is not None:
            q, k, v = self.qkv(x, compact).split([q_size, kv_size, kv_size], dim=-1)
        else:
            q, k, v = self.q_proj(x), self.k_proj(x), self.v_proj(x)
        q = q.view(t, self.n_heads, self.head_dim)
        k = k.view(t, self.n_kv, self.head_dim)
        v = v.reshape(t, self.n_kv, self.head_dim)
        if self.q_norm is not None:
            q = self.q_norm(q)
            k = self.k_norm(k)
        q, k = RotaryEmbedding.rotate(q, k, *rope)
        o = paged_attention(q, k, v, k_cache, v_cache, meta.for_layer(self.sliding), self.scale).view(t, q_size)
        return self.out(o, compact) if self.out is not None else self.o_proj(o)


def gelu_tanh(x: torch.Tensor) -> torch.Tensor:
    """GELU with the tanh approximation (transformers' gelu_pytorch_tanh)."""
    return F.gelu(x, approximate="tanh")


ACTIVATIONS = {"silu": F.silu, "gelu_pytorch_tanh": gelu_tanh}


class MLP(nn.Module):
    """Gated feed-forward: down(act(gate(x)) * up(x)); act is SiLU (SwiGLU) unless the config names
    GELU-tanh (Gemma's GeGLU)."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.act = ACTIVATIONS[cfg.hidden_activation]
        self.gate_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.up_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)
        self.gate_up: PackedLinear | None = None
        self.down: PackedLinear | None = None

    def fuse(self):
        """Concatenate gate and up weights into one [2 * intermediate, hidden] matrix."""
        self.gate_up = PackedLinear.concat([source(self.gate_proj), source(self.up_proj)])
        self.down = PackedLinear(source(self.down_proj))
        del self.gate_proj, self.up_proj, self.down_proj

    def packed(self) -> list[PackedLinear]:
        return [self.gate_up, self.down]

    def forward(self, x, compact: slice | None = None):
        if self.gate_up is None:
            return self.down_proj(self.act(self.gate_proj(x)) * self.up_proj(x))
        gate, up = self.gate_up(x, compact).chunk(2, dim=-1)
        return self.down(self.act(gate) * up, compact)


class DecoderLayer(nn.Module):
    """Pre-norm residual block: x + attn(norm(x)), then x + mlp(norm(x))."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.self_attn = Attention(cfg)
        self.mlp = MLP(cfg)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def fused_norms(self) -> dict:
        """The compiled step's norms (kernels/decode_layer.c metrale_layer): ln1 before the attention,
        ln2 before the MLP; no norms of their outputs."""
        return dict(ln1=self.input_layernorm, ln2=self.post_attention_layernorm, post_attn_norm=None,
                    post_ff_norm=None)

    def forward(self, x, rope, k_cache, v_cache, meta, compact: slice | None = None):
        x = x + self.self_attn(self.input_layernorm(x), rope, k_cache, v_cache, meta, compact)
        return x + self.mlp(self.post_attention_layernorm(x), compact)


class LlamaModel(nn.Module):
    """Embedding, the decoder layers and the final norm (transformers' `model.*`)."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.embed_tokens = embedding_table(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(cfg) for _ in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)


class LlamaForCausalLM(nn.Module):
    """The causal LM: packed tokens in, hidden states out; `compute_logits` for the rows that sample.

    forward(input_ids int64 [T], positions int64 [T], kv_caches: list of (k, v)
    per layer, meta) -> hidden [T, hidden_size] in the model dtype. With compact weights
    (set_weights), the decode rows use them (`compact_decode`), and the prefill rows too
    when `compact_prefill`; the other rows use the exact weights.
    compute_logits(hidden [N, hidden_size], compact: the rows slice) -> float32 [N, vocab_size].
    """

    fused_decode = True  # the compiled decode step (layers/fused_decode.py) computes this layer

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.config = cfg
        self.model = self.build_model(cfg)
        self.lm_head = None if cfg.tie_word_embeddings else nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        # The RoPE tables are computed, not loaded: on the CPU even while the loader builds the rest on
        # the meta device (arithmetic on meta tensors runs torch's reference kernels, whose first use
        # imports torch._dynamo: 1.5-2 s of a process's start), moved with the model by .to(device).
        with torch.device("cpu"):
            self.init_rotary()
        self.head: PackedLinear | None = None
        self.compact_decode = False
        self.compact_prefill = False
        self.weight_formats: dict[str, int] = {}  # format -> linears in it, after set_weights

    @staticmethod
    def build_model(cfg: ModelConfig) -> nn.Module:
        """The `model.*` module tree (embedding, layers, final norm)."""
        return LlamaModel(cfg)

    def init_rotary(self) -> None:
        """Build the RoPE tables on the current default device (__init__ builds them on the CPU)."""
        cfg = self.config
        self.rotary = RotaryEmbedding(cfg.head_dim, cfg.max_position_embeddings, cfg.rope_theta, cfg.rope_scaling)

    def fuse(self):
        """Fuse q/k/v and gate/up in every layer (call once, after loading weights)."""
        for layer in self.model.layers:
            layer.self_attn.fuse()
            layer.mlp.fuse()
        self.head = PackedLinear(source(self.model.embed_tokens if self.lm_head is None else self.lm_head))

    def packed(self) -> list[PackedLinear]:
        """Every fused linear, the LM head included (after fuse())."""
        out = [self.head]
        for layer in self.model.layers:
            out += layer.self_attn.packed() + layer.mlp.packed()
        return out

    @staticmethod
    def _format(weights: str, lin: PackedLinear, head: bool) -> str | None:
        loaded = lin.blocks.format if lin.blocks is not None else None
        if weights == "model":
            return None
        if weights == "int8" or lin.shape[1] % BLOCK:
            return "int8"
        if weights == "q8":
            return "q8_0"
        if weights == "q4":  # a file's 5-bit and K-quant blocks are its own 4-6 bit choice: kept as shipped
            if (loaded and all(f in ("q4_0", "q4_1", "q5_0", "q5_1", *K_FORMATS) for f in loaded.split("+"))) or (
                    head and loaded == "q8_0"):
                return loaded
            return "q8_0" if head else "q4_1"
        return loaded or "q8_0"  # "blocks": as loaded; float parts of a block folder in Q8_0

    def set_weights(self, weights: str = "model", prefill: str = "same", device: torch.device | None = None) -> None:
        """Keep every fused linear in the format `weights` asks for (EngineConfig.weights: "model",
        "int8", "q4", "q8" or "auto"; call once after fuse()). "auto" is the blocks as loaded
        for a folder that has them, else "int8". prefill "same": prompt rows use the compact
        weights too (with the compiled kernels), "model": the exact ones (kept beside them).
        In a block format the embedding rows are read from blocks (the tied LM head's), and
        no float copy is kept that no row uses."""
        device = device or next(self.parameters()).device
        dtype = next(self.parameters()).dtype
        lins = self.packed()
        if weights == "auto":
            weights = "blocks" if any(lin.blocks is not None for lin in lins) else "int8"
        use_kernels = device.type == "cpu" and kernels.available()
        formats = [self._format(weights, lin, lin is self.head) for lin in lins]
        compact = all(f is not None for f in formats) and (use_kernels or all(f == "int8" for f in formats))
        all_rows = compact and prefill == "same" and use_kernels
        for lin, fmt in zip(lins, formats):
            lin.set_format(fmt if compact else None, all_rows, device, dtype)
        self.compact_decode, self.compact_prefill = compact and device.type == "cpu", all_rows
        self.weight_formats = {}
        for fmt in formats:
            self.weight_formats[fmt or "model"] = self.weight_formats.get(fmt or "model", 0) + 1
        self._set_embedding(device, dtype, use_kernels)

    def _set_embedding(self, device: torch.device, dtype: torch.dtype, use_kernels: bool) -> None:
        emb = self.model.embed_tokens
        blocks = getattr(emb, "blocks", None)
        head_blocks = None
        if self.lm_head is None:  # tied: the head's blocks hold the embedding rows
            head_blocks = next((kw for kw in (self.head.compact, self.head.exact)
                                if kw is not None and kw.format != "int8"), None)
        if use_kernels and (head_blocks is not None or blocks is not None):
            kw = head_blocks or kernels.KernelWeight.from_blocks(blocks, exact=True)
            self.model.embed_tokens = BlockEmbedding(kw, dtype)
        elif blocks is not None:  # no kernels: the dequantised rows
            self.model.embed_tokens = nn.Embedding.from_pretrained(blocks.dequantize().to(device=device, dtype=dtype))
        if self.head.weight is None and self.head.exact is None and self.head.compact is None:
            raise RuntimeError("the LM head has no weight left")

    def weight_bytes(self) -> int:
        """Resident bytes of every weight the model keeps (the linears' forms, shared tensors once,
        the embedding, the norms)."""
        total = sum(lin.nbytes for lin in self.packed())
        emb = self.model.embed_tokens
        if isinstance(emb, nn.Embedding) and (self.head.weight is None or
                                              emb.weight.data_ptr() != self.head.weight.data_ptr()):
            total += emb.weight.numel() * emb.weight.element_size()
        elif isinstance(emb, BlockEmbedding) and emb.weight_blocks not in (self.head.compact, self.head.exact):
            total += emb.weight_blocks.nbytes
        return total + sum(p.numel() * p.element_size() for n, p in self.named_parameters() if "norm" in n)

    def compact_rows(self, num_decodes: int, num_rows: int) -> slice | None:
        """The rows of a packed batch (decodes first) that use the compact weights, or None."""
        start = 0 if self.compact_decode else num_decodes
        stop = num_rows if self.compact_prefill else num_decodes
        return slice(start, stop) if stop > start else None

    def forward(self, input_ids, positions, kv_caches, meta: AttentionMetadata, fused=None) -> torch.Tensor:
        """fused: a layers.fused_decode.FusedDecoder; when given, the decode rows run through it
        (its final norm too) and only the prefill rows take the torch layers."""
        d = meta.num_decodes
        if fused is not None and d:
            x = self.embed(input_ids)
            decodes = x[:d].contiguous()
            fused.run(decodes, positions[:d], meta)
            if d == x.shape[0]:
                return decodes
            prefill = self._layers(x[d:], positions[d:], kv_caches, meta.prefill_part(),
                                   slice(None) if self.compact_prefill else None)
            return torch.cat([decodes, self.model.norm(prefill)])
        return self.model.norm(self._layers(self.embed(input_ids), positions, kv_caches, meta,
                                            self.compact_rows(d, input_ids.shape[0])))

    def decode_logits(self, input_ids, positions, meta: AttentionMetadata, fused, logit_rows: list[int]
                      ) -> tuple[torch.Tensor, torch.Tensor]:
        """A step whose rows all run through `fused` (a FusedDecoder), the LM head of the rows
        `logit_rows` in the same compiled call: (hidden [T, hidden_size] after the final norm,
        logits float32 [len(logit_rows), vocab_size]), what forward and compute_logits give."""
        x = self.embed(input_ids).contiguous()
        return x, fused.run(x, positions, meta, logit_rows)

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        """The embedding rows of input_ids int64 [T]: [T, hidden_size] in the model dtype."""
        return self.model.embed_tokens(input_ids)

    def _layers(self, x, positions, kv_caches, meta: AttentionMetadata, compact: slice | None) -> torch.Tensor:
        rope = self.rotary.tables(positions, x.dtype)  # once per step, shared by every layer
        for layer, (k_cache, v_cache) in zip(self.model.layers, kv_caches):
            x = layer(x, rope, k_cache, v_cache, meta, compact)
        return x

    def compute_logits(self, hidden: torch.Tensor, compact: slice | None = None) -> torch.Tensor:
        if self.head is None:
            weight = self.model.embed_tokens.weight if self.lm_head is None else self.lm_head.weight
            return F.linear(hidden, weight).float()
        return self.head(hidden, compact).float()
