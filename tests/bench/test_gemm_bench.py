"""The block-format GEMM micro-bench (inference/bench/gemm.py, manage.py bench_gemm): its weights are valid
blocks of each format, every cell is timed, and bad shapes are refused."""
import numpy as np
import pytest
import torch
from django.core.management import CommandError, call_command

from inference.bench.gemm import bench_gemm, per_byte_ratio, random_blocks
from inference.engine import kernels

needs_kernels = pytest.mark.skipif(not kernels.available(), reason="no C compiler here to build the CPU kernels")


@pytest.mark.parametrize("fmt", ["q4_1", "q8_0", "q4_k", "q5_k", "q6_k"])
def test_random_blocks_are_finite_weights_of_the_format(fmt):
    bw = random_blocks(20, 512, fmt, np.random.default_rng(0))
    assert bw.format == fmt and bw.shape == (20, 512)
    assert bool(torch.isfinite(bw.dequantize()).all())


@needs_kernels
def test_every_cell_is_timed_and_the_baseline_is_its_own_unit():
    figures = bench_gemm([(32, 256)], [1, 3], ["q4_1", "q4_k"], rounds=2, calls=2)
    assert [(f.fmt, f.rows) for f in figures] == [("q4_1", 1), ("q4_k", 1), ("q4_1", 3), ("q4_k", 3)]
    assert all(f.us > 0 and f.median_us > 0 and f.weight_bytes > 0 for f in figures)
    assert per_byte_ratio(figures[0], figures[0]) == 1.0


def test_the_command_refuses_a_k_that_is_not_whole_super_blocks():
    with pytest.raises(CommandError, match="multiple of 256"):
        call_command("bench_gemm", shapes="576x576")
