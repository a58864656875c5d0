"""Linear layers in the weight format EngineConfig.weights asks for: float, per-channel int8, or GGUF blocks.

Decode is memory-bound: at batch 1 a step reads every weight once. A PackedLinear
holds at most two forms of its weight: the `compact` one its compact rows use (the
compiled kernels' KernelWeight: int8 per output channel with int16 activations, or
Q4_0 / Q4_1 / Q5_0 / Q5_1 / Q8_0 blocks of 32 or Q4_K / Q5_K / Q6_K super-blocks of 256
with int8 activations; kernels/int8_gemm.c, kernels/block_gemm.c, kernels/kquant_gemm.c),
and the `exact` one the other rows use: the float weight, or,
for a folder that ships blocks, the same blocks with float32 activations (the
reference path: no float copy). Weights are read once per call whatever the batch,
and every kernel is row-independent (a row's result does not depend on the other
rows), so greedy decoding stays batch-invariant. Where the kernels cannot be built,
torch's `_weight_int8pack_mm` (bfloat16 activations) runs int8 decode rows and
block weights are dequantised to float once.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from .. import kernels
from .blocks import BlockStack, BlockWeight, stackable


def quantize_int8(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-output-channel symmetric int8: weight [N, K] -> (int8 [N, K], bfloat16 scales [N]).

    w ≈ q * scale with scale = max|w_row| / 127.
    """
    w = weight.detach().float()
    scale = w.abs().amax(dim=1).clamp(min=1e-8) / 127.0
    q = torch.round(w / scale.unsqueeze(1)).clamp(-127, 127).to(torch.int8)
    return q.contiguous(), scale.to(torch.bfloat16)


class PackedLinear:
    """A fused linear: `__call__(x, compact)` runs the rows of x [T, K] in the slice `compact`
    (None: none) through the compact weight and the rest through the exact one.

    Built from a float weight [N, K] or a BlockWeight (`blocks`, as loaded); `set_format`
    chooses the forms kept. Returns [T, N] in x's dtype. `nbytes` counts what is kept.
    """

    __slots__ = ("weight", "bias", "blocks", "compact", "exact", "q", "scale")

    def __init__(self, weight: torch.Tensor | BlockWeight | BlockStack, bias: torch.Tensor | None = None):
        self.blocks = weight if isinstance(weight, (BlockWeight, BlockStack)) else None
        self.weight = None if self.blocks is not None else weight.detach()
        self.bias = None if bias is None else bias.detach()
        self.compact: kernels.KernelWeight | None = None  # the compact rows' kernel weight
        self.exact: kernels.KernelWeight | None = None  # the blocks with float32 activations
        self.q = self.scale = None  # torch's int8 fallback (no compiled kernels)

    @staticmethod
    def concat(parts: list[torch.Tensor | BlockWeight], bias: torch.Tensor | None = None) -> "PackedLinear":
        """Stack weights along the output channels (q/k/v, gate/up). Parts in one block format
        stay blocks; parts in formats that read the same quantised rows (all K-quants, or all of
        Q4_0 / Q4_1 / Q5_0 / Q5_1 / Q8_0) stay blocks as a BlockStack; other mixes become float32 (set_format
        requantises them as asked)."""
        if all(isinstance(p, BlockWeight) for p in parts):
            if len({p.format for p in parts}) == 1:
                return PackedLinear(BlockWeight.concat(parts), bias)
            if stackable([p.format for p in parts]):
                return PackedLinear(BlockStack.of(parts), bias)
        floats = [p.dequantize() if isinstance(p, BlockWeight) else p for p in parts]
        dtype = next((p.dtype for p in parts if isinstance(p, torch.Tensor)), torch.float32)
        return PackedLinear(torch.cat([f.to(dtype) for f in floats]), bias)

    @property
    def shape(self) -> tuple[int, int]:
        return self.blocks.shape if self.blocks is not None else tuple(self.weight.shape)

    def float_weight(self, dtype: torch.dtype | None = None) -> torch.Tensor:
        """The weight's values as a float tensor (dequantised from its blocks if it has no float copy)."""
        w = self.weight if self.weight is not None else self.blocks.dequantize()
        return w if dtype is None else w.to(dtype)

    def set_format(self, fmt: str | None, compact_all_rows: bool, device: torch.device, dtype: torch.dtype) -> None:
        """Keep the forms this linear runs in. fmt: None (no compact form), "int8", or a block
        format (layers/blocks.py FORMATS, or a BlockStack's: its parts' joined by "+"; blocks as
        loaded are kept when they are in it, else the values are quantised to it). compact_all_rows:
        no row needs the exact form, so none is kept. Without the compiled kernels (or off CPU)
        blocks become float `dtype` weights on `device`, and int8 uses torch's kernel for decode
        rows."""
        use_kernels = device.type == "cpu" and kernels.available()
        blocks = self.blocks
        if fmt not in (None, "int8") and (blocks is None or blocks.format != fmt):
            blocks = BlockWeight.quantize(self.float_weight(torch.float32), fmt)
        if not use_kernels:
            if fmt == "int8" and device.type == "cpu":
                self.q, self.scale = quantize_int8(self.float_weight())
            self.weight = self.float_weight(dtype).to(device) if fmt in (None, "int8") else blocks.dequantize().to(
                device=device, dtype=dtype)
            self.blocks = None
            return
        if fmt == "int8":
            self.compact = kernels.KernelWeight.from_int8(*quantize_int8(self.float_weight()))
        elif fmt is not None:
            self.compact = kernels.KernelWeight.from_blocks(blocks)
        if not compact_all_rows or fmt is None:
            if self.blocks is not None:  # the shipped blocks, read with float32 activations
                self.exact = (self.compact.with_exact(True) if self.compact is not None and self.compact.format ==
                              self.blocks.format else kernels.KernelWeight.from_blocks(self.blocks, exact=True))
            else:
                self.weight = self.weight.to(device=device, dtype=dtype)
        if self.exact is not None or (self.compact is not None and compact_all_rows):
            self.weight = None
        self.blocks = None

    @property
    def nbytes(self) -> int:
        """Bytes of the weight forms kept (shared tensors counted once), the bias included."""
        seen, total = set(), 0
        tensors = [self.weight, self.bias, self.q, self.scale]
        for kw in (self.compact, self.exact):
            if kw is not None:
                tensors += kw.tensors()
        for t in tensors:
            if t is not None and t.data_ptr() not in seen:
                seen.add(t.data_ptr())
                total += t.numel() * t.element_size()
        return total

    def _rest(self, x: torch.Tensor) -> torch.Tensor:
        """The rows outside the compact slice: the exact form, or the compact one where it is the only
        form kept (every row uses it then, e.g. prompt logprobs' rows)."""
        kernel = self.exact if self.exact is not None else (self.compact if self.weight is None else None)
        if kernel is not None:
            y = kernels.weight_linear(x.float(), kernel).to(x.dtype)
            return y if self.bias is None else y + self.bias
        return F.linear(x, self.weight, self.bias)

    def __call__(self, x: torch.Tensor, compact: slice | None = None) -> torch.Tensor:
        t = x.shape[0]
        start, stop, _ = compact.indices(t) if compact is not None else (0, 0, 1)
        if (self.compact is None and self.q is None) or stop <= start:
            return self._rest(x)
        rows = x[start:stop]
        if self.compact is not None:
            mid = kernels.weight_linear(rows.float(), self.compact)
        else:
            mid = torch.ops.aten._weight_int8pack_mm(rows.to(torch.bfloat16).contiguous(), self.q, self.scale)
        mid = mid.to(x.dtype)
        if self.bias is not None:
            mid = mid + self.bias
        if start == 0 and stop == t:
            return mid
        parts = [self._rest(x[:start])] if start else []
        parts.append(mid)
        if stop < t:
            parts.append(self._rest(x[stop:]))
        return torch.cat(parts)



class EncoderLinear:
    """An encoder's linear (y = x·Wᵀ + b over x float32 [T, K] -> float32 [T, N]) in one of two forms.

    "float32": the checkpoint's values. "bfloat16": the weight kept in bfloat16 (half the bytes) and each
    call's rows rounded to bfloat16, the products summed in float32 (AVX-512 BF16's dot products), the bias
    added in float32. The encoder's rows come in thousands a call, where the work is arithmetic, not weight
    reads, so the decode kernels' forms (PackedLinear) do not fit: at 2,048 rows of a 1536x384 weight on
    the AVX-512 VNNI machine (2 threads) F.linear took 42 ms, bfloat16 16 ms, PackedLinear's int8 136 ms
    and Q8_0 94 ms, and int8 with dynamically quantised activations (torch's quantized::linear_dynamic,
    one scale a call) 9.5 ms but all-MiniLM-L6-v2's embeddings then fell to cosine 0.95 against
    sentence-transformers' (int8 with int16 activations: 0.9985; bfloat16: 0.99998).

    Batch invariance: once `pack()`ed (the compiled kernels built), either form runs
    kernels.encoder_linear, where each output element is one chain of products in K's order, so a row's
    result is bitwise the same whatever other rows share the call and however many there are. torch's
    F.linear and oneDNN choose their kernel, and their split of K over threads, by the row count (a
    text's embedding moved by up to 4e-4 between a pass of 1 text and one of 8): they serve only where
    the kernels are not built. Packed, either form can add the bias and apply the erf GELU to each sum as
    the kernel stores it (`product(bias=True, gelu=True)`: the BERT encoder's compiled steps).
    """

    __slots__ = ("weight", "bias", "packed", "_shape")

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None):
        self.weight = weight.detach().float().contiguous()
        self.bias = None if bias is None else bias.detach().float().contiguous()
        self.packed = None  # the weight in kernels.encoder_pack's layout (pack()), or None
        self._shape = tuple(self.weight.shape)

    @property
    def shape(self) -> tuple[int, int]:
        return self._shape

    def set_format(self, fmt: str) -> None:
        """Keep the weight as "float32" or "bfloat16" (before `pack`). Raises ValueError for another
        format."""
        if fmt not in ("float32", "bfloat16"):
            raise ValueError(f"encoder linears are float32 or bfloat16, got {fmt!r}")
        self.weight = self.weight.to(torch.float32 if fmt == "float32" else torch.bfloat16)

    def pack(self) -> bool:
        """Move the weight into the batch-invariant kernels' layout (kernels.encoder_pack: 16 output
        columns a group) and drop the plain copy. Returns False, keeping the plain weight (torch's
        F.linear), where the kernels are not built or the shape has no such layout (N not a multiple of
        16, or an odd K in bfloat16)."""
        if self.packed is not None:
            return True
        n, k = self._shape
        if not kernels.available() or n % 16 or (self.weight.dtype == torch.bfloat16 and k % 2):
            return False
        self.packed = kernels.encoder_pack(self.weight)
        self.weight = None
        return True

    @property
    def dtype(self) -> torch.dtype:
        """The kept weight's dtype: the form's."""
        return (self.packed if self.packed is not None else self.weight).dtype

    @property
    def nbytes(self) -> int:
        """Bytes of the kept weight and bias."""
        kept = self.packed if self.packed is not None else self.weight
        return kept.numel() * kept.element_size() + (0 if self.bias is None else self.bias.numel() * 4)

    def product(self, x: torch.Tensor, out: torch.Tensor | None = None, *, bias: bool = False,
                gelu: bool = False) -> torch.Tensor:
        """x · Wᵀ in the weight's dtype: x [T, K] of that dtype (float32, or bfloat16: the sums in float32, the
        result rounded to bfloat16), into `out` [T, N] of that dtype when given (rows may be strided), returned.
        A packed weight can add the float32 bias (bias=True) and then apply the erf GELU (gelu=True) to each
        sum as it is stored (bfloat16: before the rounding), each row's bits still its own
        (kernels.encoder_linear). Raises ValueError for bias or gelu on a plain (unpacked) weight, or bias=True
        on a linear without one."""
        if bias and self.bias is None:
            raise ValueError("this linear has no bias to add")
        if self.packed is not None:
            return kernels.encoder_linear(x, self.packed, self._shape[0], self.bias if bias else None, gelu, out)
        if bias or gelu:
            raise ValueError("a plain weight's product adds no bias and applies no activation")
        if out is None:
            return F.linear(x, self.weight)
        return torch.matmul(x, self.weight.t(), out=out)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """x · Wᵀ + b: x float32 [T, K] -> float32 [T, N]. A packed float32 weight adds the bias in the kernel's
        store; bfloat16 adds it in float32 to the rounded product."""
        if self.packed is None and self.weight.dtype == torch.float32:
            return F.linear(x, self.weight, self.bias)
        if self.packed is not None and self.packed.dtype == torch.float32:
            return self.product(x, bias=self.bias is not None)
        y = self.product(x.to(self.dtype)).float()
        return y if self.bias is None else y + self.bias


def native_bfloat16() -> bool:
    """Whether this CPU multiplies bfloat16 natively (AVX-512 BF16 or AMX): there EncoderLinear's
    bfloat16 form is the fast one; elsewhere (AVX2 only) bfloat16 GEMMs are several times slower
    than float32's."""
    cpu = getattr(torch, "cpu", None)
    checks = [getattr(cpu, name, None) for name in ("_is_avx512_bf16_supported", "_is_amx_tile_supported")]
    return any(check() for check in checks if check is not None)
