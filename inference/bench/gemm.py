"""The block-format GEMM micro-bench: each format's compiled linear (kernels.weight_linear) at given shapes
and row counts, timed in interleaved rounds, per call and per byte of packed weights.

Speed per byte is what decode pays (a step reads every weight once), so a format's figure is compared
to the baseline's (Q4_1) as time / packed bytes. The weights are random valid blocks: the kernels' work
does not depend on the values.
"""
from __future__ import annotations

import statistics
import time
from dataclasses import dataclass

import numpy as np
import torch

from ..engine import kernels
from ..engine.layers.blocks import K_FORMATS, SUPER_BLOCK_BYTES, BlockWeight

BASELINE = "q4_1"


def random_blocks(n: int, k: int, fmt: str, rng: np.random.Generator) -> BlockWeight:
    """A [n, k] weight in `fmt`: Q4_0 / Q4_1 / Q8_0 quantised from gaussian values (gguf-py), a K-quant as
    random super-block bytes with finite float16 scales (K a multiple of 256)."""
    if fmt not in K_FORMATS:
        return BlockWeight.quantize(torch.from_numpy(rng.standard_normal((n, k)).astype(np.float32)), fmt)
    size = SUPER_BLOCK_BYTES[fmt]
    raw = rng.integers(0, 256, (n, k // 256, size), dtype=np.uint8)
    scales = rng.uniform(1e-3, 1e-2, (n, k // 256, 2)).astype(np.float16).view(np.uint8)
    if fmt == "q6_k":
        raw[..., 208:210] = scales[..., :2]
    else:
        raw[..., 0:4] = scales
    return BlockWeight.from_gguf(raw.reshape(n, -1), fmt)


@dataclass(frozen=True, slots=True)
class GemmFigure:
    """One (format, shape, rows) cell: µs of CPU time per call in the fastest round (the process's CPU
    time: on a shared machine wall time also counts other processes' turns), the median round's wall
    µs per call, the packed weight bytes, and GB/s of weights read (bytes / CPU time)."""

    fmt: str
    n: int
    k: int
    rows: int
    us: float
    median_us: float
    weight_bytes: int

    @property
    def gb_per_s(self) -> float:
        return self.weight_bytes / (self.us * 1e-6) / 1e9


def bench_gemm(shapes: list[tuple[int, int]], rows: list[int], formats: list[str], rounds: int = 7,
               calls: int = 20, seed: int = 0) -> list[GemmFigure]:
    """Time y = x · wᵀ for every (shape (N, K), rows, format): `rounds` interleaved rounds (each runs every
    format `calls` times in turn, so a noisy neighbour hits them alike); each round's CPU and wall time
    per call. Run it with one torch thread for CPU times that mean anything (OpenMP workers spin).
    Raises RuntimeError without the compiled kernels."""
    if not kernels.available():
        raise RuntimeError("the compiled kernels are unavailable")
    rng = np.random.default_rng(seed)
    out = []
    for n, k in shapes:
        weights = {f: kernels.KernelWeight.from_blocks(random_blocks(n, k, f, rng)) for f in formats}
        for m in rows:
            x = torch.from_numpy(rng.standard_normal((m, k)).astype(np.float32))
            times: dict[str, list[float]] = {f: [] for f in formats}
            walls: dict[str, list[float]] = {f: [] for f in formats}
            for f in formats:  # warm-up: the weights in cache the same way for all
                kernels.weight_linear(x, weights[f])
            for _ in range(rounds):
                for f in formats:
                    t0, c0 = time.perf_counter(), time.process_time()
                    for _ in range(calls):
                        kernels.weight_linear(x, weights[f])
                    times[f].append((time.process_time() - c0) / calls * 1e6)
                    walls[f].append((time.perf_counter() - t0) / calls * 1e6)
            out += [GemmFigure(f, n, k, m, min(times[f]), statistics.median(walls[f]), weights[f].nbytes)
                    for f in formats]
    return out


def per_byte_ratio(figure: GemmFigure, baseline: GemmFigure) -> float:
    """(time / bytes) of a format over the baseline's at the same shape and rows: 1.0 = as fast per byte of
    weights; < 1 faster."""
    return (figure.us / figure.weight_bytes) / (baseline.us / baseline.weight_bytes)
