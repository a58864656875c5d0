"""RMSNorm as transformers' LlamaRMSNorm computes it (float32 statistics, cast back)."""
import torch
from torch import nn


class RMSNorm(nn.Module):
    """y = weight * x / sqrt(mean(x^2) + eps), statistics in float32.

    x: [..., dim] in the model dtype; returns the same shape and dtype.
    Source: Zhang & Sennrich 2019; transformers LlamaRMSNorm (weight applied after
    the cast back to the input dtype).
    """

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def factor(self) -> torch.Tensor:
        """The per-element factor of the normalised values (y = factor * x / rms), float32 [dim],
        contiguous: what the compiled decode step multiplies by (layers/fused_decode.py)."""
        return self.weight.detach().float().contiguous()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * h.to(dtype)
