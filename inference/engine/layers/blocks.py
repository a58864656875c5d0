"""GGUF weight blocks (Q4_0, Q4_1, Q8_0) as torch tensors: from a GGUF file's bytes, from floats, to floats, in safetensors.

A block is 32 consecutive weights of one output channel with float16 scales
(ggml's formats, gguf-py's dequantize rules): Q4_0 w = d * (q - 8), q in 0..15;
Q4_1 w = d * q + m; Q8_0 w = q * d, q an int8. A BlockWeight keeps them as three
tensors: `codes` (Q4: uint8 [N, K / 2], each block's 16 bytes as in the file, byte i
holding weight i in its low nibble and weight i + 16 in its high one; Q8_0: int8
[N, K]), `scales` float16 [N, K / 32] and, for Q4_1, `mins` float16 [N, K / 32].
In a model folder they are the safetensors tensors `<name>.qweight`, `<name>.scales`
and `<name>.mins` for the HF weight `<name>.weight`, listed in config.json under
`quantization_config` (QUANT_METHOD; see `quantization_config`).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

BLOCK = 32
FORMATS = ("q4_0", "q4_1", "q8_0")
QUANT_METHOD = "gguf_blocks"
# Bytes of one block in a GGUF file: the float16 scale (and min), then the codes.
_GGUF_BLOCK_BYTES = {"q4_0": 18, "q4_1": 20, "q8_0": 34}


class BlockFormatError(ValueError):
    """A tensor cannot be held in (or read from) the block format asked for."""


@dataclass(slots=True)
class BlockWeight:
    """One weight [N, K] in a block format (the module docstring gives the tensors' layout)."""

    format: str
    codes: torch.Tensor
    scales: torch.Tensor
    mins: torch.Tensor | None = None

    @property
    def shape(self) -> tuple[int, int]:
        """(N, K): output channels and input features."""
        return self.scales.shape[0], self.scales.shape[1] * BLOCK

    @property
    def nbytes(self) -> int:
        """Bytes of the codes and scales (what a GEMM over this weight reads)."""
        return sum(t.numel() * t.element_size() for t in (self.codes, self.scales, self.mins) if t is not None)

    @classmethod
    def from_gguf(cls, raw: np.ndarray, fmt: str) -> "BlockWeight":
        """From a GGUF tensor's bytes: uint8 [N, K / 32 * block bytes] (gguf-py's ReaderTensor.data)."""
        if fmt not in _GGUF_BLOCK_BYTES:
            raise BlockFormatError(f"{fmt!r} is not a block format; one of {', '.join(FORMATS)}")
        size = _GGUF_BLOCK_BYTES[fmt]
        raw = np.ascontiguousarray(raw, dtype=np.uint8)
        if raw.ndim != 2 or raw.shape[1] % size:
            raise BlockFormatError(f"{fmt} data of shape {raw.shape} is not whole blocks of {size} bytes")
        blocks = raw.reshape(raw.shape[0], -1, size)
        scales = torch.from_numpy(blocks[..., 0:2].copy().view(np.float16)[..., 0])
        if fmt == "q8_0":
            codes = torch.from_numpy(blocks[..., 2:].copy().view(np.int8).reshape(raw.shape[0], -1))
            return cls(fmt, codes, scales)
        start = 4 if fmt == "q4_1" else 2
        codes = torch.from_numpy(blocks[..., start:].copy().reshape(raw.shape[0], -1))
        mins = torch.from_numpy(blocks[..., 2:4].copy().view(np.float16)[..., 0]) if fmt == "q4_1" else None
        return cls(fmt, codes, scales, mins)

    @classmethod
    def quantize(cls, weight: torch.Tensor, fmt: str) -> "BlockWeight":
        """Quantise a float weight [N, K] (K a multiple of 32) to `fmt` with gguf-py's quantisers
        (bit-exact with ggml's reference ones). Raises BlockFormatError for another K."""
        from gguf import GGMLQuantizationType as QType
        from gguf.quants import quantize

        n, k = weight.shape
        if k % BLOCK:
            raise BlockFormatError(f"a weight with {k} input features is not whole blocks of {BLOCK}")
        data = quantize(weight.detach().float().cpu().numpy(), getattr(QType, fmt.upper()))
        return cls.from_gguf(data.reshape(n, -1), fmt)

    def dequantize(self) -> torch.Tensor:
        """float32 [N, K]: the values gguf-py's dequantize gives (the same float32 operations)."""
        n, k = self.shape
        d = self.scales.float().unsqueeze(-1)
        if self.format == "q8_0":
            return (self.codes.float().view(n, -1, BLOCK) * d).reshape(n, k)
        packed = self.codes.view(n, -1, BLOCK // 2)
        q = torch.cat([packed & 0x0F, packed >> 4], dim=-1)  # weights 0..15, then 16..31
        if self.format == "q4_0":
            return (d * (q.to(torch.int8) - 8).float()).reshape(n, k)
        return (d * q.float() + self.mins.float().unsqueeze(-1)).reshape(n, k)

    def code_values(self) -> torch.Tensor:
        """The integer codes [N, K] in k order (Q4: 0..15 as uint8; Q8_0: int8)."""
        n, k = self.shape
        if self.format == "q8_0":
            return self.codes
        packed = self.codes.view(n, -1, BLOCK // 2)
        return torch.cat([packed & 0x0F, packed >> 4], dim=-1).reshape(n, k)

    def rows(self, index) -> "BlockWeight":
        """The output channels `index` (a permutation, a slice) of this weight."""
        return BlockWeight(self.format, self.codes[index], self.scales[index],
                           None if self.mins is None else self.mins[index])

    @staticmethod
    def concat(parts: list["BlockWeight"]) -> "BlockWeight":
        """Stack weights of one format along the output channels. Raises BlockFormatError for mixed formats."""
        formats = {p.format for p in parts}
        if len(formats) != 1:
            raise BlockFormatError(f"cannot stack weights of formats {sorted(formats)}")
        mins = None if parts[0].mins is None else torch.cat([p.mins for p in parts])
        return BlockWeight(parts[0].format, torch.cat([p.codes for p in parts]), torch.cat([p.scales for p in parts]),
                           mins)

    def tensors(self, weight_name: str) -> dict[str, torch.Tensor]:
        """The safetensors tensors for the HF weight `weight_name` (ending in ".weight")."""
        base = weight_name.removesuffix(".weight")
        out = {f"{base}.qweight": self.codes.contiguous(), f"{base}.scales": self.scales.contiguous()}
        if self.mins is not None:
            out[f"{base}.mins"] = self.mins.contiguous()
        return out

    @classmethod
    def pop_from(cls, state: dict[str, torch.Tensor], weight_name: str, fmt: str) -> "BlockWeight":
        """Take the tensors of `weight_name` out of a loaded safetensors state. Raises
        BlockFormatError when one is missing or their shapes do not fit together."""
        base = weight_name.removesuffix(".weight")
        names = [f"{base}.qweight", f"{base}.scales"] + ([f"{base}.mins"] if fmt == "q4_1" else [])
        missing = [n for n in names if n not in state]
        if fmt not in FORMATS or missing:
            raise BlockFormatError(f"{weight_name}: format {fmt!r} needs the tensors {missing or names}")
        codes, scales = state.pop(names[0]), state.pop(names[1])
        mins = state.pop(names[2]) if fmt == "q4_1" else None
        n, blocks = scales.shape
        per_block = BLOCK if fmt == "q8_0" else BLOCK // 2
        if tuple(codes.shape) != (n, blocks * per_block) or (mins is not None and mins.shape != scales.shape):
            raise BlockFormatError(f"{weight_name}: codes {tuple(codes.shape)} do not fit scales {tuple(scales.shape)}")
        return cls(fmt, codes, scales, mins)


def quantization_config(formats: dict[str, str]) -> dict:
    """config.json's `quantization_config` for a folder whose weights `formats` (HF weight name ->
    block format) are stored as blocks."""
    return {"quant_method": QUANT_METHOD, "block_size": BLOCK, "weights": dict(sorted(formats.items()))}


def block_formats(config: dict) -> dict[str, str]:
    """HF weight name -> block format from a parsed config.json ({} for a float folder). Raises
    BlockFormatError for a quantization_config this engine cannot read."""
    q = config.get("quantization_config")
    if not q:
        return {}
    if q.get("quant_method") != QUANT_METHOD or q.get("block_size") != BLOCK:
        raise BlockFormatError(f"quantization_config {q.get('quant_method')!r} is not supported; "
                               f"only {QUANT_METHOD!r} with block_size {BLOCK}")
    formats = dict(q.get("weights") or {})
    bad = sorted({f for f in formats.values() if f not in FORMATS})
    if bad:
        raise BlockFormatError(f"block formats {bad} are not supported; one of {', '.join(FORMATS)}")
    return formats
