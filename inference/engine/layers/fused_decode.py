"""Decode rows through whole decoder layers in one compiled call each (kernels/decode_layer.c): the
Llama family's layers and Gemma 3's (its output norms, GELU-tanh, sliding-window layers).

At small batches a decode step is dominated by dispatching ~40 small torch ops per
layer, not by arithmetic. `FusedDecoder` hands each layer's decode rows to one C
call that does norm, the GEMMs (int8 or GGUF blocks), RoPE, the KV write, paged
attention and the MLP. It is used for float32 models on CPU whose decode rows' weights
are all kernel weights (compact ones, or blocks read exactly) with the compiled kernels
available. When prompt rows use the same weights, the rows of prompt chunks with
short contexts go the same way, each prompt token attending like a decode row of
length position + 1 (model_runner.FUSED_PREFILL_MAX_CONTEXT); longer ones keep the
torch path (flash SDPA).
"""
from __future__ import annotations

import ctypes

import torch

from .. import kernels

_f = ctypes.POINTER(ctypes.c_float)
_P = ctypes.c_void_p


class _Layer(ctypes.Structure):
    """kernels/decode_layer.h metrale_layer (its layout checked at load: kernels/layout.py)."""
    _fields_ = [("ln1", _P), ("ln2", _P)] + [(name, kernels.KernelWeight.Struct) for name in (
        "qkv", "o", "gate_up", "down")] + [(name, _P) for name in ("qkv_bias", "q_norm", "k_norm", "k_cache", "v_cache",
                                                                   "lora", "post_attn_norm", "post_ff_norm")] + [
        ("sliding", ctypes.c_int)]


class _View(ctypes.Structure):
    """kernels/decode_layer.h metrale_view: what a layer attends through (the full layers', the window layers')."""
    _fields_ = [(name, _P) for name in ("cos", "sin", "slots", "block_tables", "seq_lens", "seq_starts")] + [
        ("width", ctypes.c_long)]


# decode_layer.c ACT_*: the gated MLP's activation by the config's hidden_activation.
ACTIVATION_CODES = {"silu": 0, "gelu_pytorch_tanh": 1}


def decode_weight(lin, compact: bool) -> kernels.KernelWeight | None:
    """The kernel weight a linear's decode rows use: its compact one when the model's decode rows
    are compact, else its exact blocks (or None: float weights the kernels do not read)."""
    return lin.compact if compact else lin.exact


class _Step(ctypes.Structure):
    """kernels/decode_layer.h metrale_step."""
    _fields_ = [("M", ctypes.c_long)] + [
        (name, ctypes.c_int) for name in ("hidden", "n_heads", "n_kv", "head_dim", "inter", "block_size",
                                          "kv_dtype", "nthreads", "act")] + [
        ("eps", ctypes.c_float), ("scale", ctypes.c_float), ("full", _View), ("window", _View)] + [
        (name, _P) for name in ("positions", "scratch", "lora_slots", "final_norm", "head", "logit_rows")] + [
        ("n_logit_rows", ctypes.c_long), ("vocab", ctypes.c_long), ("logits", _P)]


def _ptr(t: torch.Tensor | None) -> int | None:
    return None if t is None else t.data_ptr()


class FusedDecoder:
    """Runs decode (and short prompts') rows through every layer of a fused Llama-family or Gemma 3
    model with kernel weights.

    Built once per model and KV cache set; `run(x, positions, meta)` updates x (float32
    [D, hidden], the embedded decode rows) in place through all layers, writing their
    K/V at meta.slot_mapping[:D] (a sliding-window layer's at meta.window's slots when it has
    them). Each layer names its norms (`fused_norms`) and each norm its factor (`factor()`:
    Gemma's 1 + weight, computed here once). Raises RuntimeError if the kernels are unavailable.
    """

    def __init__(self, model, kv_caches: list[tuple[torch.Tensor, torch.Tensor]]):
        lib = kernels.library()
        if lib is None:
            raise RuntimeError("CPU kernels are unavailable")
        self._run_layers = lib.metrale_decode_layers
        self._run_layers.argtypes = [ctypes.POINTER(_Layer), ctypes.c_long, ctypes.POINTER(_Step), _P]
        self._run_layers.restype = None
        self._scratch_floats = lib.metrale_decode_scratch_floats
        self._scratch_floats.argtypes = [ctypes.POINTER(_Step)]
        self._scratch_floats.restype = ctypes.c_long
        cfg = model.config
        self.cfg = cfg
        # The full layers' RoPE tables and the window layers' (their own base, Gemma 3); grown tables
        # are pointed at again (_point_rope).
        self.rotary = model.rotary
        self.rotary_local = getattr(model, "rotary_local", model.rotary)
        self._keep = []  # tensors the structs point into
        layers = []
        compact = model.compact_decode
        for layer, (k_cache, v_cache) in zip(model.model.layers, kv_caches):
            attn, mlp = layer.self_attn, layer.mlp
            norms = layer.fused_norms()
            tensors = dict(
                **{name: None if norm is None else norm.factor() for name, norm in norms.items()},
                qkv_bias=None if attn.qkv.bias is None else attn.qkv.bias.float().contiguous(),
                q_norm=None if attn.q_norm is None else attn.q_norm.factor(),
                k_norm=None if attn.k_norm is None else attn.k_norm.factor(),
                k_cache=k_cache, v_cache=v_cache)
            weights = {name: decode_weight(lin, compact).struct for name, lin in (
                ("qkv", attn.qkv), ("o", attn.out), ("gate_up", mlp.gate_up), ("down", mlp.down))}
            self._keep.append(tensors)
            layers.append(_Layer(**{k: _ptr(v) for k, v in tensors.items()}, **weights, sliding=int(attn.sliding)))
        # One array for the one call a step makes; layers/lora.LoraSlots writes its elements' `lora`.
        self.layers = (_Layer * len(layers))(*layers)
        self.kv_dtype = kernels.kv_dtype_code(kv_caches[0][0].dtype)
        self.act = ACTIVATION_CODES[cfg.hidden_activation]
        self.final_norm = model.model.norm.factor()
        self.head = decode_weight(model.head, compact)
        self._point_rope()
        # layers/lora.LoraSlots points each layer's `lora` at its adapters and sets this per step:
        # int64 [D] the rows' adapter slots (-1: none), or None when no row has an adapter.
        self.lora_slots: torch.Tensor | None = None
        # The step's scratch and logits, kept from step to step (grown, never shrunk): fresh pages of
        # a new allocation each step cost a fault per 4 KiB on first touch (32 rows of a 262,144-token
        # vocabulary: 33.5 MB, ~5 ms a step here).
        self._buffers: dict[str, torch.Tensor] = {}

    @staticmethod
    def supports(model, kv_dtype: torch.dtype) -> bool:
        """True for a fused float32 CPU model whose decode rows' linears all have kernel weights."""
        if not kernels.available() or not kernels.supports_kv_dtype(kv_dtype):
            return False
        if not getattr(model, "fused_decode", False):  # a layer the compiled step does not compute
            return False
        if getattr(getattr(model, "config", None), "hidden_activation", "silu") not in ACTIVATION_CODES:
            return False
        if next(model.parameters()).dtype != torch.float32 or next(model.parameters()).device.type != "cpu":
            return False
        layers = getattr(getattr(model, "model", None), "layers", None)
        compact = getattr(model, "compact_decode", False)
        if not layers or model.head is None or decode_weight(model.head, compact) is None:
            return False
        return all(lin is not None and decode_weight(lin, compact) is not None for layer in layers
                   for lin in (layer.self_attn.qkv, layer.self_attn.out, layer.mlp.gate_up, layer.mlp.down))

    def _point_rope(self) -> None:
        """(Re)read the RoPE tables' float32 rows (after RotaryEmbedding grew them)."""
        self.rope = [(r.cos.float().contiguous(), r.sin.float().contiguous()) for r in (self.rotary, self.rotary_local)]

    def _cover(self, positions: torch.Tensor) -> None:
        """Grow the RoPE tables that do not reach the step's last position yet."""
        if any(r.cos.shape[0] < r.max_positions for r in (self.rotary, self.rotary_local)):
            last = int(positions.max())
            if any(r.cover(last) for r in (self.rotary, self.rotary_local)):
                self._point_rope()

    @staticmethod
    def _view(rope, meta, d: int, keep: list) -> _View:
        """The view of the step's first d rows through `meta` (a layer group's AttentionMetadata):
        with a window, each row's table cut to its window (its keys [window_starts, window_lens))."""
        tables = meta.decode_block_tables.contiguous()
        windowed = meta.window_lens is not None
        lens = (meta.window_lens if windowed else meta.decode_lens).contiguous()
        starts = meta.window_starts.contiguous() if windowed else None
        slots = meta.slot_mapping[:d].contiguous()
        keep += [tables, lens, starts, slots]
        return _View(cos=rope[0].data_ptr(), sin=rope[1].data_ptr(), slots=slots.data_ptr(),
                     block_tables=tables.data_ptr(), seq_lens=lens.data_ptr(), seq_starts=_ptr(starts),
                     width=tables.shape[1])

    def _buffer(self, name: str, floats: int) -> torch.Tensor:
        """The first `floats` floats of the kept buffer `name` (float32, 1-D), grown to fit."""
        buf = self._buffers.get(name)
        if buf is None or buf.numel() < floats:
            buf = self._buffers[name] = torch.empty(floats, dtype=torch.float32)
        return buf[:floats]

    def run(self, x: torch.Tensor, positions: torch.Tensor, meta, logit_rows: list[int] | None = None
            ) -> torch.Tensor | None:
        """Run the decode rows through every layer and the final norm, in place; with `logit_rows`,
        also the LM head (its decode weight) on those rows.

        x: float32 [D, hidden], contiguous (the embedded decode rows), normalised on return;
        positions: int64 [D]; meta: the step's AttentionMetadata (its first D slots, decode block
        tables and decode_lens are read; the sliding-window layers read meta.window's where it is
        set). K/V of the new tokens are written into the layers'
        caches. logit_rows: indices into x's rows. Returns float32 [len(logit_rows), vocab], or None
        without logit_rows: a view of a buffer the next run overwrites (copy what must outlive it).
        """
        cfg = self.cfg
        d = x.shape[0]
        positions = positions.contiguous()
        self._cover(positions)
        keep = []
        full = self._view(self.rope[0], meta, d, keep)
        window = full if meta.window is None and self.rotary_local is self.rotary else self._view(
            self.rope[1], meta.window if meta.window is not None else meta, d, keep)
        step = _Step(M=d, hidden=cfg.hidden_size, n_heads=cfg.num_attention_heads,
                     n_kv=cfg.num_key_value_heads, head_dim=cfg.head_dim, inter=cfg.intermediate_size,
                     block_size=self._keep[0]["k_cache"].shape[1], kv_dtype=self.kv_dtype,
                     nthreads=torch.get_num_threads(), act=self.act, eps=cfg.rms_norm_eps, scale=cfg.attention_scale,
                     full=full, window=window, positions=positions.data_ptr(),
                     lora_slots=_ptr(self.lora_slots), final_norm=self.final_norm.data_ptr())
        logits = rows = None
        if logit_rows:
            rows = torch.tensor(logit_rows, dtype=torch.int64)
            vocab = self.head.shape[0]
            logits = self._buffer("logits", len(logit_rows) * vocab).view(len(logit_rows), vocab)
            step.head = ctypes.addressof(self.head.struct)
            step.logit_rows, step.n_logit_rows = rows.data_ptr(), len(logit_rows)
            step.vocab, step.logits = vocab, logits.data_ptr()
        scratch = self._buffer("scratch", self._scratch_floats(ctypes.byref(step)))
        step.scratch = scratch.data_ptr()
        self._run_layers(self.layers, len(self.layers), ctypes.byref(step), x.data_ptr())
        return logits
