"""The AMX paths of the block-format and K-quant linears (kernels/amx_gemm.c): every whole group of 16
activation rows on the tile unit, bit for bit what the vector paths give (the same int32 sums, the same
float steps), whatever rows are left over and however the rows fall into groups."""
import ctypes

import pytest
import torch

from inference.engine import kernels
from inference.engine.kernels.build import build, cpu_flags_text
from inference.engine.layers.blocks import BlockStack, BlockWeight

from .kquants import kquant_linear_reference, random_kquant

HAS_AMX = "amx_int8" in cpu_flags_text().split() and "amx_tile" in cpu_flags_text().split()
needs_amx = pytest.mark.skipif(not (HAS_AMX and kernels.available()),
                               reason="this CPU has no AMX tile unit (amx_int8): its vector paths are the ones it runs, "
                                      "tested bit for bit in test_block_weights.py and test_kquant_weights.py")
NO_AMX = ("-mno-amx-tile", "-mno-amx-int8")
BLOCK_FORMATS = ("q4_0", "q4_1", "q5_0", "q5_1", "q8_0")
K_FORMATS = ("q4_k", "q5_k", "q6_k")
# Rows: less than a group, a group, a group and one, two groups, a chunk with a tail, several chunks.
ROWS = (15, 16, 17, 32, 33, 70, 130)


@pytest.fixture(scope="module")
def vector_lib():
    """This machine's kernels built without the AMX paths (the AVX-512 VNNI ones)."""
    lib = ctypes.CDLL(str(build(NO_AMX)))
    lib.metrale_amx_ready.restype = ctypes.c_int
    lib.metrale_weight_linear.argtypes = [ctypes.POINTER(kernels.KernelWeight.Struct)] + [ctypes.c_void_p] * 2 + [
        ctypes.c_long] * 3 + [ctypes.c_int]
    return lib


def vector_linear(lib, x: torch.Tensor, w: kernels.KernelWeight) -> torch.Tensor:
    y = torch.empty(x.shape[0], w.shape[0])
    lib.metrale_weight_linear(ctypes.byref(w.struct), x.data_ptr(), y.data_ptr(), x.shape[0], w.shape[0], x.shape[1], 2)
    return y


@needs_amx
def test_the_library_takes_the_tile_unit_and_the_other_build_does_not(vector_lib):
    lib = kernels.library()
    lib.metrale_amx_ready.restype = ctypes.c_int
    assert lib.metrale_amx_ready() == 1
    assert vector_lib.metrale_amx_ready() == 0


@needs_amx
@pytest.mark.parametrize("fmt", BLOCK_FORMATS)
def test_amx_block_linears_give_the_vector_paths_bits(vector_lib, fmt):
    g = torch.Generator().manual_seed(11)
    for n, k in ((37, 64), (100, 640), (576, 1536)):
        w = kernels.KernelWeight.from_blocks(BlockWeight.quantize(torch.randn(n, k, generator=g), fmt))
        for m in ROWS:
            x = torch.randn(m, k, generator=g) * 3
            assert torch.equal(kernels.weight_linear(x, w), vector_linear(vector_lib, x, w)), (fmt, n, k, m)


@needs_amx
@pytest.mark.parametrize("fmt", K_FORMATS)
def test_amx_kquant_linears_give_the_vector_paths_bits_and_the_rule(vector_lib, fmt):
    g = torch.Generator().manual_seed(12)
    for n, k in ((37, 256), (100, 1024), (300, 2048)):
        bw = random_kquant(n, k, fmt, seed=n + k)
        w = kernels.KernelWeight.from_blocks(bw)
        for m in ROWS:
            x = torch.randn(m, k, generator=g) * 3
            y = kernels.weight_linear(x, w)
            assert torch.equal(y, vector_linear(vector_lib, x, w)), (fmt, n, k, m)
        assert torch.equal(y, kquant_linear_reference(x, bw)), (fmt, n, k)


@needs_amx
def test_a_row_gives_the_same_bits_in_a_group_of_16_and_alone():
    """A row's output never depends on the other rows: alone (vector path) or inside a group (tile unit)."""
    g = torch.Generator().manual_seed(13)
    x = torch.randn(48, 512, generator=g)
    for w in (kernels.KernelWeight.from_blocks(BlockWeight.quantize(torch.randn(70, 512, generator=g), "q5_0")),
              kernels.KernelWeight.from_blocks(random_kquant(70, 512, "q6_k", seed=4))):
        together = kernels.weight_linear(x, w)
        for r in (0, 15, 16, 47):
            assert torch.equal(kernels.weight_linear(x[r:r + 1], w)[0], together[r])


@needs_amx
def test_stacks_of_parts_take_the_tile_unit_part_by_part(vector_lib):
    """A fused linear of parts in different formats (Q5_0 q and k beside Q8_0 v, as Gemma 3's Q4_K_M ships
    them; Q4_K beside Q6_K): each part computed on the tile unit as the vector paths compute it."""
    g = torch.Generator().manual_seed(14)
    for parts in ([BlockWeight.quantize(torch.randn(n, 640, generator=g), f) for n, f in
                   ((64, "q5_0"), (16, "q5_0"), (16, "q8_0"))],
                  [random_kquant(40, 512, "q4_k", 1), random_kquant(19, 512, "q6_k", 3)]):
        w = kernels.KernelWeight.from_blocks(BlockStack.of(parts))
        for m in (16, 40):
            x = torch.randn(m, parts[0].shape[1], generator=g)
            assert torch.equal(kernels.weight_linear(x, w), vector_linear(vector_lib, x, w)), m
