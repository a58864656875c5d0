"""Compiled CPU kernels (decode attention, int8 linear, decode layers), called on torch tensors through ctypes.

`available()` says whether they can be used (CPU build succeeded and
METRALE_CPU_KERNELS is not "0"); the callers fall back to plain torch otherwise.
The C sources are cpu_kernels.c (decode attention), int8_gemm.c (int8 linear) and
decode_layer.c (whole decode layers); build.py compiles and caches them.
"""
from __future__ import annotations

import ctypes
import logging
import os
import threading

import torch

from .build import KernelBuildError, build

log = logging.getLogger("metrale.engine")

_lib: ctypes.CDLL | None = None
_tried = False
_lock = threading.Lock()

_P = ctypes.c_void_p
_L = ctypes.c_long
_I = ctypes.c_int


def _load() -> ctypes.CDLL | None:
    global _lib, _tried
    with _lock:
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
        lib.metrale_int8_linear.argtypes = [_P, _P, _P, _P, _L, _L, _L, _I]
        lib.metrale_int8_linear.restype = None
        lib.metrale_int8_pack.argtypes = [_P, _P, _L, _L]
        lib.metrale_int8_pack.restype = None
        lib.metrale_kernels_isa.argtypes = []
        lib.metrale_kernels_isa.restype = ctypes.c_char_p
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
    "int8 GEMM avx512-vnni, attention avx512" or "int8 GEMM avx2, attention avx2"; "unavailable"
    where the kernels are not loaded."""
    lib = _load()
    return lib.metrale_kernels_isa().decode() if lib is not None else "unavailable"


_KV_DTYPES = {torch.float32: 0, torch.bfloat16: 1}


def supports_kv_dtype(dtype: torch.dtype) -> bool:
    """The decode attention kernel reads float32 and bfloat16 KV caches."""
    return dtype in _KV_DTYPES


def kv_dtype_code(dtype: torch.dtype) -> int:
    """The kernels' code for a KV cache dtype: 0 float32, 1 bfloat16. Raises KeyError for others."""
    return _KV_DTYPES[dtype]


def paged_decode_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                           block_tables: torch.Tensor, seq_lens: torch.Tensor, scale: float) -> torch.Tensor:
    """softmax(q·Kᵀ·scale)·V for one new token per sequence, reading K/V through block tables.

    q: float32 [D, n_heads, head_dim]; k_cache, v_cache: [num_blocks, block_size, n_kv,
    head_dim] float32 or bfloat16; block_tables: int64 [D, width]; seq_lens: int64 [D]
    (tokens attended, the new one included). Returns float32 [D, n_heads, head_dim].
    Raises RuntimeError if the kernels are unavailable.
    """
    lib = _required()
    q = q.contiguous()
    d, n_heads, head_dim = q.shape
    _, block_size, n_kv, _ = k_cache.shape
    out = torch.empty_like(q)
    lib.metrale_paged_decode_attention(
        q.data_ptr(), k_cache.data_ptr(), v_cache.data_ptr(), block_tables.data_ptr(), seq_lens.data_ptr(),
        out.data_ptr(), d, n_heads, n_kv, head_dim, block_size, block_tables.shape[1], scale,
        kv_dtype_code(k_cache.dtype), torch.get_num_threads())
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
