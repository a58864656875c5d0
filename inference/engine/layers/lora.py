"""Resident LoRA adapters: the slots, the low-rank update of every fused linear, and each step's row groups.

Up to `max_loras` adapters are resident at once, each in a slot. Every sequence of a
batch names its slot (or none), and one forward serves them all (Punica / S-LoRA): after
each fused linear (q/k/v, o, gate/up, down), the rows of each slot get that slot's update
`y[:, part] += (x Aᵀ) Bt` of every projection the adapter targets. Rows on the torch path
(prefill chunks, float weights, CUDA) take one gathered update per row group here; rows
on the compiled decode layers take it inside the C call (kernels/lora.c), one row at a
time. Both are row-independent, so a row gives the same result in any batch.
"""
from __future__ import annotations

import ctypes

import torch

from ..lora import LoraAdapter, module_shape

# (block, fused linear attribute, its projections in output order), in the order of kernels/lora.h.
LINEARS = (("self_attn", "qkv", ("q_proj", "k_proj", "v_proj")), ("self_attn", "out", ("o_proj",)),
           ("mlp", "gate_up", ("gate_proj", "up_proj")), ("mlp", "down", ("down_proj",)))


class _CPart(ctypes.Structure):
    _fields_ = [(name, ctypes.c_long) for name in ("K", "N", "offset", "y_stride")] + [
        (name, ctypes.c_void_p) for name in ("rank", "A", "Bt")]


class _CLayer(ctypes.Structure):
    """kernels/lora.h metrale_lora_layer."""
    _fields_ = [("num_parts", ctypes.c_int * len(LINEARS)), ("part", (_CPart * 3) * len(LINEARS))]


def _c_layer(linears: list[list["_Part"]]) -> _CLayer:
    """One layer's struct for the compiled decode layer; it points into the parts' int64 arrays."""
    struct = _CLayer()
    for i, parts in enumerate(linears):
        struct.num_parts[i] = len(parts)
        for j, p in enumerate(parts):
            struct.part[i][j] = _CPart(p.k, p.n, p.offset, p.y_stride, p.rank.data_ptr(), p.a_ptr.data_ptr(),
                                       p.bt_ptr.data_ptr())
    return struct


class _Part:
    """One projection of a fused linear across the slots: its factors per slot and, for the C path,
    int64 [slots] arrays of ranks and factor addresses."""

    __slots__ = ("module", "k", "n", "offset", "y_stride", "factors", "rank", "a_ptr", "bt_ptr")

    def __init__(self, module: str, k: int, n: int, offset: int, y_stride: int, slots: int):
        self.module, self.k, self.n, self.offset, self.y_stride = module, k, n, offset, y_stride
        self.factors: list[tuple[torch.Tensor, torch.Tensor] | None] = [None] * slots
        self.rank = torch.zeros(slots, dtype=torch.int64)
        self.a_ptr = torch.zeros(slots, dtype=torch.int64)
        self.bt_ptr = torch.zeros(slots, dtype=torch.int64)


class _StepRows:
    """The rows of this step's torch path by slot: [(slot, int64 row indices)], empty when none."""

    __slots__ = ("groups",)

    def __init__(self):
        self.groups: list[tuple[int, torch.Tensor]] = []


class LoraLinear:
    """A fused linear (layers/linear.PackedLinear) plus the updates of its projections for the rows
    of resident adapters. `__call__(x [T, K], int8)` -> [T, N] like the base; every other attribute
    is the base's (the int8 copies the compiled layers read)."""

    __slots__ = ("base", "parts", "rows")

    def __init__(self, base, parts: list[_Part], rows: _StepRows):
        self.base, self.parts, self.rows = base, parts, rows

    def __getattr__(self, name):
        if name in LoraLinear.__slots__:
            raise AttributeError(name)
        return getattr(self.base, name)

    def __call__(self, x: torch.Tensor, int8: slice | None = None) -> torch.Tensor:
        y = self.base(x, int8)
        for slot, rows in self.rows.groups:
            xs = x[rows]
            for part in self.parts:
                factors = part.factors[slot]
                if factors is not None:
                    a, bt = factors
                    y[rows, part.offset:part.offset + part.n] += (xs @ a.t()) @ bt
        return y


class LoraSlots:
    """The resident adapters of one model, installed into its fused linears (and its compiled
    decode layers when `fused` is given).

    by_name: the adapters new requests may use. A removed adapter keeps its slot until
    `collect` sees no live sequence on it (in-flight requests finish on it), then the slot and
    its tensors are freed for good.
    """

    def __init__(self, model, max_loras: int, fused=None):
        cfg = model.config
        self.cfg = cfg
        self.max_loras = max_loras
        param = next(model.parameters())
        self.device, self.dtype = param.device, param.dtype
        self.fused = fused
        self.slots: list[LoraAdapter | None] = [None] * max_loras
        self.by_name: dict[str, LoraAdapter] = {}
        self.retired: set[int] = set()
        self.rows = _StepRows()
        self.layers: list[list[list[_Part]]] = []  # [layer][linear] -> parts
        self._structs = []
        for index, layer in enumerate(model.model.layers):
            linears = []
            for block, attr, modules in LINEARS:
                owner = getattr(layer, block)
                shapes = [module_shape(cfg, m) for m in modules]
                y_stride = sum(n for _, n in shapes)
                parts, offset = [], 0
                for module, (k, n) in zip(modules, shapes):
                    parts.append(_Part(module, k, n, offset, y_stride, max_loras))
                    offset += n
                setattr(owner, attr, LoraLinear(getattr(owner, attr), parts, self.rows))
                linears.append(parts)
            self.layers.append(linears)
            if fused is not None:
                struct = _c_layer(linears)
                self._structs.append(struct)
                fused.layers[index].lora = ctypes.addressof(struct)

    @property
    def num_bytes(self) -> int:
        """Bytes of adapter factors held in the slots (the retired ones still draining included)."""
        return sum(a.num_bytes for a in self.slots if a is not None)

    def add(self, adapter: LoraAdapter, replace: bool = False) -> None:
        """Make `adapter` resident in a free slot and the one new requests of its name use.

        With `replace`, an adapter of the same name is removed (its requests in flight finish on
        it). Raises ValueError when the name is loaded and not `replace`, or no slot is free.
        """
        old = self.by_name.get(adapter.name)
        if old is not None and not replace:
            raise ValueError(f"the adapter {adapter.name!r} is already loaded")
        free = [s for s, a in enumerate(self.slots) if a is None]
        if not free:
            raise ValueError(f"all {self.max_loras} adapter slots (METRALE_MAX_LORAS) are in use")
        slot = free[0]
        for layer, linears in enumerate(self.layers):
            for parts in linears:
                for part in parts:
                    pair = adapter.modules.get((layer, part.module))
                    if pair is None:
                        continue
                    a, bt = (t.to(self.device, self.dtype).contiguous() for t in pair)
                    part.factors[slot] = (a, bt)
                    if self.fused is not None:
                        part.rank[slot] = a.shape[0]
                        part.a_ptr[slot], part.bt_ptr[slot] = a.data_ptr(), bt.data_ptr()
        adapter.slot = slot
        self.slots[slot] = adapter
        self.by_name[adapter.name] = adapter
        if old is not None:
            self.retired.add(old.slot)

    def remove(self, name: str) -> LoraAdapter:
        """Stop new requests from using `name`; its slot is freed by `collect` once its requests end.
        Raises KeyError for a name that is not loaded."""
        adapter = self.by_name.pop(name)
        self.retired.add(adapter.slot)
        return adapter

    def collect(self, live_slots: set[int]) -> None:
        """Free every retired slot that no live sequence uses: its factors are dropped for good."""
        for slot in sorted(self.retired - live_slots):
            for linears in self.layers:
                for parts in linears:
                    for part in parts:
                        part.factors[slot] = None
                        part.rank[slot] = part.a_ptr[slot] = part.bt_ptr[slot] = 0
            self.slots[slot] = None
            self.retired.discard(slot)

    def begin_step(self, spans, num_rows: int, fused_rows: int) -> None:
        """Set this step's row groups. spans: (sequence, its first packed row, its rows: the tokens it
        computes and any draft tokens) per batch item; the first `fused_rows` of the `num_rows`
        packed rows run on the compiled layers, the rest on the torch path."""
        self.rows.groups = []
        if self.fused is not None:
            self.fused.lora_slots = None
        if not any(seq.lora is not None for seq, _, _ in spans):
            return
        row_slots = [-1] * num_rows
        for seq, start, n in spans:
            if seq.lora is not None:
                row_slots[start:start + n] = [seq.lora.slot] * n
        if fused_rows and any(s >= 0 for s in row_slots[:fused_rows]):
            self.fused.lora_slots = torch.tensor(row_slots[:fused_rows], dtype=torch.int64)
        rest = row_slots[fused_rows:]
        for slot in sorted(set(rest) - {-1}):
            rows = [i for i, s in enumerate(rest) if s == slot]
            self.rows.groups.append((slot, torch.tensor(rows, dtype=torch.int64, device=self.device)))
