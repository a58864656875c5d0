"""The encoder's compiled steps (kernels/encoder.c): attention over packed sequences against SDPA on each
sequence alone (float32, and bfloat16 on the tile unit), the GELU and LayerNorm steps against torch's, and
the BERT encoder's compiled bfloat16 path against its torch steps."""
import math

import pytest
import torch
import torch.nn.functional as F

from inference.engine import kernels
from inference.engine.kernels.build import build
from inference.engine.models.bert import BertConfig, BertEncoder, PackedBatch

from .isa_builds import narrower_builds
from .test_bert_encoder import tiny_config

needs_kernels = pytest.mark.skipif(not kernels.available(), reason="no C compiler here to build the CPU kernels")
needs_amx = pytest.mark.skipif(not (kernels.available() and kernels.encoder_amx_attention(32)),
                               reason="this CPU has no AMX tile unit with bfloat16 (amx_bf16): the float32 attention "
                                      "is the one it runs, tested above")


def packed(lens, hidden, generator):
    lens = torch.tensor(sorted(lens))
    starts = torch.cat([torch.zeros(1, dtype=torch.long), lens.cumsum(0)[:-1]])
    qkv = torch.randn(int(lens.sum()), 3 * hidden, generator=generator) * 2
    return qkv, starts, lens


def sdpa_each(qkv, starts, lens, n_heads, dtype=torch.float32):
    hidden = qkv.shape[1] // 3
    out = torch.empty(qkv.shape[0], hidden)
    for s, n in zip(starts.tolist(), lens.tolist()):
        x = qkv[s:s + n].view(n, 3, n_heads, hidden // n_heads).permute(1, 2, 0, 3).to(dtype)
        out[s:s + n] = F.scaled_dot_product_attention(x[0], x[1], x[2]).float().transpose(0, 1).reshape(n, hidden)
    return out


@needs_kernels
@pytest.mark.parametrize("n_heads, head_dim", [(4, 8), (12, 32), (3, 48), (2, 64)])
def test_float32_attention_over_packed_sequences_equals_sdpa_on_each(n_heads, head_dim):
    g = torch.Generator().manual_seed(head_dim)
    qkv, starts, lens = packed([1, 2, 15, 16, 17, 31, 33, 100, 257], n_heads * head_dim, g)
    out = torch.full((qkv.shape[0], n_heads * head_dim), float("nan"))
    kernels.encoder_attention(qkv, starts, lens, n_heads, 1 / math.sqrt(head_dim), out)
    torch.testing.assert_close(out, sdpa_each(qkv, starts, lens, n_heads), atol=1e-5, rtol=1e-4)  # float32, summed in another order


@needs_kernels
@pytest.mark.parametrize("extra", narrower_builds() or [pytest.param((), marks=pytest.mark.skip(
    reason="this CPU has neither AVX-512 nor AVX2: the portable path is the only one and is tested above"))])
def test_every_instruction_set_path_of_the_attention_equals_sdpa(extra):
    import ctypes

    lib = ctypes.CDLL(str(build(extra)))
    lib.metrale_encoder_attention.argtypes = [ctypes.c_void_p, ctypes.c_long, ctypes.c_void_p, ctypes.c_void_p,
                                              ctypes.c_long, ctypes.c_int, ctypes.c_int, ctypes.c_float,
                                              ctypes.c_void_p, ctypes.c_long, ctypes.c_int]
    g = torch.Generator().manual_seed(3)
    for n_heads, head_dim in ((12, 32), (3, 40)):
        qkv, starts, lens = packed([1, 7, 16, 70], n_heads * head_dim, g)
        out = torch.empty(qkv.shape[0], n_heads * head_dim)
        lib.metrale_encoder_attention(qkv.data_ptr(), qkv.shape[1], starts.data_ptr(), lens.data_ptr(), len(lens),
                                      n_heads, head_dim, 1 / math.sqrt(head_dim), out.data_ptr(), out.shape[1], 2)
        torch.testing.assert_close(out, sdpa_each(qkv, starts, lens, n_heads), atol=1e-5, rtol=1e-4)  # float32, summed in another order


@needs_amx
@pytest.mark.parametrize("head_dim", [32, 64])
def test_bfloat16_attention_on_the_tile_unit_is_as_close_as_bfloat16_sdpa(head_dim):
    """Q, K, V and P in bfloat16 with float32 sums: as far from float32 SDPA as SDPA on bfloat16 inputs, from
    a bfloat16 product with no bias and from one plus its bias alike."""
    g = torch.Generator().manual_seed(head_dim)
    n_heads = 384 // head_dim
    qkv, starts, lens = packed([1, 5, 16, 17, 32, 33, 129, 256], 384, g)
    exact = sdpa_each(qkv, starts, lens, n_heads)
    bf16_error = (sdpa_each(qkv, starts, lens, n_heads, torch.bfloat16) - exact).abs().max().item()
    out = torch.empty(qkv.shape[0], 384, dtype=torch.bfloat16)
    kernels.encoder_attention_bf16(qkv.bfloat16(), torch.zeros(3 * 384), starts, lens, n_heads, 1 / math.sqrt(head_dim),
                                   out)
    assert (out.float() - exact).abs().max().item() <= 2 * bf16_error
    assert F.cosine_similarity(out.float().flatten(), exact.flatten(), 0) > 0.9999
    bias = torch.randn(3 * 384, generator=g)
    product = (qkv - bias).bfloat16()
    out16 = torch.empty(qkv.shape[0], 384, dtype=torch.bfloat16)
    kernels.encoder_attention_bf16(product, bias, starts, lens, n_heads, 1 / math.sqrt(head_dim), out16)
    exact = sdpa_each(product.float() + bias, starts, lens, n_heads)
    assert (out16.float() - exact).abs().max().item() <= 2 * bf16_error + 0.02


@needs_kernels
def test_bias_gelu_and_add_norm_equal_torch():
    g = torch.Generator().manual_seed(4)
    y = (torch.randn(37, 1536, generator=g) * 4).bfloat16()
    bias = torch.randn(1536, generator=g)
    out = torch.empty_like(y)
    kernels.encoder_bias_gelu(y, bias, out)
    ref = F.gelu(y.float() + bias)
    # erf within 1.5e-7, then one bfloat16 rounding: at most one unit in the last place apart
    assert ((out.float() - ref).abs() <= ref.abs() * 2 ** -7 + 1e-6).all()
    y = torch.randn(37, 384, generator=g).bfloat16()
    bias, residual = torch.randn(384, generator=g), torch.randn(37, 384, generator=g)
    norm = (torch.rand(384, generator=g) + 0.5, torch.randn(384, generator=g))
    out, out16 = torch.empty(37, 384), torch.empty(37, 384, dtype=torch.bfloat16)
    kernels.encoder_add_norm(y, bias, residual, norm, 1e-12, out, out16)
    ref = F.layer_norm(y.float() + bias + residual, (384,), *norm, 1e-12)
    torch.testing.assert_close(out, ref, atol=2e-5, rtol=1e-5)
    assert torch.equal(out16, out.bfloat16())
    y = torch.randn(5, 1152, generator=g).bfloat16()
    bias, out = torch.randn(1152, generator=g), torch.empty(5, 1152)
    kernels.encoder_add_bias(y, bias, out)
    assert torch.equal(out, y.float() + bias)


@needs_kernels
def test_the_compiled_bfloat16_steps_equal_the_torch_steps_and_reuse_their_buffers():
    """The bfloat16 encoder with its compiled steps against the same bfloat16 weights through torch's steps;
    a second pass (the kept buffers) and a pass running while another is half done give the same rows."""
    cfg = tiny_config(hidden_size=64, num_attention_heads=2, intermediate_size=128)
    enc = BertEncoder(BertConfig.from_dict(cfg), _tiny_weights(cfg), "bfloat16")
    assert enc.compiled_steps()
    torch.manual_seed(1)
    batch = PackedBatch.pack([torch.randint(0, 99, (n,)).tolist() for n in (1, 7, 33, 64, 2)])
    compiled = enc.forward(batch, 16)
    torch_steps = BertEncoder(BertConfig.from_dict(cfg), _tiny_weights(cfg), "bfloat16")
    torch_steps.compiled_steps = lambda: False
    ref = torch_steps.forward(batch, 16)
    assert F.cosine_similarity(compiled, ref).min().item() > 0.999
    assert torch.equal(enc.forward(batch, 16), compiled)
    first = enc.units(batch, lambda: 16)
    next(first), next(first)
    assert torch.equal(enc.forward(batch, 16), compiled)  # the buffers were taken: this pass made its own
    while True:
        try:
            next(first)
        except StopIteration as done:
            assert torch.equal(done.value, compiled)
            break


def _tiny_weights(cfg) -> dict:
    from transformers import BertConfig as HFBertConfig, BertModel

    torch.manual_seed(0)
    return BertModel(HFBertConfig(**cfg), add_pooling_layer=False).eval().state_dict()
