"""An embedding is bitwise the same whatever else shares its pass and whatever the pass's size: all-MiniLM-L6-v2
in the served form (bfloat16 where the CPU multiplies it natively) over texts of mixed lengths, each alone, all 64
in one pass and in passes of 2 to 32 with random companions; and the encoder's batch-invariant linear
(kernels.encoder_linear) in both forms over row counts 1-64, the float32 form's bits (with its bias and GELU
too) the same on every instruction-set path."""
from __future__ import annotations

import random

import pytest
import torch

from inference.engine import kernels
from inference.engine.embedding_model import EmbeddingModel
from inference.engine.kernels.build import build
from tests.conftest import pulled_minilm

from .isa_builds import narrower_builds

pytestmark = pytest.mark.skipif(not kernels.available(), reason="the compiled kernels are not built here")

WORDS = ("the quick brown fox jumps over a lazy dog while rivers of data flow through seven silent servers "
         "embedding vectors cache retrieval documents compare kernels tokens batch invariant sum order "
         "Paris weather winter morning café naïve résumé 42 3.14 ✓ 東京").split()


def texts(n: int, low: int, high: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(low, high))) for _ in range(n)]


@pytest.fixture(scope="module")
def model():
    return EmbeddingModel(pulled_minilm(), "auto")


def test_a_text_embeds_to_the_same_bits_alone_and_in_passes_of_any_size(model):
    # Mixed lengths: 4 to 60 words (6 to ~100 tokens), and two near the model's 256-token limit.
    seqs = model.tokenize(texts(62, 4, 60, seed=46) + texts(2, 170, 180, seed=47))
    seqs = [model.truncate(s, model.max_input_tokens, True) for s in seqs]
    refs = [0, 1, 2, 3, 4, 5, 62, 63]   # embedded alone, then among companions in every pass below
    alone = torch.cat([model.embed([seqs[i]]) for i in refs])
    assert torch.equal(model.embed(seqs)[refs], alone)   # all 64 in one pass
    rng = random.Random(1)
    for size in (2, 3, 5, 8, 13, 32):
        mine = rng.sample(range(len(refs)), min(size, len(refs)) if size < 8 else len(refs) - 1)
        others = rng.sample(range(6, 62), size - len(mine)) if size > len(mine) else []
        group = [refs[i] for i in mine] + others
        rng.shuffle(group)
        got = model.embed([seqs[i] for i in group])
        for j, i in enumerate(group):
            if i in refs:
                assert torch.equal(got[j], alone[refs.index(i)]), (size, i)
    assert model.encoder.weights in ("float32", "bfloat16")


@pytest.mark.parametrize("dtype, n, k", [(torch.float32, 96, 80), (torch.bfloat16, 96, 80), (torch.bfloat16, 112, 384)])
def test_the_encoder_linear_gives_each_row_the_same_bits_whatever_the_rows_beside_it(dtype, n, k):
    """k 384 (a multiple of 32) takes the tile unit where Linux grants it (encoder.c's lin_amx), with 7 groups of
    16 columns (a block of 4 and 3 alone) and short row blocks; k 80 the vector path."""
    torch.manual_seed(0)
    w = torch.randn(n, k).to(dtype)
    bias = torch.randn(n) if dtype == torch.bfloat16 else None
    packed = kernels.encoder_pack(w)
    x = torch.randn(64, k).to(dtype)
    rows = [kernels.encoder_linear(x[i:i + 1], packed, n, bias, dtype == torch.bfloat16) for i in range(64)]
    for t in (2, 3, 4, 5, 7, 16, 33, 64):
        out = kernels.encoder_linear(x[:t], packed, n, bias, dtype == torch.bfloat16)
        assert torch.equal(out, torch.cat(rows[:t])), t
    # The sums are the product's (float32 to rounding; bfloat16 inputs exact in float32, the result rounded).
    ref = x.double() @ w.double().t()
    if dtype == torch.bfloat16:
        ref = torch.nn.functional.gelu(ref + bias.double())
    assert torch.allclose(torch.cat(rows).double(), ref, rtol=1e-2 if dtype == torch.bfloat16 else 1e-5,
                          atol=1e-2 * (k / 80) ** 0.5 if dtype == torch.bfloat16 else 1e-4)
    with pytest.raises(ValueError):
        kernels.encoder_pack(torch.randn(20, k).to(dtype))


@pytest.mark.parametrize("extra", narrower_builds() or [pytest.param((), marks=pytest.mark.skip(
    reason="this CPU has neither AVX-512 nor AVX2: the portable path is the only one"))])
def test_every_instruction_set_path_of_the_float32_encoder_linear_gives_the_same_bits(extra):
    """Each path blocks rows and columns its own way (AVX-512 4 x 64, AVX2 6 x 16, portable one element at a
    time); each output element is still one fmaf chain in K's order, its bias one addition and its GELU
    gelu_erf1's steps (gelu_erf8 on the vector paths), so the bits are the same with and without them."""
    import ctypes

    lib = ctypes.CDLL(str(build(extra)))
    torch.manual_seed(1)
    n, k = 80, 72
    packed, bias = kernels.encoder_pack(torch.randn(n, k)), torch.randn(n)
    for t in (1, 5, 6, 7, 13, 24):
        x = torch.randn(t, k) * 2
        for b, gelu in ((None, False), (bias, False), (bias, True)):
            out = torch.empty(t, n)
            lib.metrale_encoder_linear_f32(ctypes.c_void_p(x.data_ptr()), ctypes.c_long(k),
                                           ctypes.c_void_p(packed.data_ptr()),
                                           ctypes.c_void_p(None if b is None else b.data_ptr()), ctypes.c_int(gelu),
                                           ctypes.c_void_p(out.data_ptr()), ctypes.c_long(n), ctypes.c_long(t),
                                           ctypes.c_long(n), ctypes.c_long(k), 2)
            assert torch.equal(out, kernels.encoder_linear(x, packed, n, b, gelu)), (extra, t, b is None, gelu)
