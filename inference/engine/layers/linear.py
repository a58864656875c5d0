"""Linear layers with an optional weight-only int8 copy.

Decode is memory-bound: at batch 1 a step reads every weight once. An int8 copy
(symmetric, one scale per output channel, as gpt-fast's int8 weight-only mode) is
a quarter of the float32 bytes. The compiled kernel in engine/kernels/int8_gemm.c
runs it: each activation row quantised to int16 with its own scale, products summed
exactly in int32 (vpmaddwd), weights read once per call whatever the batch. That
is also about twice MKL's float32 GEMM rate on AVX2 CPUs, so prefill rows may use
the int8 copy too (EngineConfig.prefill_weights). Where the kernels cannot be
built, torch's `_weight_int8pack_mm` (bfloat16 activations) runs decode rows and
prefill keeps the full-precision weights. Both kernels are row-independent: a row's
result does not depend on the other rows in the batch, so greedy decoding stays
batch-invariant.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from .. import kernels


def quantize_int8(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-output-channel symmetric int8: weight [N, K] -> (int8 [N, K], bfloat16 scales [N]).

    w ≈ q * scale with scale = max|w_row| / 127.
    """
    w = weight.detach().float()
    scale = w.abs().amax(dim=1).clamp(min=1e-8) / 127.0
    q = torch.round(w / scale.unsqueeze(1)).clamp(-127, 127).to(torch.int8)
    return q.contiguous(), scale.to(torch.bfloat16)


class PackedLinear:
    """A weight (and optional bias) plus its optional int8 copy; `__call__(x, int8)` runs the rows
    of x [T, K] in the slice `int8` (None: none) through the int8 copy and the rest through the
    full weight.

    Returns [T, N] in x's dtype. With the compiled kernels, `q` holds the weight packed by
    kernels.int8_pack and `scale` is float32; otherwise `q` is int8 [N, K] and `scale`
    bfloat16 for `_weight_int8pack_mm`.
    """

    __slots__ = ("weight", "bias", "q", "scale", "packed")

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None):
        self.weight = weight.detach()
        self.bias = None if bias is None else bias.detach()
        self.q = self.scale = None
        self.packed = False

    def enable_int8(self) -> None:
        if self.weight.device.type != "cpu":
            return  # the int8 kernels are used on CPU only; CUDA keeps the model dtype
        self.q, self.scale = quantize_int8(self.weight)
        if kernels.available():
            self.q, self.scale, self.packed = kernels.int8_pack(self.q), self.scale.float(), True

    def __call__(self, x: torch.Tensor, int8: slice | None = None) -> torch.Tensor:
        t = x.shape[0]
        start, stop, _ = int8.indices(t) if int8 is not None else (0, 0, 1)
        if self.q is None or stop <= start:
            return F.linear(x, self.weight, self.bias)
        rows = x[start:stop]
        if self.packed:
            mid = kernels.int8_linear(rows.float(), self.q, self.scale)
        else:
            mid = torch.ops.aten._weight_int8pack_mm(rows.to(torch.bfloat16).contiguous(), self.q, self.scale)
        mid = mid.to(x.dtype)
        if self.bias is not None:
            mid = mid + self.bias
        if start == 0 and stop == t:
            return mid
        parts = [F.linear(x[:start], self.weight, self.bias)] if start else []
        parts.append(mid)
        if stop < t:
            parts.append(F.linear(x[stop:], self.weight, self.bias))
        return torch.cat(parts)
