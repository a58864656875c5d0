"""Compiled CPU kernels (decode attention, int8 and block-format linears, decode layers), called on torch tensors through ctypes.

`available()` says whether they can be used (CPU build succeeded and
METRALE_CPU_KERNELS is not "0"); the callers fall back to plain torch otherwise.
The C sources are cpu_kernels.c (decode attention), int8_gemm.c (int8 linear),
block_gemm.c (GGUF-block linears and the one weight-linear entry point) and
decode_layer.c (whole decode layers), sample.c (the sampler's temperature draw); build.py compiles
and caches them. Every function bound here is declared in kernels.h (decode_layer.h: the decode step's), and
every struct passed is checked against layout.c's report at each load (layout.py).
"""
from __future__ import annotations

import ctypes
import logging
import os
import threading

import torch

from ..layers.blocks import BlockStack
from . import layout
from .build import KernelBuildError, build
from .layout import KernelLayoutError

log = logging.getLogger("metrale.engine")

_lib: ctypes.CDLL | None = None
_tried = False
_layout_error: KernelLayoutError | None = None
_lock = threading.Lock()

_P = ctypes.c_void_p
_L = ctypes.c_long
_I = ctypes.c_int


def _load() -> ctypes.CDLL | None:
    """The library, built and bound on the first call (None where there is none). Raises KernelLayoutError, on
    this and every later call, when its structs differ from Python's (layout.py)."""
    global _lib, _tried, _layout_error
    with _lock:
        if _layout_error is not None:
            raise _layout_error
        if _tried:
            return _lib
        _tried = True
        if os.environ.get("METRALE_CPU_KERNELS", "1") == "0":
            return None
        try:
            lib = ctypes.CDLL(str(build()))
        except (KernelBuildError, OSError) as exc:
            log.warning("CPU kernels unavailable, using plain torch: %s", exc)
            return None
        lib.metrale_paged_decode_attention.argtypes = [_P, _P, _P, _P, _P, _P, _L, _I, _I, _I, _I, _L,
                                                       ctypes.c_float, _I, _I]
        lib.metrale_paged_decode_attention.restype = None
        lib.metrale_paged_decode_attention_strided.argtypes = [_P, _L, _P, _P, _P, _P, _P, _P, _L, _I, _I, _I, _I, _L,
                                                               ctypes.c_float, _I, _I]
        lib.metrale_paged_decode_attention_strided.restype = None
        lib.metrale_int8_linear.argtypes = [_P, _P, _P, _P, _L, _L, _L, _I]
        lib.metrale_int8_linear.restype = None
        lib.metrale_int8_pack.argtypes = [_P, _P, _L, _L]
        lib.metrale_int8_pack.restype = None
        lib.metrale_kernels_isa.argtypes = []
        lib.metrale_kernels_isa.restype = ctypes.c_char_p
        lib.metrale_block_isa.argtypes = []
        lib.metrale_block_isa.restype = ctypes.c_char_p
        lib.metrale_weight_linear.argtypes = [ctypes.POINTER(KernelWeight.Struct), _P, _P, _L, _L, _L, _I]
        lib.metrale_weight_linear.restype = None
        lib.metrale_block_rows.argtypes = [ctypes.POINTER(KernelWeight.Struct), _L, _P, _L, _P]
        lib.metrale_block_rows.restype = None
        lib.metrale_sample.argtypes = [_P, _L, _L, _P, _P, _P, _P, _P, _P, _P, _P, _I]
        lib.metrale_sample.restype = None
        lib.metrale_encoder_attention.argtypes = [_P, _L, _P, _P, _L, _I, _I, ctypes.c_float, _P, _L, _I]
        lib.metrale_encoder_attention.restype = None
        lib.metrale_encoder_bias_gelu.argtypes = [_P, _P, _P, _L, _L, _I]
        lib.metrale_encoder_bias_gelu.restype = None
        lib.metrale_encoder_add_norm.argtypes = [_P, _P, _P, _P, _P, ctypes.c_float, _P, _P, _L, _L, _I]
        lib.metrale_encoder_add_norm.restype = None
        lib.metrale_encoder_add_bias.argtypes = [_P, _P, _P, _L, _L, _I]
        lib.metrale_encoder_add_bias.restype = None
        lib.metrale_encoder_add_norm_f32.argtypes = [_P, _P, _P, _P, _P, ctypes.c_float, _P, _L, _L, _I]
        lib.metrale_encoder_add_norm_f32.restype = None
        lib.metrale_encoder_attention_bf16.argtypes = [_P, _L, _P, _P, _P, _L, _I, _I, ctypes.c_float, _P, _L, _I]
        lib.metrale_encoder_attention_bf16.restype = _I
        lib.metrale_encoder_bf16_attention.argtypes = [_I]
        lib.metrale_encoder_bf16_attention.restype = _I
        lib.metrale_encoder_pack_f32.argtypes = [_P, _L, _L, _P]
        lib.metrale_encoder_pack_f32.restype = None
        lib.metrale_encoder_pack_bf16.argtypes = [_P, _L, _L, _P]
        lib.metrale_encoder_pack_bf16.restype = None
        lib.metrale_encoder_linear_f32.argtypes = [_P, _L, _P, _P, _I, _P, _L, _L, _L, _L, _I]
        lib.metrale_encoder_linear_f32.restype = None
        lib.metrale_encoder_linear_bf16.argtypes = [_P, _L, _P, _P, _I, _P, _L, _L, _L, _L, _I]
        lib.metrale_encoder_linear_bf16.restype = None
        lib.metrale_encoder_ffn_bf16.argtypes = [_P, _I, _L, _L, _L, _L] + [_P] * 10 + [ctypes.c_float] + [_P] * 6 + [_I]
        lib.metrale_encoder_ffn_bf16.restype = None
        lib.metrale_encoder_ffn_f32.argtypes = [_P, _L, _L, _L, _L] + [_P] * 10 + [ctypes.c_float] + [_P] * 3 + [_I]
        lib.metrale_encoder_ffn_f32.restype = None
        lib.metrale_encoder_layer_bf16.argtypes = [_P, _P, _P, _P, _L, _I, ctypes.c_float, _P, _P, _L, _L, _L] + [_P] * 10 + [ctypes.c_float] + [_P] * 6 + [_I]
        lib.metrale_encoder_layer_bf16.restype = _I
        lib.metrale_encoder_layer_f32.argtypes = [_P, _P, _P, _P, _L, _I, ctypes.c_float, _P, _P, _L, _L, _L] + [_P] * 10 + [ctypes.c_float] + [_P] * 3 + [_I]
        lib.metrale_encoder_layer_f32.restype = _I
        lib.metrale_amx_ready.argtypes = []
        lib.metrale_amx_ready.restype = _I
        lib.metrale_kq_stride.argtypes = [_I]
        lib.metrale_kq_stride.restype = _L
        layout.bind(lib)
        try:
            layout.check_layouts(lib)
            strides = {fmt: lib.metrale_kq_stride(FORMAT_CODES[fmt]) for fmt in KQUANT_STRIDE}
            if strides != KQUANT_STRIDE:
                raise KernelLayoutError(f"K-quant strides {strides} in C, {KQUANT_STRIDE} in KQUANT_STRIDE")
        except KernelLayoutError as exc:
            _layout_error = exc
            raise
        _lib = lib
        return lib


def library() -> ctypes.CDLL | None:
    """The loaded library (building it on first call), or None where it is unavailable."""
    return _load()


def _required() -> ctypes.CDLL:
    lib = _load()
    if lib is None:
        raise RuntimeError("CPU kernels are unavailable")
    return lib


def available() -> bool:
    """True when the compiled kernels are loaded (built on first call)."""
    return _load() is not None


def instruction_set() -> str:
    """The vector paths the loaded library was compiled with (it is built with -march=native), e.g.
    "int8 GEMM avx512-vnni, attention avx512, blocks avx512-vnni" or "int8 GEMM avx2, attention
    avx2, blocks avx2", with "+amx" after the blocks where their groups of 16 rows take the tile unit
    (amx_gemm.c); "unavailable" where the kernels are not loaded."""
    lib = _load()
    if lib is None:
        return "unavailable"
    amx = "+amx" if lib.metrale_amx_ready() else ""
    return f"{lib.metrale_kernels_isa().decode()}, blocks {lib.metrale_block_isa().decode()}{amx}"


_KV_DTYPES = {torch.float32: 0, torch.bfloat16: 1, torch.int8: 2}


def supports_kv_dtype(dtype: torch.dtype) -> bool:
    """The decode attention kernel reads float32, bfloat16 and int8 (layers/kv_quant.py) KV caches."""
    return dtype in _KV_DTYPES


def kv_dtype_code(dtype: torch.dtype) -> int:
    """The kernels' code for a KV cache dtype: 0 float32, 1 bfloat16, 2 int8. Raises KeyError for others."""
    return _KV_DTYPES[dtype]


def paged_decode_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                           block_tables: torch.Tensor, seq_lens: torch.Tensor, scale: float,
                           seq_starts: torch.Tensor | None = None) -> torch.Tensor:
    """softmax(q·Kᵀ·scale)·V for one new token per sequence, reading K/V through block tables.

    q: float32 [D, n_heads, head_dim]; k_cache, v_cache: [num_blocks, block_size, n_kv,
    head_dim] float32 or bfloat16, or int8 [..., head_dim + 4] (layers/kv_quant.py); block_tables: int64 [D, width]; seq_lens: int64 [D]
    (tokens attended, the new one included); seq_starts: int64 [D], each row's first key in its
    table (a sliding window; None: key 0). Keys [seq_starts, seq_lens) of the table are attended.
    Returns float32 [D, n_heads, head_dim]. Raises RuntimeError if the kernels are unavailable.
    """
    lib = _required()
    q = q.contiguous()
    d, n_heads, head_dim = q.shape
    _, block_size, n_kv, _ = k_cache.shape
    out = torch.empty_like(q)
    starts = None if seq_starts is None else seq_starts.contiguous()
    lib.metrale_paged_decode_attention_strided(
        q.data_ptr(), n_heads * head_dim, k_cache.data_ptr(), v_cache.data_ptr(), block_tables.data_ptr(),
        seq_lens.data_ptr(), None if starts is None else starts.data_ptr(), out.data_ptr(), d, n_heads, n_kv,
        head_dim, block_size, block_tables.shape[1], scale, kv_dtype_code(k_cache.dtype), torch.get_num_threads())
    return out


TILE = 16  # output channels per packed tile (QT in int8_gemm.c)


def int8_pack(weight: torch.Tensor) -> torch.Tensor:
    """Repack an int8 weight [N, K] for int8_linear: int8 [ceil(N / 16), ceil(K / 2), 16, 2], the
    16 channels of a tile side by side for each pair of k values (zero padding past N and K).

    Raises RuntimeError if the kernels are unavailable.
    """
    lib = _required()
    weight = weight.contiguous()
    n, k = weight.shape
    packed = torch.empty((-(-n // TILE), -(-k // 2), TILE, 2), dtype=torch.int8)
    lib.metrale_int8_pack(weight.data_ptr(), packed.data_ptr(), n, k)
    return packed


def activation_limit(k: int) -> int:
    """The int16 bound A that int8_linear quantises activation rows to: min(32767, (2^31 - 1) //
    (127 * K rounded up to even)), so that no int32 sum over K products of int8 weights overflows."""
    return min(32767, (2**31 - 1) // (127 * 2 * -(-k // 2)))


def int8_linear(x: torch.Tensor, packed: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """y = (x · weightᵀ) * scale with int8 weights and exact integer sums.

    x: float32 [M, K]; packed: int8_pack(weight) of an int8 weight [N, K]; scale:
    float32 [N] (per output channel; N = scale's length). Each row of x is quantised to
    int16 with its own scale amax(|row|) / A (A = activation_limit(K), round half to
    even), the products are summed exactly in int32, and y[m, n] = (float32(sum) * sx[m])
    * scale[n]. Returns float32 [M, N]. Integer sums are order-free, so each row's result
    is bitwise independent of the other rows and of how the kernel blocks them.
    Raises RuntimeError if the kernels are unavailable.
    """
    lib = _required()
    x = x.contiguous()
    m, k = x.shape
    n = scale.shape[0]
    out = torch.empty((m, n), dtype=torch.float32)
    lib.metrale_int8_linear(x.data_ptr(), packed.data_ptr(), scale.data_ptr(), out.data_ptr(), m, n, k,
                            torch.get_num_threads())
    return out


# Weight formats of kernels.h's metrale_weight.
FORMAT_CODES = {"int8": 0, "q4_0": 1, "q4_1": 2, "q8_0": 3, "q4_k": 4, "q5_k": 5, "q6_k": 6, "q5_0": 7, "q5_1": 8}


class KernelWeight:
    """One linear's weight as the compiled kernels read it (kernels.h metrale_weight): the packed
    tensors, its format and whether activations stay float32 (`exact`, the reference path).

    Build with `from_int8` or `from_blocks` (a layers.blocks.BlockStack gives a stack of parts, each
    packed in its own format, `format` then "q4_k+q6_k"-style); `shape` is (N, K); `nbytes` the packed
    tensors' bytes. `with_exact(flag)` gives the same tensors under the other activation rule (no copy).
    """

    class Struct(ctypes.Structure):
        _fields_ = [("format", ctypes.c_int), ("exact", ctypes.c_int), ("qs", _P), ("d", _P), ("m", _P),
                    ("rows", ctypes.c_long), ("next", _P)]

    __slots__ = ("format", "exact", "qs", "d", "m", "shape", "struct", "parts", "_structs")

    def __init__(self, fmt: str, exact: bool, qs: torch.Tensor | None, d: torch.Tensor | None,
                 m: torch.Tensor | None, shape: tuple[int, int], parts: tuple["KernelWeight", ...] = ()):
        self.format, self.exact, self.qs, self.d, self.m, self.shape = fmt, exact, qs, d, m, shape
        self.parts = parts
        singles = parts or (self,)
        self._structs = [KernelWeight.Struct(FORMAT_CODES[w.format], int(exact), w.qs.data_ptr(), _ptr_or_none(w.d),
                                             _ptr_or_none(w.m), w.shape[0], None) for w in singles]
        for a, b in zip(self._structs, self._structs[1:]):  # the C side walks `next` (kernels.h)
            a.next = ctypes.addressof(b)
        self.struct = self._structs[0]

    def tensors(self) -> list[torch.Tensor]:
        """The packed tensors the kernels read (every part's)."""
        return [t for w in (self.parts or (self,)) for t in (w.qs, w.d, w.m) if t is not None]

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.tensors())

    def with_exact(self, exact: bool) -> "KernelWeight":
        if self.parts:
            return KernelWeight(self.format, exact, None, None, None, self.shape,
                                tuple(w.with_exact(exact) for w in self.parts))
        return KernelWeight(self.format, exact, self.qs, self.d, self.m, self.shape)

    @classmethod
    def from_int8(cls, q: torch.Tensor, scale: torch.Tensor) -> "KernelWeight":
        """From a per-channel int8 weight (int8 [N, K], scales [N]); int16 activations (int8_linear)."""
        return cls("int8", False, resident(int8_pack(q)), scale.float().contiguous(), None, tuple(q.shape))

    @classmethod
    def from_blocks(cls, blocks, exact: bool = False) -> "KernelWeight":
        """From a layers.blocks.BlockWeight, packed in block_gemm.c's tile layout (N padded to 16; K-quants:
        kquant_gemm.c's, `pack_kquant`)."""
        if isinstance(blocks, BlockStack):
            return cls(blocks.format, exact, None, None, None, blocks.shape,
                       tuple(cls.from_blocks(b, exact) for b in blocks.parts))
        if blocks.format in KQUANT_STRIDE:
            return cls(blocks.format, exact, resident(pack_kquant(blocks)), None, None, blocks.shape)
        n, k = blocks.shape
        tiles, kb = -(-n // TILE), k // 32
        pad = tiles * TILE - n

        def tile_major(t: torch.Tensor) -> torch.Tensor:  # [N, KB] -> [tiles, KB, 16]
            t = torch.cat([t, t.new_zeros((pad, *t.shape[1:]))]) if pad else t
            return t.view(tiles, TILE, kb).permute(0, 2, 1).contiguous()

        codes = blocks.code_values()
        codes = torch.cat([codes, codes.new_zeros((pad, k))]) if pad else codes
        if blocks.format == "q8_0":  # [tiles, KB, 8 groups, 16 channels x 4 k]
            qs = codes.view(tiles, TILE, kb, 8, 4).permute(0, 2, 3, 1, 4).contiguous().view(tiles, kb, 8, 64)
        else:  # [tiles, KB, 4 groups, 16 channels x 4 bytes]: k 8g + i low nibble, 8g + 4 + i high
            c = (codes & 0x0F).view(tiles, TILE, kb, 4, 2, 4).permute(0, 2, 3, 1, 5, 4)
            qs = (c[..., 0] | (c[..., 1] << 4)).contiguous().view(tiles, kb, 4, 64)
            if blocks.format in ("q5_0", "q5_1"):  # then the fifth bits: byte 4 j + i, bit 2g + upper
                hb = (codes >> 4).view(tiles, TILE, kb, 4, 2, 4).permute(0, 2, 1, 5, 3, 4).reshape(tiles, kb, 64, 8)
                high = (hb << torch.arange(8, dtype=torch.uint8)).sum(-1, dtype=torch.uint8)
                qs = torch.cat([qs, high.view(tiles, kb, 1, 64)], dim=2).contiguous()
        d = tile_major(blocks.scales).view(torch.int16)
        m = None if blocks.mins is None else tile_major(blocks.mins).view(torch.int16)
        return cls(blocks.format, exact, resident(qs), resident(d), None if m is None else resident(m), (n, k))


# Packed weights of at least this many bytes (an LM head: Gemma 3's 178 MB) are moved into memory backed by
# 2 MiB pages: a step streams them from memory, and with 4 KiB pages it walks a page table every 4 KiB
# (Gemma 3 270M's batch-1 head 7.7 -> 7.3 ms on 2 vCPUs of a Xeon). Smaller ones stay where they are (a
# huge page each would round every layer's tensors up to 2 MiB).
HUGE_PAGE_BYTES = 16 << 20
_HUGE = 2 << 20


def resident(t: torch.Tensor) -> torch.Tensor:
    """`t` itself, or for a tensor of at least HUGE_PAGE_BYTES a copy in an anonymous mapping that Linux is
    asked to back with transparent huge pages (madvise; where it declines, the copy is in ordinary pages).
    The mapping lives as long as the returned tensor."""
    n = t.numel() * t.element_size()
    if n < HUGE_PAGE_BYTES or not t.is_contiguous() or t.device.type != "cpu":
        return t
    import mmap

    region = mmap.mmap(-1, (n + _HUGE - 1) // _HUGE * _HUGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    try:
        region.madvise(mmap.MADV_HUGEPAGE)
    except (AttributeError, OSError):  # no transparent huge pages here
        pass
    out = torch.frombuffer(region, dtype=torch.uint8, count=n).view(t.dtype).view(t.shape)
    out.copy_(t)
    return out


# Bytes of one packed (tile, super-block) of each K-quant format (kquant_gemm.c metrale_kq_stride).
KQUANT_STRIDE = {"q4_k": 2048 + 320, "q5_k": 2560 + 320, "q6_k": 3072 + 320}


def pack_kquant(blocks) -> torch.Tensor:
    """A K-quant layers.blocks.BlockWeight [N, K] in kquant_gemm.c's layout (its header comment): uint8
    [ceil(N / 16), K / 256, KQUANT_STRIDE[format]], zero past N. Integer fields only are moved: the
    values are the super-blocks' own."""
    n, k = blocks.shape
    tiles, ks, fmt = -(-n // TILE), k // 256, blocks.format
    f = blocks.kquant_fields()
    pad = tiles * TILE - n

    def padded(t: torch.Tensor) -> torch.Tensor:
        return torch.cat([t, t.new_zeros((pad, *t.shape[1:]))]) if pad else t

    q = padded(f["q"]).view(tiles, TILE, ks, 8, 4, 2, 4)  # [t, j, b, s, g, upper, i]
    low = (q & 0x0F).permute(0, 2, 3, 4, 1, 5, 6)  # [t, b, s, g, j, upper, i]
    parts = [(low[..., 0, :] | (low[..., 1, :] << 4)).reshape(tiles, ks, 2048)]
    if fmt == "q5_k":
        hb = ((q >> 4) & 1).permute(0, 2, 3, 1, 6, 4, 5).reshape(tiles, ks, 8, TILE, 4, 8)  # [.., j, i, g * 2 + u]
        parts.append((hb << torch.arange(8, dtype=torch.uint8)).sum(-1, dtype=torch.uint8).reshape(tiles, ks, 512))
    if fmt == "q6_k":  # [t, j, b, s, v, e, u, i] -> [t, b, s, v, j, i, e * 2 + u]
        h2 = ((q >> 4) & 3).view(tiles, TILE, ks, 8, 2, 2, 2, 4).permute(0, 2, 3, 4, 1, 7, 5, 6).reshape(
            tiles, ks, 8, 2, TILE, 4, 4)
        high = (h2 << (2 * torch.arange(4, dtype=torch.uint8))).sum(-1, dtype=torch.uint8)
        parts.append(high.reshape(tiles, ks, 1024))
        sc = padded(f["sc"].view(torch.uint8)).view(tiles, TILE, ks, 8, 2).permute(0, 2, 3, 1, 4)
        parts.append(sc.reshape(tiles, ks, 256))
        d = padded(f["d"]).view(tiles, TILE, ks).permute(0, 2, 1).contiguous().view(torch.uint8)
        parts += [d.reshape(tiles, ks, 32), torch.zeros((tiles, ks, 32), dtype=torch.uint8)]
    else:
        parts.append(padded(f["sc"]).view(tiles, TILE, ks, 8).permute(0, 2, 3, 1).reshape(tiles, ks, 128))
        parts.append(padded(f["m"]).view(tiles, TILE, ks, 4, 2).permute(0, 2, 3, 1, 4).reshape(tiles, ks, 128))
        for name in ("d", "dmin"):
            parts.append(padded(f[name]).view(tiles, TILE, ks).permute(0, 2, 1).contiguous().view(torch.uint8)
                         .reshape(tiles, ks, 32))
    packed = torch.cat(parts, dim=-1).contiguous()
    assert packed.shape[-1] == KQUANT_STRIDE[fmt]
    return packed


def weight_linear(x: torch.Tensor, w: KernelWeight) -> torch.Tensor:
    """y = x · wᵀ through the weight's kernel (block_gemm.c metrale_weight_linear).

    x: float32 [M, K]; returns float32 [M, N]. Per-channel int8: int8_linear's rule. Block
    formats: each row quantised per block of 32 to int8 (scale amax / 127), exact int32 sums
    per block, then the blocks' float terms summed in order; exact=True: float32 activations
    against the dequantised blocks. Every row is computed independently of the others, and
    every instruction-set path gives the same floats. Raises RuntimeError without the kernels.
    """
    lib = _required()
    x = x.contiguous()
    m, k = x.shape
    n = w.shape[0]
    out = torch.empty((m, n), dtype=torch.float32)
    lib.metrale_weight_linear(ctypes.byref(w.struct), x.data_ptr(), out.data_ptr(), m, n, k, torch.get_num_threads())
    return out


def encoder_attention(qkv: torch.Tensor, starts: torch.Tensor, lens: torch.Tensor, n_heads: int, scale: float,
                      out: torch.Tensor) -> None:
    """Bidirectional attention of packed sequences (encoder.c), each sequence attending to itself alone.

    qkv: float32 [T, 3 * hidden] (each row q | k | v, head h at h * head_dim of each), contiguous rows;
    starts, lens: int64 [S], each sequence's first row and row count (lens >= 1); out: float32 [T,
    hidden] (rows may be strided), written for every row of every sequence: softmax(scale q·Kᵀ)·V
    per head, in float32 (encoder_attention_bf16 is its bfloat16 form). Raises RuntimeError
    without the kernels.
    """
    lib = _required()
    hidden = qkv.shape[1] // 3
    assert qkv.stride(1) == 1 and out.stride(1) == 1 and qkv.dtype == out.dtype == torch.float32
    starts, lens = starts.to(torch.int64).contiguous(), lens.to(torch.int64).contiguous()
    lib.metrale_encoder_attention(qkv.data_ptr(), qkv.stride(0), starts.data_ptr(), lens.data_ptr(), lens.shape[0],
                                  n_heads, hidden // n_heads, scale, out.data_ptr(), out.stride(0),
                                  torch.get_num_threads())


def encoder_bf16_attention(head_dim: int) -> str | None:
    """Which unit runs encoder_attention_bf16 here for heads of head_dim values: "amx" (Intel AMX's tile unit
    granted, head_dim 32 or 64), "avx512_bf16" (AVX-512 BF16's dot products, head_dim a multiple of 16) or
    None (neither: the float32 encoder_attention is the one to run)."""
    lib = library()
    return {2: "amx", 1: "avx512_bf16"}.get(lib.metrale_encoder_bf16_attention(head_dim)) if lib is not None else None


def encoder_attention_bf16(qkv: torch.Tensor, bias: torch.Tensor, starts: torch.Tensor, lens: torch.Tensor,
                           n_heads: int, scale: float, out: torch.Tensor) -> None:
    """encoder_attention's bfloat16 form (encoder_bf16_attention(head_dim) must name a unit) straight from a
    linear's product: qkv bfloat16 [T, 3 * hidden] (rows contiguous), bias float32 [3 * hidden] added to
    it, out bfloat16 [T, hidden] (rows may be strided). Q (times scale), K, V and P rounded to bfloat16, sums
    in float32 (flash attention's precision; encoder.c's attend_amx and attend_dp). A sequence's rows depend
    on that sequence alone. Raises RuntimeError without the kernels, where no unit runs it, or out of memory."""
    lib = _required()
    hidden = qkv.shape[1] // 3
    assert qkv.dtype == out.dtype == torch.bfloat16 and qkv.stride(1) == 1 and out.stride(1) == 1
    starts, lens = starts.to(torch.int64).contiguous(), lens.to(torch.int64).contiguous()
    done = lib.metrale_encoder_attention_bf16(qkv.data_ptr(), qkv.stride(0), bias.data_ptr(), starts.data_ptr(),
                                              lens.data_ptr(), lens.shape[0], n_heads, hidden // n_heads, scale,
                                              out.data_ptr(), out.stride(0), torch.get_num_threads())
    _attention_ran(done)


def _attention_ran(done: int) -> None:
    """Raise for what metrale_encoder_attention_bf16 (or a layer call around it) returned when it did not run:
    RuntimeError for 0 (no unit runs it here) or -1 (its scratch memory could not be allocated)."""
    if done != 1:
        raise RuntimeError("the encoder's bfloat16 attention does not run here" if done == 0 else
                           "the encoder's attention could not allocate its scratch memory")


def encoder_pack(weight: torch.Tensor) -> torch.Tensor:
    """An encoder linear's weight [N, K] (float32, or bfloat16 with K even; N a multiple of 16) in
    encoder_linear's layout (encoder.c): 16 output columns a group, float32 [N/16, K, 16] or bfloat16
    [N/16, K/2, 16, 2]. Raises RuntimeError without the kernels, ValueError for another shape or dtype."""
    lib = _required()
    n, k = weight.shape
    if n % 16 or weight.dtype not in (torch.float32, torch.bfloat16) or (weight.dtype == torch.bfloat16 and k % 2):
        raise ValueError(f"no batch-invariant layout for a {weight.dtype} weight of shape {(n, k)}")
    weight = weight.contiguous()
    packed = torch.empty(n * k, dtype=weight.dtype)
    pack = lib.metrale_encoder_pack_f32 if weight.dtype == torch.float32 else lib.metrale_encoder_pack_bf16
    pack(weight.data_ptr(), n, k, packed.data_ptr())
    return packed


def encoder_linear(x: torch.Tensor, packed: torch.Tensor, n: int, bias: torch.Tensor | None = None,
                   gelu: bool = False, out: torch.Tensor | None = None) -> torch.Tensor:
    """x · Wᵀ (+ bias) (then the erf GELU when gelu) with W packed by encoder_pack ([n, K]), batch-invariant:
    each output element is one chain of products in K's order, and the bias and GELU are that element's own
    steps, so a row's result never depends on the other rows of the call, their number or the threads
    (encoder.c).

    x: [T, K] of the weight's dtype, float32 or bfloat16 (rows may be strided); bias: float32 [n] or None;
    out: [T, n] of x's dtype (made when None; rows may be strided), returned. float32: float32 sums, the bias
    added and the GELU applied as each is stored (the same bits on the AVX-512, AVX2 and portable paths).
    bfloat16: float32 sums, + bias and GELU in float32, rounded to bfloat16. The GELU is the erf form (erf
    within 1.5e-7). Raises RuntimeError without the kernels, ValueError for a bias that is not a contiguous
    float32 [n]."""
    lib = _required()
    t, k = x.shape
    assert x.dtype == packed.dtype and x.stride(1) == 1 and packed.numel() == n * k
    if bias is not None and (bias.dtype != torch.float32 or tuple(bias.shape) != (n,) or not bias.is_contiguous()):
        raise ValueError(f"the encoder linear's bias must be a contiguous float32 [{n}], got {bias.dtype} "
                         f"{tuple(bias.shape)}")
    if out is None:
        out = torch.empty((t, n), dtype=x.dtype)
    assert out.dtype == x.dtype and out.stride(1) == 1 and tuple(out.shape) == (t, n)
    run = lib.metrale_encoder_linear_f32 if x.dtype == torch.float32 else lib.metrale_encoder_linear_bf16
    run(x.data_ptr(), x.stride(0), packed.data_ptr(), _ptr_or_none(bias), int(gelu), out.data_ptr(), out.stride(0),
        t, n, k, torch.get_num_threads())
    return out


def encoder_bias_gelu(y: torch.Tensor, bias: torch.Tensor, out: torch.Tensor) -> None:
    """out = bfloat16(gelu(float(y) + bias)), GELU's erf form (encoder.c: erf within 1.5e-7).

    y, out: bfloat16 [R, N] contiguous (out may be y); bias: float32 [N]. Raises RuntimeError without
    the kernels."""
    lib = _required()
    assert y.dtype == out.dtype == torch.bfloat16 and bias.dtype == torch.float32 and y.is_contiguous() and out.is_contiguous()
    lib.metrale_encoder_bias_gelu(y.data_ptr(), bias.data_ptr(), out.data_ptr(), y.shape[0], y.shape[1],
                                  torch.get_num_threads())


def encoder_ffn(ctx: torch.Tensor, weights: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
                biases: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
                norms: tuple[tuple[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]], eps: float,
                h: torch.Tensor, a: torch.Tensor, g: torch.Tensor, h16: torch.Tensor | None = None,
                a16: torch.Tensor | None = None, y: torch.Tensor | None = None) -> None:
    """A post-LayerNorm BERT layer's feed-forward half over R rows in one call (encoder.c's
    metrale_encoder_ffn_*): a = LayerNorm(W_o·ctx + b_o + h), then h = LayerNorm(W_down·GELU(W_up·a + b_up)
    + b_down + a), h rewritten in place; the same kernels in the same order as encoder_linear and
    encoder_add_norm called one by one (the same bits), without a return to Python between them.

    weights: the attention output's, up and down projections' packed weights (encoder_pack) of one dtype;
    biases: their float32 biases [H], [I], [H]; norms: the two LayerNorms' (weight, bias), float32 [H];
    h: float32 [R, H] (the residual in, the layer's output out). bfloat16 weights: ctx float32 (rounded to
    bfloat16 first, as torch's .to rounds) or bfloat16 [R, H] (rows may be strided); h16 (the output's
    bfloat16 copy), a16 and y bfloat16 [R, H], a float32 [R, H], g bfloat16 [R, I]. float32 weights: ctx,
    a float32 [R, H], g float32 [R, I]; h16, a16 and y unused. Every buffer but ctx contiguous. Raises
    RuntimeError without the kernels."""
    lib = _required()
    rows, hidden = h.shape
    assert ctx.stride(1) == 1 and tuple(ctx.shape) == (rows, hidden)
    assert g.shape[1] == biases[1].shape[0]
    weights_eps = _ffn_weight_pointers(weights, biases, norms, eps)
    buffers = _ffn_buffer_pointers(weights[0].dtype == torch.bfloat16, h, a, g, h16, a16, y)
    if weights[0].dtype == torch.bfloat16:
        assert ctx.dtype in (torch.float32, torch.bfloat16)
        lib.metrale_encoder_ffn_bf16(ctx.data_ptr(), int(ctx.dtype == torch.bfloat16), ctx.stride(0), rows, hidden,
                                     g.shape[1], *weights_eps, *buffers, torch.get_num_threads())
    else:
        assert ctx.dtype == torch.float32
        lib.metrale_encoder_ffn_f32(ctx.data_ptr(), ctx.stride(0), rows, hidden, g.shape[1], *weights_eps, *buffers,
                                    torch.get_num_threads())


def _ffn_weight_pointers(weights, biases, norms, eps: float) -> tuple:
    """The feed-forward's weights as encoder_ffn's and encoder_layer's C functions take them: (W_o, b_o, the first
    norm, W_up, b_up, W_down, b_down, the second norm, eps)."""
    (g1, b1), (g2, b2) = norms
    return (weights[0].data_ptr(), biases[0].data_ptr(), g1.data_ptr(), b1.data_ptr(), weights[1].data_ptr(),
            biases[1].data_ptr(), weights[2].data_ptr(), biases[2].data_ptr(), g2.data_ptr(), b2.data_ptr(), eps)


def _ffn_buffer_pointers(bf16: bool, h: torch.Tensor, a: torch.Tensor, g: torch.Tensor, h16: torch.Tensor | None,
                         a16: torch.Tensor | None, y: torch.Tensor | None) -> tuple:
    """The feed-forward's buffers checked (encoder_ffn's shapes, dtypes and layout for the bfloat16 form or the
    float32 one) and as the C functions take them: (h, h16, a, a16, y, g), or (h, a, g). Raises AssertionError."""
    rows, hidden = h.shape
    assert h.dtype == a.dtype == torch.float32 and tuple(a.shape) == (rows, hidden) and g.shape[0] == rows
    for t in (h, a, g) + tuple(t for t in (h16, a16, y) if t is not None):
        assert t.is_contiguous()
    if bf16:
        assert g.dtype == torch.bfloat16
        assert all(t is not None and t.dtype == torch.bfloat16 and tuple(t.shape) == (rows, hidden) for t in (h16, a16, y))
        return h.data_ptr(), h16.data_ptr(), a.data_ptr(), a16.data_ptr(), y.data_ptr(), g.data_ptr()
    assert g.dtype == torch.float32
    return h.data_ptr(), a.data_ptr(), g.data_ptr()


def encoder_layer(qkv_weight: torch.Tensor, qkv_bias: torch.Tensor, starts: torch.Tensor, lens: torch.Tensor,
                  n_heads: int, scale: float, qkv: torch.Tensor, ctx: torch.Tensor,
                  weights: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
                  biases: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
                  norms: tuple[tuple[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]], eps: float,
                  h: torch.Tensor, a: torch.Tensor, g: torch.Tensor, h16: torch.Tensor | None = None,
                  a16: torch.Tensor | None = None, y: torch.Tensor | None = None) -> None:
    """A whole post-LayerNorm BERT layer over R rows that are whole sequences, in one call (encoder.c's
    metrale_encoder_layer_*): q/k/v = W_qkv·x (+ b_qkv), the attention of each sequence alone, then
    encoder_ffn's steps; the same kernels in the same order as encoder_linear, encoder_attention(_bf16) and
    encoder_ffn called one by one (the same bits), without a return to Python between them.

    qkv_weight: the fused q/k/v projection's packed weight (encoder_pack, [3H, H]) and qkv_bias its float32
    bias [3H]; starts, lens: int64 [S], each sequence's first row (0 the first of these rows) and row count,
    covering the R rows; qkv [R, 3H] and ctx [R, H] contiguous buffers of the weights' dtype; the rest as
    encoder_ffn's, ctx the attention's output. bfloat16 weights: the input is h16 (the bias joins q/k/v inside
    the attention: encoder_attention_bf16, which must run here); float32: h. h (and h16) hold the layer's
    output after. Raises RuntimeError without the kernels, where the bfloat16 attention does not run, or out
    of memory (h and h16 then unchanged)."""
    encoder_layer_run(encoder_layer_weights(qkv_weight, qkv_bias, weights, biases, norms, eps),
                      encoder_layer_rows(starts, lens, n_heads, scale, qkv, ctx, h, a, g, h16, a16, y))


def encoder_layer_weights(qkv_weight: torch.Tensor, qkv_bias: torch.Tensor,
                          weights: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
                          biases: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
                          norms: tuple[tuple[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]],
                          eps: float) -> tuple:
    """A layer's half of encoder_layer's arguments (its docstring's weights, biases, norms and eps), checked and
    as the C function takes them: fixed while the tensors live, so a caller may make it once and run the layer
    over many groups of rows (encoder_layer_run). Holds the tensors (the pointers stay theirs). Raises
    AssertionError for weights of mixed dtypes or shapes that do not chain."""
    dtype, hidden, inter = qkv_weight.dtype, qkv_bias.shape[0] // 3, biases[1].shape[0]
    assert all(w.dtype == dtype for w in weights) and biases[0].shape[0] == biases[2].shape[0] == hidden
    return ((dtype, hidden, inter), (qkv_weight.data_ptr(), qkv_bias.data_ptr()),
            _ffn_weight_pointers(weights, biases, norms, eps), (qkv_weight, qkv_bias, weights, biases, norms))


def encoder_layer_rows(starts: torch.Tensor, lens: torch.Tensor, n_heads: int, scale: float, qkv: torch.Tensor,
                       ctx: torch.Tensor, h: torch.Tensor, a: torch.Tensor, g: torch.Tensor,
                       h16: torch.Tensor | None = None, a16: torch.Tensor | None = None,
                       y: torch.Tensor | None = None) -> tuple:
    """A group of rows' half of encoder_layer's arguments (its docstring's starts, lens, heads, scale and
    buffers), checked and as the C function takes them: the same for every layer that runs over those rows
    (encoder_layer_run). Holds the tensors (the pointers stay theirs). Raises AssertionError for buffers of
    other shapes, dtypes or layouts."""
    rows, hidden = h.shape
    assert qkv.is_contiguous() and ctx.is_contiguous() and tuple(qkv.shape) == (rows, 3 * hidden)
    assert tuple(ctx.shape) == (rows, hidden) and qkv.dtype == ctx.dtype
    buffers = _ffn_buffer_pointers(qkv.dtype == torch.bfloat16, h, a, g, h16, a16, y)
    starts, lens = starts.to(torch.int64).contiguous(), lens.to(torch.int64).contiguous()
    return ((qkv.dtype, hidden, g.shape[1]),
            (starts.data_ptr(), lens.data_ptr(), lens.shape[0], n_heads, scale, qkv.data_ptr(), ctx.data_ptr(), rows,
             hidden, g.shape[1]), buffers, (starts, lens, qkv, ctx, h, a, g, h16, a16, y))


def encoder_layer_run(layer: tuple, rows: tuple) -> None:
    """encoder_layer over `rows` (encoder_layer_rows) with `layer`'s weights (encoder_layer_weights), which must
    agree in dtype, hidden and intermediate size (else AssertionError). Raises RuntimeError as encoder_layer."""
    lib = _required()
    form, (qkv_weight, qkv_bias), weights_eps, _ = layer
    assert rows[0] == form, (rows[0], form)
    run = lib.metrale_encoder_layer_bf16 if form[0] == torch.bfloat16 else lib.metrale_encoder_layer_f32
    _attention_ran(run(qkv_weight, qkv_bias, *rows[1], *weights_eps, *rows[2], torch.get_num_threads()))


def encoder_add_bias(y: torch.Tensor, bias: torch.Tensor, out: torch.Tensor) -> None:
    """out = float(y) + bias: y bfloat16 [R, N], bias float32 [N], out float32 [R, N], contiguous. Raises
    RuntimeError without the kernels."""
    lib = _required()
    assert y.is_contiguous() and out.is_contiguous() and y.dtype == torch.bfloat16 and out.dtype == torch.float32
    lib.metrale_encoder_add_bias(y.data_ptr(), bias.data_ptr(), out.data_ptr(), y.shape[0], y.shape[1],
                                 torch.get_num_threads())


def encoder_add_norm(y: torch.Tensor, bias: torch.Tensor | None, residual: torch.Tensor,
                     norm: tuple[torch.Tensor, torch.Tensor], eps: float, out: torch.Tensor,
                     out16: torch.Tensor | None = None) -> None:
    """out = layer_norm(float(y) + bias + residual) (float32: torch's layer_norm, biased variance, eps inside the
    root, up to the order of the sums), and out16 = bfloat16(out) when given. Row by row: a row's result
    depends on that row alone.

    y: a linear's product [R, N], bfloat16 or float32 (then (y + bias) + residual in float32); bias: float32
    [N] (None: no bias, float32 y only); norm's weight and bias: float32 [N]; residual, out: float32 [R, N]
    (out may be residual, or y when y is float32); out16: bfloat16 [R, N] or None (bfloat16 y only); all
    contiguous. Raises RuntimeError without the kernels, ValueError for a float32 y with out16 or a bfloat16
    y without a bias."""
    lib = _required()
    for t in (y, residual, out) + (() if out16 is None else (out16,)):
        assert t.is_contiguous()
    assert residual.dtype == out.dtype == torch.float32 and y.shape == residual.shape == out.shape
    if y.dtype == torch.float32:
        if out16 is not None:
            raise ValueError("the float32 add_norm writes no bfloat16 copy")
        lib.metrale_encoder_add_norm_f32(y.data_ptr(), _ptr_or_none(bias), residual.data_ptr(), norm[0].data_ptr(),
                                         norm[1].data_ptr(), eps, out.data_ptr(), y.shape[0], y.shape[1],
                                         torch.get_num_threads())
        return
    if bias is None:
        raise ValueError("the bfloat16 add_norm needs the linear's bias")
    lib.metrale_encoder_add_norm(y.data_ptr(), bias.data_ptr(), residual.data_ptr(), norm[0].data_ptr(),
                                 norm[1].data_ptr(), eps, out.data_ptr(), _ptr_or_none(out16), y.shape[0], y.shape[1],
                                 torch.get_num_threads())


def block_rows(w: KernelWeight, ids: torch.Tensor) -> torch.Tensor:
    """Rows `ids` (int64 [T], each in [0, N)) of a block-format weight, dequantised: float32 [T, K]
    (e.g. embedding rows read from their Q8_0 blocks). Raises RuntimeError without the kernels."""
    lib = _required()
    ids = ids.to(torch.int64).contiguous()
    out = torch.empty((ids.shape[0], w.shape[1]), dtype=torch.float32)
    lib.metrale_block_rows(ctypes.byref(w.struct), w.shape[1], ids.data_ptr(), ids.shape[0], out.data_ptr())
    return out


def sample(logits: torch.Tensor, temperature: list[float], top_k: list[int], top_p: list[float],
           min_p: list[float], u: list[float], want_processed: list[bool] | None = None
           ) -> tuple[list[int], torch.Tensor | None]:
    """One token per row drawn from softmax(logits / T) after top_k, top_p and min_p (sample.c).

    logits: float32 [B, V]; per row: temperature (> 0), top_k (0: off), top_p (1: off), min_p (0:
    off) and u, a uniform number in [0, 1) (the token is the first id whose running probability
    exceeds it). want_processed: rows whose processed logits (x / T, -inf where removed) are
    returned too. Returns (B token ids, processed float32 [B, V] or None; rows not wanted there are
    undefined). Each row's token depends on its own inputs alone. Raises RuntimeError without the
    kernels or out of memory.
    """
    lib = _required()
    logits = logits.contiguous()
    b, v = logits.shape
    tokens = (ctypes.c_int64 * b)()
    processed = want = None
    if want_processed is not None and any(want_processed):
        processed = torch.empty_like(logits)
        want = (ctypes.c_uint8 * b)(*want_processed)
    floats, ints = ctypes.c_float * b, ctypes.c_int32 * b
    lib.metrale_sample(logits.data_ptr(), b, v, floats(*temperature), ints(*top_k), floats(*top_p),
                       floats(*min_p), (ctypes.c_double * b)(*u), _ptr_or_none(processed), want, tokens,
                       torch.get_num_threads())
    out = list(tokens)
    if b and min(out) < 0:
        raise RuntimeError("the sampler's scratch memory could not be allocated")
    return out, processed


def _ptr_or_none(t: torch.Tensor | None) -> int | None:
    return None if t is None else t.data_ptr()
