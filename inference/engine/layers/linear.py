"""Linear layers with an optional weight-only int8 copy for decode rows.

Decode is memory-bound: at batch 1 a step reads every weight once. An int8 copy
(symmetric, one scale per output channel, as gpt-fast's int8 weight-only mode) is
a quarter of the float32 bytes. The compiled kernel in engine/kernels (float32
activations and sums, weights converted exactly in registers, read once per step
whatever the batch) runs it; where it cannot be built, torch's `_weight_int8pack_mm`
(bfloat16 activations) does. Both are row-independent: a row's result does not
depend on the other rows in the batch, so greedy decoding stays batch-invariant.
Prefill rows keep the full-precision weights (compute-bound; float32 GEMMs are
faster there on CPUs without bf16 arithmetic).
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
    """A weight (and optional bias) plus its optional int8 copy; `__call__(x, n_int8)` runs the
    first n_int8 rows of x [T, K] through the int8 copy and the rest through the full weight.

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

    def __call__(self, x: torch.Tensor, n_int8: int = 0) -> torch.Tensor:
        if self.q is None or n_int8 <= 0:
            return F.linear(x, self.weight, self.bias)
        if self.packed:
            head = kernels.int8_linear(x[:n_int8].float(), self.q, self.scale)
        else:
            head = torch.ops.aten._weight_int8pack_mm(x[:n_int8].to(torch.bfloat16).contiguous(), self.q, self.scale)
        head = head.to(x.dtype)
        if self.bias is not None:
            head = head + self.bias
        if n_int8 >= x.shape[0]:
            return head
        return torch.cat([head, F.linear(x[n_int8:], self.weight, self.bias)])
