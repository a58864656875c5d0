"""BERT as an encoder over packed sequences: absolute positions, token types, post-LayerNorm, GELU, no KV cache.

Source: transformers' `modeling_bert.py` (BertEmbeddings, BertSelfAttention, BertSelfOutput,
BertIntermediate, BertOutput); weight names are the checkpoint's (`encoder.layer.N.attention.self.query`,
with or without a `bert.` prefix). A batch is every sequence's tokens concatenated ([T] ids, no
padding); attention is bidirectional within a sequence only (the compiled kernel reads each sequence's
rows where they lie; without it, neighbours in length order share one SDPA call padded to the longest;
none attends across a boundary). The forward is a generator of bounded units of work (a whole
layer over a group of whole sequences of at most `chunk_rows` rows where the compiled kernels run it
in one call; for sequences longer than that, a linear over at most `chunk_rows` rows, or one group's
attention), so a caller can stop between
any two of them and resume (embedding_runner.EmbeddingRunner interleaves them with decode steps).
"""
from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import load_file

from .. import kernels
from ..config import ConfigError
from ..layers.linear import EncoderLinear, native_bfloat16

# hidden_act -> the activation (transformers' ACT2FN names); "gelu" is the erf form.
ACTIVATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "gelu": F.gelu,
    "gelu_new": lambda x: F.gelu(x, approximate="tanh"),
    "gelu_pytorch_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "relu": F.relu,
}
ENCODER_FORMATS = ("auto", "float32", "bfloat16")


@dataclass(slots=True, frozen=True)
class BertConfig:
    """The encoder's shape, from config.json's fields of the same names (transformers' BertConfig)."""

    vocab_size: int
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    intermediate_size: int
    max_position_embeddings: int
    type_vocab_size: int
    layer_norm_eps: float
    hidden_act: str

    @classmethod
    def from_dict(cls, cfg: dict) -> "BertConfig":
        """Read a BERT config.json. Raises ConfigError for another model type, relative positions, an
        activation outside ACTIVATIONS or heads that do not divide hidden_size."""
        if cfg.get("model_type") != "bert":
            raise ConfigError(f"not a BERT encoder: model_type {cfg.get('model_type')!r}")
        if cfg.get("position_embedding_type", "absolute") != "absolute":
            raise ConfigError(f"position_embedding_type {cfg['position_embedding_type']!r} is not served "
                              "(absolute only)")
        if cfg.get("hidden_act", "gelu") not in ACTIVATIONS:
            raise ConfigError(f"hidden_act {cfg['hidden_act']!r} is not one of {', '.join(ACTIVATIONS)}")
        try:
            out = cls(int(cfg["vocab_size"]), int(cfg["hidden_size"]), int(cfg["num_hidden_layers"]),
                      int(cfg["num_attention_heads"]), int(cfg["intermediate_size"]),
                      int(cfg.get("max_position_embeddings", 512)), int(cfg.get("type_vocab_size", 2)),
                      float(cfg.get("layer_norm_eps", 1e-12)), cfg.get("hidden_act", "gelu"))
        except (KeyError, TypeError, ValueError) as exc:
            raise ConfigError(f"config.json is not a BERT config: {exc}") from exc
        if out.hidden_size % out.num_attention_heads:
            raise ConfigError("num_attention_heads does not divide hidden_size")
        return out

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads


@dataclass(slots=True)
class PackedBatch:
    """Sequences concatenated in order of length (shortest first): input_ids, token_type_ids and
    position_ids int64 [T]; seq_lens and starts (first rows) in that order; order[i]: which input the
    i-th packed sequence is (restore() puts per-sequence rows back in input order)."""

    input_ids: torch.Tensor
    token_type_ids: torch.Tensor
    position_ids: torch.Tensor
    seq_lens: list[int]
    starts: list[int]
    order: list[int]

    @classmethod
    def pack(cls, sequences: list[list[int]], token_types: list[list[int]] | None = None) -> "PackedBatch":
        """Pack token id lists (each non-empty) into one batch; token types default to 0 (segment A)."""
        order = sorted(range(len(sequences)), key=lambda i: len(sequences[i]))
        lens = [len(sequences[i]) for i in order]
        ids = torch.tensor([t for i in order for t in sequences[i]], dtype=torch.int64)
        types = (torch.zeros_like(ids) if token_types is None
                 else torch.tensor([t for i in order for t in token_types[i]], dtype=torch.int64))
        positions = torch.cat([torch.arange(n, dtype=torch.int64) for n in lens])
        starts = [0] * len(lens)
        for i in range(1, len(lens)):
            starts[i] = starts[i - 1] + lens[i - 1]
        return cls(ids, types, positions, lens, starts, order)

    def restore(self, rows: torch.Tensor) -> torch.Tensor:
        """Per-sequence rows [B, ...] in packed order -> the same rows in input order (`rows` itself for
        one sequence)."""
        if len(self.order) == 1:
            return rows
        out = torch.empty_like(rows)
        out[torch.tensor(self.order, dtype=torch.int64)] = rows
        return out


class BertLayer:
    """One encoder layer's weights: fused q/k/v, the attention output, the feed-forward, two LayerNorms."""

    __slots__ = ("qkv", "attn_out", "attn_norm", "up", "down", "out_norm")

    def __init__(self, w: dict[str, torch.Tensor], prefix: str):
        att = f"{prefix}attention."
        self.qkv = EncoderLinear(torch.cat([w[f"{att}self.{p}.weight"] for p in ("query", "key", "value")]),
                                 torch.cat([w[f"{att}self.{p}.bias"] for p in ("query", "key", "value")]))
        self.attn_out = EncoderLinear(w[f"{att}output.dense.weight"], w[f"{att}output.dense.bias"])
        self.attn_norm = (w[f"{att}output.LayerNorm.weight"], w[f"{att}output.LayerNorm.bias"])
        self.up = EncoderLinear(w[f"{prefix}intermediate.dense.weight"], w[f"{prefix}intermediate.dense.bias"])
        self.down = EncoderLinear(w[f"{prefix}output.dense.weight"], w[f"{prefix}output.dense.bias"])
        self.out_norm = (w[f"{prefix}output.LayerNorm.weight"], w[f"{prefix}output.LayerNorm.bias"])

    def linears(self) -> list[EncoderLinear]:
        return [self.qkv, self.attn_out, self.up, self.down]


class BertEncoder:
    """A BERT encoder's weights and its packed forward (float32 activations throughout).

    `weights`: "float32" (the checkpoint's values: hidden states equal transformers' BertModel to float32
    rounding), "bfloat16" (every linear's weight and inputs in bfloat16, float32 sums:
    layers/linear.EncoderLinear) or "auto" (bfloat16 where the CPU multiplies it natively, else
    float32). The embeddings, LayerNorms, attention and pooling stay float32.
    """

    def __init__(self, cfg: BertConfig, w: dict[str, torch.Tensor], weights: str = "float32"):
        if weights not in ENCODER_FORMATS:
            raise ConfigError(f"encoder weights must be one of {', '.join(ENCODER_FORMATS)}, got {weights!r}")
        w = {k.removeprefix("bert."): v.float() for k, v in w.items()}
        need = ("embeddings.word_embeddings.weight", "embeddings.position_embeddings.weight",
                "embeddings.token_type_embeddings.weight", "embeddings.LayerNorm.weight")
        missing = [k for k in need if k not in w]
        if missing:
            raise ConfigError(f"the checkpoint is not a BERT encoder: missing {missing}")
        self.cfg = cfg
        self.word = w["embeddings.word_embeddings.weight"]
        self.position = w["embeddings.position_embeddings.weight"]
        self.token_type = w["embeddings.token_type_embeddings.weight"]
        self.emb_norm = (w["embeddings.LayerNorm.weight"], w["embeddings.LayerNorm.bias"])
        try:
            self.layers = [BertLayer(w, f"encoder.layer.{i}.") for i in range(cfg.num_hidden_layers)]
        except KeyError as exc:
            raise ConfigError(f"the checkpoint is missing {exc.args[0]}") from exc
        if tuple(self.word.shape) != (cfg.vocab_size, cfg.hidden_size):
            raise ConfigError(f"word_embeddings {tuple(self.word.shape)} != config's "
                              f"({cfg.vocab_size}, {cfg.hidden_size})")
        self.act = ACTIVATIONS[cfg.hidden_act]
        if weights == "auto":
            weights = "bfloat16" if native_bfloat16() else "float32"
        self.weights = weights
        for layer in self.layers:
            for lin in layer.linears():
                lin.set_format(weights)
        # Every linear in the batch-invariant kernels' layout where they are built (EncoderLinear.pack): a
        # text's embedding is then bitwise the same whatever else shares its pass. Packed bfloat16 weights
        # also add the up projection's bias and apply its GELU before rounding.
        self._packed = all([lin.pack() for layer in self.layers for lin in layer.linears()])
        self._workspace: dict[str, torch.Tensor] | None = None  # units()'s buffers between passes
        self._one_call_weights: list[tuple] | None = None  # _layer_weights()

    @classmethod
    def from_folder(cls, path: str | Path, weights: str = "float32") -> "BertEncoder":
        """Load config.json and every *.safetensors of an HF BERT folder. Raises ConfigError (not BERT,
        weights missing), FileNotFoundError (no config.json or no safetensors)."""
        import json

        path = Path(path)
        cfg = BertConfig.from_dict(json.loads((path / "config.json").read_text()))
        files = sorted(path.glob("*.safetensors"))
        if not files:
            raise FileNotFoundError(f"no *.safetensors file in {path}")
        state: dict[str, torch.Tensor] = {}
        for f in files:
            state.update(load_file(str(f)))
        return cls(cfg, state, weights)

    def weight_bytes(self) -> int:
        """Resident bytes of the weights kept (embeddings, norms and every linear's form)."""
        total = sum(t.numel() * t.element_size() for t in (self.word, self.position, self.token_type, *self.emb_norm))
        for layer in self.layers:
            total += sum(t.numel() * 4 for t in (*layer.attn_norm, *layer.out_norm))
            total += sum(lin.nbytes for lin in layer.linears())
        return total

    def forward(self, batch: PackedBatch, chunk_rows: int = 1 << 30) -> torch.Tensor:
        """The last layer's hidden states float32 [T, hidden_size] of a packed batch, run to the end."""
        units = self.units(batch, lambda: chunk_rows)
        while True:
            try:
                next(units)
            except StopIteration as done:
                return done.value

    def units(self, batch: PackedBatch, chunk_rows: Callable[[], int]) -> Iterator[None]:
        """The forward as a generator: it yields after each bounded unit of work and returns the hidden
        states float32 [T, hidden_size]. chunk_rows() is read before each row-wise unit: the most rows
        it covers (the caller may change it between units). Raises IndexError for a token id, type or
        position outside the embedding tables.

        With the compiled kernels, attention is kernels.encoder_attention over the packed rows (no
        padding), and with the erf GELU (compiled_steps()) the steps between the linears are compiled
        too (encoder.c): in the bfloat16 form bias + GELU to bfloat16 and bias + residual + LayerNorm to
        float32 and bfloat16, each linear's bfloat16 input made once; in the float32 form the bias and
        GELU in the linears' stores and bias + residual + LayerNorm in one step, into kept buffers."""
        cfg = self.cfg
        if batch.seq_lens and max(batch.seq_lens) > cfg.max_position_embeddings:  # positions 0 .. length - 1
            raise IndexError(f"a sequence is longer than max_position_embeddings ({cfg.max_position_embeddings})")
        # The three tables' rows gathered (index_select: the rows as they are, without advanced indexing's
        # general machinery), summed in that order.
        h = (self.word.index_select(0, batch.input_ids) + self.position.index_select(0, batch.position_ids)
             + self.token_type.index_select(0, batch.token_type_ids))
        h = F.layer_norm(h, (cfg.hidden_size,), *self.emb_norm, cfg.layer_norm_eps)
        yield
        t = h.shape[0]
        compiled = self.compiled_steps()
        bf16 = compiled and self.weights == "bfloat16"
        # The pass's buffers, kept from pass to pass (a pass takes them while it runs; one that finds them
        # taken makes its own): fresh ones would cost a page fault every 4 KiB on first touch (a 64-text
        # pass's q/k/v rows are 38 MB). h (float32, this pass's own) and its bfloat16 copy h16 are
        # updated in place, layer by layer: a layer reads them whole for q/k/v before its feed-forward
        # rewrites them row by row.
        work, self._workspace = self._workspace or {}, None
        try:
            # Where a unit runs the bfloat16 attention (AMX's tiles, AVX-512 BF16), it reads the q/k/v product
            # (bfloat16) and its bias, and writes its context in bfloat16, the next linear's input.
            bf16_attention = bf16 and kernels.encoder_bf16_attention(cfg.head_dim) is not None
            h16 = _buffer(work, "h16", t, cfg.hidden_size, torch.bfloat16) if bf16 else None
            if bf16:
                h16.copy_(h)
            qkv = _buffer(work, "qkv", t, 3 * cfg.hidden_size, torch.bfloat16 if bf16_attention else torch.float32)
            ctx = _buffer(work, "ctx", t, cfg.hidden_size, torch.bfloat16 if bf16_attention else torch.float32)
            # A whole layer in one kernel call over a group of whole sequences (their rows depend on nothing
            # else) of at most chunk_rows() rows: one return to Python a group, not one a step. The sequences
            # go shortest first; from the first that no longer fits a unit (chunk_rows() read before each
            # group: the caller may shrink it meanwhile), the rest of the layer runs step by step.
            layer_calls = compiled and self._packed and (bf16_attention or not bf16)
            # A group's arguments are made once and serve every layer that runs over it (kernels.encoder_layer_rows),
            # each layer's once for the encoder's life (_layer_weights).
            groups: dict[tuple[int, int], tuple] = {}
            n_seqs = len(batch.seq_lens)
            for index, layer in enumerate(self.layers):
                done = 0  # the sequences this layer has run in one-call groups
                while layer_calls and done < n_seqs:
                    limit = chunk_rows()
                    if batch.seq_lens[done] > limit:
                        break
                    last, r0 = done + 1, batch.starts[done]
                    r1 = r0 + batch.seq_lens[done]
                    while last < n_seqs and r1 + batch.seq_lens[last] - r0 <= limit:
                        r1 += batch.seq_lens[last]
                        last += 1
                    self._layer_in_one_call(index, batch, (done, last), groups, h, h16, qkv, ctx, work)
                    done = last
                    yield
                if done == n_seqs:
                    continue
                rest = batch.starts[done]  # the first row of the sequences left to this layer's steps
                for rows in _chunks(t, chunk_rows, rest):
                    if bf16_attention:
                        layer.qkv.product(h16[rows], out=qkv[rows])
                    elif bf16:
                        kernels.encoder_add_bias(layer.qkv.product(h16[rows]), layer.qkv.bias, qkv[rows])
                    elif compiled:
                        layer.qkv.product(h[rows], out=qkv[rows], bias=True)
                    else:
                        qkv[rows] = layer.qkv(h[rows])
                    yield
                first = done
                while first < n_seqs:
                    # Neighbours in length order: about chunk_rows rows a unit (the compiled attention reads
                    # them packed; SDPA pads them to the longest).
                    last = first + 1
                    while last < n_seqs and (last + 1 - first) * batch.seq_lens[last] <= chunk_rows():
                        last += 1
                    if bf16_attention:
                        kernels.encoder_attention_bf16(qkv, layer.qkv.bias, torch.tensor(batch.starts[first:last]),
                                                       torch.tensor(batch.seq_lens[first:last]), cfg.num_attention_heads,
                                                       1.0 / math.sqrt(cfg.head_dim), ctx)
                    else:
                        self._attend(qkv, ctx, batch, first, last)
                    first = last
                    yield
                for rows in _chunks(t, chunk_rows, rest):
                    if compiled and self._packed:
                        self._feed_forward_in_one_call(layer, ctx[rows], h[rows], h16[rows] if bf16 else None, work)
                    elif bf16:
                        self._feed_forward_compiled(layer, ctx[rows], h[rows], h16[rows])
                    else:
                        h[rows] = self._feed_forward(layer, ctx[rows], h[rows])
                    yield
            return h
        finally:
            self._workspace = work

    def compiled_steps(self) -> bool:
        """Whether the steps between the linears run compiled: the erf GELU, every linear with a bias, the
        kernels built, and the bfloat16 form or the float32 form with every linear packed (its bias and GELU
        are the packed linear's epilogue)."""
        return (self.cfg.hidden_act == "gelu" and kernels.available()
                and (self.weights == "bfloat16" or (self.weights == "float32" and self._packed))
                and all(lin.bias is not None for layer in self.layers for lin in layer.linears()))

    def _attend(self, qkv: torch.Tensor, ctx: torch.Tensor, batch: PackedBatch, first: int, last: int) -> None:
        """Bidirectional attention of packed sequences first..last-1 (no cache), their context rows written
        into ctx [T, hidden]: kernels.encoder_attention over their rows as packed, or without the kernels
        one SDPA call over them padded to the longest, padded keys masked out."""
        cfg = self.cfg
        nh, hd = cfg.num_attention_heads, cfg.head_dim
        lens, starts = batch.seq_lens[first:last], batch.starts[first:last]
        if kernels.available():
            kernels.encoder_attention(qkv, torch.tensor(starts), torch.tensor(lens), nh, 1.0 / math.sqrt(hd), ctx)
            return
        b, longest = last - first, lens[-1]
        r0, r1 = starts[0], starts[-1] + lens[-1]
        if lens[0] == longest:  # one length: the rows are already [B, L] contiguous
            x = qkv[r0:r1].view(b, longest, 3 * cfg.hidden_size)
            mask = None
        else:
            x = qkv.new_zeros((b, longest, 3 * cfg.hidden_size))
            for i, (s, n) in enumerate(zip(starts, lens)):
                x[i, :n] = qkv[s:s + n]
            mask = (torch.arange(longest)[None, :] < torch.tensor(lens)[:, None])[:, None, None, :]
        q, k, v = x.view(b, longest, 3, nh, hd).permute(2, 0, 3, 1, 4).unbind(0)
        o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=1.0 / math.sqrt(hd))
        o = o.transpose(1, 2).reshape(b, longest, cfg.hidden_size)
        if mask is None:
            ctx[r0:r1] = o.reshape(-1, cfg.hidden_size)
        else:
            for i, (s, n) in enumerate(zip(starts, lens)):
                ctx[s:s + n] = o[i, :n]

    def _layer_in_one_call(self, index: int, batch: PackedBatch, group: tuple[int, int], groups: dict,
                           h: torch.Tensor, h16: torch.Tensor | None, qkv: torch.Tensor, ctx: torch.Tensor,
                           work: dict[str, torch.Tensor]) -> None:
        """Layer `index` over the rows of `batch`'s sequences group[0] .. group[1] - 1 (whole sequences) in one
        kernel call (kernels.encoder_layer), h (float32 [T, hidden]) and h16 (its bfloat16 copy, or None in the
        float32 form) rewritten there in place; qkv and ctx: the pass's buffers, of the form's dtype. `groups`:
        the pass's group arguments by group (kernels.encoder_layer_rows), made here on a group's first layer."""
        rows = groups.get(group)
        if rows is None:
            first, end = group
            r0, r1 = batch.starts[first], batch.starts[end - 1] + batch.seq_lens[end - 1]
            rows = groups[group] = kernels.encoder_layer_rows(
                torch.tensor([s - r0 for s in batch.starts[first:end]], dtype=torch.int64),
                torch.tensor(batch.seq_lens[first:end], dtype=torch.int64), self.cfg.num_attention_heads,
                1.0 / math.sqrt(self.cfg.head_dim), qkv[r0:r1], ctx[r0:r1],
                *self._feed_forward_buffers(h[r0:r1], None if h16 is None else h16[r0:r1], work))
        kernels.encoder_layer_run(self._layer_weights()[index], rows)

    def _layer_weights(self) -> list[tuple]:
        """Each layer's half of kernels.encoder_layer's arguments (kernels.encoder_layer_weights), made once: the
        packed weights are set for the encoder's life (__init__)."""
        if self._one_call_weights is None:
            self._one_call_weights = [
                kernels.encoder_layer_weights(layer.qkv.packed, layer.qkv.bias, *self._feed_forward_weights(layer))
                for layer in self.layers]
        return self._one_call_weights

    def _feed_forward_in_one_call(self, layer: BertLayer, ctx: torch.Tensor, h: torch.Tensor, h16: torch.Tensor | None,
                                  work: dict[str, torch.Tensor]) -> None:
        """_feed_forward's steps on packed linears in one kernel call (kernels.encoder_ffn), h (float32 [R, hidden],
        the residual) rewritten in place, its intermediates in work's buffers. The bfloat16 form: ctx float32
        or bfloat16 as it is, h16 (h's bfloat16 copy, the next layer's input) rewritten too; the float32 form:
        ctx float32, h16 None."""
        kernels.encoder_ffn(ctx, *self._feed_forward_args(layer, h, h16, work))

    def _feed_forward_args(self, layer: BertLayer, h: torch.Tensor, h16: torch.Tensor | None,
                           work: dict[str, torch.Tensor]) -> tuple:
        """kernels.encoder_ffn's arguments after ctx for `layer` over h's rows (float32 [R, hidden]; h16 its
        bfloat16 copy in the bfloat16 form, None in the float32 form): _feed_forward_weights, then
        _feed_forward_buffers."""
        return *self._feed_forward_weights(layer), *self._feed_forward_buffers(h, h16, work)

    def _feed_forward_weights(self, layer: BertLayer) -> tuple:
        """The feed-forward's packed weights, biases, norms and eps of `layer`, as the kernels take them."""
        return ((layer.attn_out.packed, layer.up.packed, layer.down.packed),
                (layer.attn_out.bias, layer.up.bias, layer.down.bias), (layer.attn_norm, layer.out_norm),
                self.cfg.layer_norm_eps)

    def _feed_forward_buffers(self, h: torch.Tensor, h16: torch.Tensor | None, work: dict[str, torch.Tensor]) -> tuple:
        """h, then the feed-forward's intermediates over h's rows in work's buffers (_buffer): a, g, and in the
        bfloat16 form h16, a16 and y (None each in the float32 form)."""
        rows, hidden, inter = h.shape[0], self.cfg.hidden_size, self.cfg.intermediate_size
        if h16 is None:
            g, a16, y = _buffer(work, "g", rows, inter, torch.float32), None, None
        else:
            g = _buffer(work, "g16", rows, inter, torch.bfloat16)
            a16, y = (_buffer(work, name, rows, hidden, torch.bfloat16) for name in ("a16", "y16"))
        return h, _buffer(work, "a", rows, hidden, torch.float32), g, h16, a16, y

    def _feed_forward_compiled(self, layer: BertLayer, ctx: torch.Tensor, h: torch.Tensor, h16: torch.Tensor) -> None:
        """_feed_forward's steps in the bfloat16 form on linears the kernels could not pack, h (float32 [R, hidden],
        the residual) and h16 (its bfloat16 copy, the next layer's input) rewritten in place: the linears'
        bfloat16 products, the rest in encoder.c. ctx: float32, or bfloat16 as it is."""
        eps = self.cfg.layer_norm_eps
        a = torch.empty_like(h)
        a16 = torch.empty_like(h16)
        kernels.encoder_add_norm(layer.attn_out.product(ctx.to(torch.bfloat16)), layer.attn_out.bias, h,
                                 layer.attn_norm, eps, a, a16)
        g = layer.up.product(a16)
        kernels.encoder_bias_gelu(g, layer.up.bias, g)
        kernels.encoder_add_norm(layer.down.product(g), layer.down.bias, a, layer.out_norm, eps, h, h16)

    def _feed_forward(self, layer: BertLayer, ctx: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        """Post-LayerNorm BERT: LN(x + W_o·ctx), then LN(a + W_down·act(W_up·a)); row-wise."""
        eps, dim = self.cfg.layer_norm_eps, (self.cfg.hidden_size,)
        a = F.layer_norm(layer.attn_out(ctx) + residual, dim, *layer.attn_norm, eps)
        return F.layer_norm(layer.down(self.act(layer.up(a))) + a, dim, *layer.out_norm, eps)


def _buffer(work: dict[str, torch.Tensor], name: str, rows: int, cols: int, dtype: torch.dtype) -> torch.Tensor:
    """The first rows x cols elements of work[name] (grown to fit; remade in another dtype) as a contiguous
    [rows, cols] tensor."""
    buf = work.get(name)
    if buf is None or buf.dtype != dtype or buf.numel() < rows * cols:
        buf = work[name] = torch.empty(rows * cols, dtype=dtype)
    return buf[:rows * cols].view(rows, cols)


def _chunks(t: int, chunk_rows: Callable[[], int], start: int = 0) -> Iterator[slice]:
    """Rows start .. t - 1 in consecutive slices of at most chunk_rows() rows (read before each)."""
    while start < t:
        stop = min(t, start + max(1, chunk_rows()))
        yield slice(start, stop)
        start = stop
