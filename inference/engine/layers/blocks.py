"""GGUF weight blocks (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0; K-quants Q4_K, Q5_K, Q6_K) as torch tensors: from a file's bytes, from floats, to floats, in safetensors.

A block is 32 consecutive weights of one output channel with float16 scales
(ggml's formats, gguf-py's dequantize rules): Q4_0 w = d * (q - 8), q in 0..15;
Q4_1 w = d * q + m; Q5_0 w = d * (q - 16), Q5_1 w = d * q + m, q in 0..31; Q8_0 w = q * d,
q an int8. A BlockWeight keeps them as three tensors: `codes` (Q4: uint8 [N, K / 2], each
block's 16 bytes as in the file, byte i holding weight i in its low nibble and weight i + 16
in its high one; Q5: uint8 [N, K / 32 * 20], each block's 4 bytes of fifth bits (bit i of
their little-endian uint32 for weight i) then its 16 bytes of low nibbles as Q4's, as in the
file; Q8_0: int8 [N, K]), `scales` float16 [N, K / 32] and, for Q4_1 and Q5_1, `mins`
float16 [N, K / 32].

A K-quant super-block is 256 weights of one output channel (ggml's k-quants, gguf-py's
dequantizers): Q4_K and Q5_K hold 8 sub-blocks of 32 with 6-bit scales sc and mins m and
float16 d, dmin, w = (d * sc) * q - dmin * m, q in 0..15 (Q5_K: 0..31, the fifth bit apart);
Q6_K holds 16 sub-blocks of 16 with int8 scales and float16 d, w = (d * sc) * (q - 32), q in
0..63. Their BlockWeight keeps the super-blocks as the file ships them: `codes` uint8
[N, K / 256 * SUPER_BLOCK_BYTES[format]], no `scales` or `mins` (`kquant_fields` reads them out).

In a model folder they are the safetensors tensors `<name>.qweight`, `<name>.scales`
and `<name>.mins` (those the format has) for the HF weight `<name>.weight`, listed in
config.json under `quantization_config` (QUANT_METHOD; see `quantization_config`).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

BLOCK = 32
SUPER_BLOCK = 256
K_FORMATS = ("q4_k", "q5_k", "q6_k")
FORMATS = ("q4_0", "q4_1", "q5_0", "q5_1", "q8_0", *K_FORMATS)
_MINS = ("q4_1", "q5_1")  # the formats with a float16 min per block
QUANT_METHOD = "gguf_blocks"
# Bytes of one block in a GGUF file: the float16 scale (and min), then the codes.
_GGUF_BLOCK_BYTES = {"q4_0": 18, "q4_1": 20, "q5_0": 22, "q5_1": 24, "q8_0": 34}
# Bytes of one K-quant super-block (ggml's block_q4_K, block_q5_K, block_q6_K).
SUPER_BLOCK_BYTES = {"q4_k": 144, "q5_k": 176, "q6_k": 210}


class BlockFormatError(ValueError):
    """A tensor cannot be held in (or read from) the block format asked for."""


@dataclass(slots=True)
class BlockWeight:
    """One weight [N, K] in a block format (the module docstring gives the tensors' layout)."""

    format: str
    codes: torch.Tensor
    scales: torch.Tensor | None
    mins: torch.Tensor | None = None

    @property
    def shape(self) -> tuple[int, int]:
        """(N, K): output channels and input features."""
        if self.format in K_FORMATS:
            return self.codes.shape[0], self.codes.shape[1] // SUPER_BLOCK_BYTES[self.format] * SUPER_BLOCK
        return self.scales.shape[0], self.scales.shape[1] * BLOCK

    @property
    def nbytes(self) -> int:
        """Bytes of the codes and scales (what a GEMM over this weight reads)."""
        return sum(t.numel() * t.element_size() for t in (self.codes, self.scales, self.mins) if t is not None)

    @classmethod
    def from_gguf(cls, raw: np.ndarray, fmt: str) -> "BlockWeight":
        """From a GGUF tensor's bytes: uint8 [N, K / 32 * block bytes] (K-quants: [N, K / 256 * super-block
        bytes]; gguf-py's ReaderTensor.data). Raises BlockFormatError for another shape or format."""
        if fmt in K_FORMATS:
            raw = np.ascontiguousarray(raw, dtype=np.uint8)
            if raw.ndim != 2 or raw.shape[1] % SUPER_BLOCK_BYTES[fmt]:
                raise BlockFormatError(f"{fmt} data of shape {raw.shape} is not whole super-blocks of "
                                       f"{SUPER_BLOCK_BYTES[fmt]} bytes")
            return cls(fmt, torch.from_numpy(raw.copy()), None)
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
        start = 4 if fmt in _MINS else 2
        codes = torch.from_numpy(blocks[..., start:].copy().reshape(raw.shape[0], -1))
        mins = torch.from_numpy(blocks[..., 2:4].copy().view(np.float16)[..., 0]) if fmt in _MINS else None
        return cls(fmt, codes, scales, mins)

    @classmethod
    def quantize(cls, weight: torch.Tensor, fmt: str) -> "BlockWeight":
        """Quantise a float weight [N, K] (K a multiple of 32) to `fmt` with gguf-py's quantisers
        (bit-exact with ggml's reference ones). Raises BlockFormatError for another K."""
        from gguf import GGMLQuantizationType as QType
        from gguf.quants import quantize

        n, k = weight.shape
        if fmt in K_FORMATS:
            raise BlockFormatError(f"gguf-py has no {fmt} quantiser; K-quant weights come from a GGUF file")
        if k % BLOCK:
            raise BlockFormatError(f"a weight with {k} input features is not whole blocks of {BLOCK}")
        data = quantize(weight.detach().float().cpu().numpy(), getattr(QType, fmt.upper()))
        return cls.from_gguf(data.reshape(n, -1), fmt)

    def dequantize(self) -> torch.Tensor:
        """float32 [N, K]: the values gguf-py's dequantize gives (the same float32 operations)."""
        n, k = self.shape
        if self.format in K_FORMATS:
            from gguf import GGMLQuantizationType as QType
            from gguf.quants import dequantize

            return torch.from_numpy(dequantize(self.codes.numpy(), getattr(QType, self.format.upper()))).view(n, k)
        d = self.scales.float().unsqueeze(-1)
        if self.format == "q8_0":
            return (self.codes.float().view(n, -1, BLOCK) * d).reshape(n, k)
        q = self.code_values().view(n, -1, BLOCK)
        if self.format in ("q4_0", "q5_0"):
            return (d * (q.to(torch.int8) - (8 if self.format == "q4_0" else 16)).float()).reshape(n, k)
        return (d * q.float() + self.mins.float().unsqueeze(-1)).reshape(n, k)

    def code_values(self) -> torch.Tensor:
        """The integer codes [N, K] in k order (Q4: 0..15 as uint8; Q5: 0..31; Q8_0: int8; K-quants:
        kquant_fields' q)."""
        n, k = self.shape
        if self.format in K_FORMATS:
            return self.kquant_fields()["q"]
        if self.format == "q8_0":
            return self.codes
        if self.format in ("q5_0", "q5_1"):
            blocks = self.codes.view(n, -1, 20)
            packed = blocks[..., 4:]
            high = blocks[..., :4].unsqueeze(-1) >> torch.arange(8, dtype=torch.uint8)  # [n, KB, 4 bytes, 8 bits]
            q = torch.cat([packed & 0x0F, packed >> 4], dim=-1) | ((high.reshape(n, -1, BLOCK) & 1) << 4)
            return q.reshape(n, k)
        packed = self.codes.view(n, -1, BLOCK // 2)
        return torch.cat([packed & 0x0F, packed >> 4], dim=-1).reshape(n, k)

    def kquant_fields(self) -> dict[str, torch.Tensor | None]:
        """A K-quant weight's integer fields in k order (gguf-py's dequantizers' unpacking): "q" uint8
        [N, K] (Q4_K 0..15, Q5_K 0..31, Q6_K 0..63, before Q6_K's - 32), "sc" the sub-block scales
        (Q4_K / Q5_K uint8 [N, K / 32] in 0..63; Q6_K int8 [N, K / 16]), "m" the mins (uint8
        [N, K / 32]; None for Q6_K), "d" and "dmin" float16 [N, K / 256] (dmin None for Q6_K).
        Raises BlockFormatError for a format that is not a K-quant."""
        if self.format not in K_FORMATS:
            raise BlockFormatError(f"{self.format} is not a K-quant format")
        n, k = self.shape
        raw = self.codes.view(n, k // SUPER_BLOCK, SUPER_BLOCK_BYTES[self.format])
        if self.format == "q6_k":
            ql, qh = raw[..., :128].view(n, -1, 2, 64), raw[..., 128:192].view(n, -1, 2, 32)
            low = torch.stack([ql & 0x0F, ql >> 4], dim=2)  # [n, S, nibble, half, 64]: w = 128 half + 64 nibble + e
            low = low.permute(0, 1, 3, 2, 4).reshape(n, -1, 256)
            high = torch.stack([(qh >> (2 * i)) & 3 for i in range(4)], dim=3)  # [n, S, half, 4, 32]
            q = low | (high.reshape(n, -1, 256) << 4)
            return {"q": q.reshape(n, k), "sc": raw[..., 192:208].contiguous().view(torch.int8).reshape(n, -1),
                    "m": None, "d": raw[..., 208:210].contiguous().view(torch.float16).reshape(n, -1), "dmin": None}
        scales = raw[..., 4:16].view(n, -1, 3, 4)
        dp, mp, md = scales[..., 0, :], scales[..., 1, :], scales[..., 2, :]
        sc = torch.cat([dp & 0x3F, (md & 0x0F) | ((dp >> 2) & 0x30)], dim=-1)
        mins = torch.cat([mp & 0x3F, (md >> 4) | ((mp >> 2) & 0x30)], dim=-1)
        qs = raw[..., 48:176] if self.format == "q5_k" else raw[..., 16:144]
        qs = qs.reshape(n, -1, 4, 1, 32)
        q = torch.cat([qs & 0x0F, qs >> 4], dim=3).reshape(n, -1, 256)  # sub-block 2c: low nibbles, 2c + 1: high
        if self.format == "q5_k":
            qh = raw[..., 16:48].reshape(n, -1, 1, 32)
            q = q | ((torch.cat([(qh >> i) & 1 for i in range(8)], dim=2).reshape(n, -1, 256)) << 4)
        return {"q": q.reshape(n, k), "sc": sc.reshape(n, -1), "m": mins.reshape(n, -1),
                "d": raw[..., 0:2].contiguous().view(torch.float16).reshape(n, -1),
                "dmin": raw[..., 2:4].contiguous().view(torch.float16).reshape(n, -1)}

    def rows(self, index) -> "BlockWeight":
        """The output channels `index` (a permutation, a slice) of this weight."""
        return BlockWeight(self.format, self.codes[index], None if self.scales is None else self.scales[index],
                           None if self.mins is None else self.mins[index])

    @staticmethod
    def concat(parts: list["BlockWeight"]) -> "BlockWeight":
        """Stack weights of one format along the output channels. Raises BlockFormatError for mixed formats."""
        formats = {p.format for p in parts}
        if len(formats) != 1:
            raise BlockFormatError(f"cannot stack weights of formats {sorted(formats)}")
        mins = None if parts[0].mins is None else torch.cat([p.mins for p in parts])
        scales = None if parts[0].scales is None else torch.cat([p.scales for p in parts])
        return BlockWeight(parts[0].format, torch.cat([p.codes for p in parts]), scales, mins)

    def tensors(self, weight_name: str) -> dict[str, torch.Tensor]:
        """The safetensors tensors for the HF weight `weight_name` (ending in ".weight")."""
        base = weight_name.removesuffix(".weight")
        out = {f"{base}.qweight": self.codes.contiguous()}
        if self.scales is not None:
            out[f"{base}.scales"] = self.scales.contiguous()
        if self.mins is not None:
            out[f"{base}.mins"] = self.mins.contiguous()
        return out

    @classmethod
    def pop_from(cls, state: dict[str, torch.Tensor], weight_name: str, fmt: str) -> "BlockWeight":
        """Take the tensors of `weight_name` out of a loaded safetensors state. Raises
        BlockFormatError when one is missing or their shapes do not fit together."""
        base = weight_name.removesuffix(".weight")
        if fmt in K_FORMATS:
            name = f"{base}.qweight"
            if name not in state:
                raise BlockFormatError(f"{weight_name}: format {fmt!r} needs the tensor {name}")
            codes = state.pop(name)
            if codes.dtype != torch.uint8 or codes.dim() != 2 or codes.shape[1] % SUPER_BLOCK_BYTES[fmt]:
                raise BlockFormatError(f"{weight_name}: {fmt} codes {codes.dtype} {tuple(codes.shape)} are not "
                                       f"whole super-blocks of {SUPER_BLOCK_BYTES[fmt]} bytes")
            return cls(fmt, codes, None)
        names = [f"{base}.qweight", f"{base}.scales"] + ([f"{base}.mins"] if fmt in _MINS else [])
        missing = [n for n in names if n not in state]
        if fmt not in FORMATS or missing:
            raise BlockFormatError(f"{weight_name}: format {fmt!r} needs the tensors {missing or names}")
        codes, scales = state.pop(names[0]), state.pop(names[1])
        mins = state.pop(names[2]) if fmt in _MINS else None
        n, blocks = scales.shape
        per_block = BLOCK if fmt == "q8_0" else 20 if fmt in ("q5_0", "q5_1") else BLOCK // 2
        if tuple(codes.shape) != (n, blocks * per_block) or (mins is not None and mins.shape != scales.shape):
            raise BlockFormatError(f"{weight_name}: codes {tuple(codes.shape)} do not fit scales {tuple(scales.shape)}")
        return cls(fmt, codes, scales, mins)


# Block formats whose linears read the same quantised activation rows (per 32, per 256): parts of one
# group can be stacked into one linear (kernels.h metrale_weight's `next`).
ACTIVATION_GROUPS = (("q4_0", "q4_1", "q5_0", "q5_1", "q8_0"), K_FORMATS)


def stackable(formats: list[str]) -> bool:
    """Whether weights of these block formats can be stacked as one linear (one ACTIVATION_GROUPS group)."""
    return any(set(formats) <= set(group) for group in ACTIVATION_GROUPS)


@dataclass(slots=True)
class BlockStack:
    """Block weights of several formats stacked along the output channels, each part as it ships (a
    fused q/k/v whose v is Q6_K beside Q4_K q and k, as llama.cpp's Q4_K_M mixes them). `format` is the
    parts' formats joined by "+"; shape (N, K) and dequantize() as for one BlockWeight."""

    parts: tuple[BlockWeight, ...]

    @classmethod
    def of(cls, weights: list[BlockWeight]) -> "BlockStack":
        """Adjacent weights of one format merged into one part. Raises BlockFormatError unless the
        formats are stackable or the input features differ."""
        if not stackable([w.format for w in weights]) or len({w.shape[1] for w in weights}) != 1:
            raise BlockFormatError(f"cannot stack weights of formats {[w.format for w in weights]} "
                                   f"and shapes {[w.shape for w in weights]}")
        parts: list[list[BlockWeight]] = []
        for w in weights:
            if parts and parts[-1][0].format == w.format:
                parts[-1].append(w)
            else:
                parts.append([w])
        return cls(tuple(BlockWeight.concat(p) if len(p) > 1 else p[0] for p in parts))

    @property
    def format(self) -> str:
        return "+".join(p.format for p in self.parts)

    @property
    def shape(self) -> tuple[int, int]:
        return sum(p.shape[0] for p in self.parts), self.parts[0].shape[1]

    @property
    def nbytes(self) -> int:
        return sum(p.nbytes for p in self.parts)

    def dequantize(self) -> torch.Tensor:
        """float32 [N, K]: every part's gguf-py values."""
        return torch.cat([p.dequantize() for p in self.parts])


def quantization_config(formats: dict[str, str], file_type: str | None = None) -> dict:
    """config.json's `quantization_config` for a folder whose weights `formats` (HF weight name ->
    block format) are stored as blocks; `file_type`: the GGUF's own name for its mix ("Q4_K_M"), kept for
    Ollama's quantization_level (ollama_api/catalogue.py), left out when None."""
    config = {"quant_method": QUANT_METHOD, "block_size": BLOCK, "weights": dict(sorted(formats.items()))}
    return config | {"file_type": file_type} if file_type else config


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
