"""The encoder's compiled steps (kernels/encoder.c): attention over packed sequences against SDPA on each
sequence alone (float32, and bfloat16 on AMX's tile unit or AVX-512 BF16), the GELU and LayerNorm steps against torch's (the
float32 linear's bias and GELU epilogue and the float32 add + LayerNorm too, that linear's rows bitwise the
same whatever shares the call), and the BERT encoder's compiled paths against its torch steps."""
import math

import pytest
import torch
import torch.nn.functional as F

from inference.engine import kernels
from inference.engine.kernels.build import build
from inference.engine.models.bert import BertConfig, BertEncoder, PackedBatch

from .isa_builds import narrower_builds
from .test_bert_encoder import drain, tiny_config

needs_kernels = pytest.mark.skipif(not kernels.available(), reason="no C compiler here to build the CPU kernels")
needs_bf16_attention = pytest.mark.skipif(
    not (kernels.available() and kernels.encoder_bf16_attention(32)),
    reason="this CPU has neither AMX's tile unit with bfloat16 nor AVX-512 BF16: the float32 attention is the one it "
           "runs, tested above")


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


@needs_bf16_attention
@pytest.mark.parametrize("head_dim", [16, 32, 48, 64])
def test_bfloat16_attention_is_as_close_as_bfloat16_sdpa(head_dim):
    """Q, K, V and P in bfloat16 with float32 sums: as far from float32 SDPA as SDPA on bfloat16 inputs, from
    a bfloat16 product with no bias and from one plus its bias alike."""
    if kernels.encoder_bf16_attention(head_dim) is None:
        pytest.skip(f"the tile unit takes head_dim 32 or 64, not {head_dim}, and this CPU has no AVX-512 BF16")
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
def test_the_float32_linear_adds_its_bias_and_applies_the_exact_erf_gelu():
    g = torch.Generator().manual_seed(5)
    n, k = 96, 384
    w, bias = torch.randn(n, k, generator=g) / 20, torch.randn(n, generator=g)
    packed = kernels.encoder_pack(w)
    x = torch.randn(300, k, generator=g) * 2
    plain = kernels.encoder_linear(x, packed, n)
    torch.testing.assert_close(plain.double(), x.double() @ w.double().t(), atol=1e-5, rtol=1e-5)
    assert torch.equal(kernels.encoder_linear(x, packed, n, bias), plain + bias)  # one float32 addition
    gelu = kernels.encoder_linear(x, packed, n, bias, gelu=True)
    # Against the exact GELU (float64) of the same float32 sums: torch's own float32 GELU is itself up to
    # 1.03e-6 off it on the AVX-512 EPYC (its vectorized erf), ours 4.6e-7.
    assert (gelu.double() - F.gelu((plain + bias).double())).abs().max().item() <= 1e-6
    # the GELU alone over -12..12 (an identity weight): erf within 1.5e-7, so within 1e-6 of the exact GELU anywhere
    v = torch.linspace(-12, 12, 16 * 4096).view(-1, 16)
    out = torch.empty_like(v)
    assert kernels.encoder_linear(v, kernels.encoder_pack(torch.eye(16)), 16, gelu=True, out=out) is out
    assert (out.double() - F.gelu(v.double())).abs().max().item() <= 1e-6
    with pytest.raises(ValueError):
        kernels.encoder_linear(x, packed, n, bias[:16])
    with pytest.raises(ValueError):
        kernels.encoder_linear(x, packed, n, bias.double())


@needs_kernels
def test_a_packed_float32_encoder_linear_adds_its_bias_in_the_kernel_and_a_plain_one_refuses_to():
    from inference.engine.layers.linear import EncoderLinear

    g = torch.Generator().manual_seed(8)
    w, bias, x = torch.randn(48, 40, generator=g), torch.randn(48, generator=g), torch.randn(9, 40, generator=g)
    plain, packed = EncoderLinear(w, bias), EncoderLinear(w, bias)
    assert packed.pack() and packed.dtype == torch.float32
    torch.testing.assert_close(packed(x), plain(x), atol=1e-5, rtol=1e-5)
    assert torch.equal(packed(x), packed.product(x) + bias)
    fused = packed.product(x, bias=True, gelu=True)
    torch.testing.assert_close(fused, F.gelu(packed.product(x) + bias), atol=1e-6, rtol=0)
    with pytest.raises(ValueError):
        plain.product(x, bias=True)
    with pytest.raises(ValueError):
        EncoderLinear(w).product(x, bias=True)


@needs_kernels
@pytest.mark.parametrize("n", [384, 100])
def test_the_float32_add_norm_equals_torch_layer_norm(n):
    """out = layer_norm(y + bias + residual): n 100 takes the 8-lane loops and a 4-value tail; out may be y or the
    residual."""
    g = torch.Generator().manual_seed(n)
    y, residual = torch.randn(37, n, generator=g) * 3, torch.randn(37, n, generator=g)
    bias, norm = torch.randn(n, generator=g), (torch.rand(n, generator=g) + 0.5, torch.randn(n, generator=g))
    ref = F.layer_norm(y + bias + residual, (n,), *norm, 1e-12)
    out = torch.empty(37, n)
    kernels.encoder_add_norm(y, bias, residual, norm, 1e-12, out)
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=0)
    same = y.clone()
    kernels.encoder_add_norm(same, bias, residual, norm, 1e-12, same)
    assert torch.equal(same, out)
    same = residual.clone()
    kernels.encoder_add_norm(y, bias, same, norm, 1e-12, same)
    assert torch.equal(same, out)
    kernels.encoder_add_norm(y, None, residual, norm, 1e-5, out)
    torch.testing.assert_close(out, F.layer_norm(y + residual, (n,), *norm, 1e-5), atol=1e-5, rtol=0)
    with pytest.raises(ValueError):
        kernels.encoder_add_norm(y, bias, residual, norm, 1e-12, out, torch.empty(37, n, dtype=torch.bfloat16))


@needs_kernels
@pytest.mark.parametrize("extra", narrower_builds() or [pytest.param((), marks=pytest.mark.skip(
    reason="this CPU has neither AVX-512 nor AVX2: the portable path is the only one and is tested above"))])
def test_every_instruction_set_path_of_the_float32_add_norm_equals_torch(extra):
    import ctypes

    lib = ctypes.CDLL(str(build(extra)))
    p, f = ctypes.c_void_p, ctypes.c_float
    lib.metrale_encoder_add_norm_f32.argtypes = [p, p, p, p, p, f, p, ctypes.c_long, ctypes.c_long, ctypes.c_int]
    g = torch.Generator().manual_seed(6)
    y, residual = torch.randn(9, 100, generator=g) * 3, torch.randn(9, 100, generator=g)
    bias, norm = torch.randn(100, generator=g), (torch.rand(100, generator=g) + 0.5, torch.randn(100, generator=g))
    out = torch.empty(9, 100)
    lib.metrale_encoder_add_norm_f32(y.data_ptr(), bias.data_ptr(), residual.data_ptr(), norm[0].data_ptr(),
                                     norm[1].data_ptr(), 1e-12, out.data_ptr(), 9, 100, 2)
    torch.testing.assert_close(out, F.layer_norm(y + bias + residual, (100,), *norm, 1e-12), atol=1e-5, rtol=0)


@needs_kernels
@pytest.mark.parametrize("gelu", [False, True])
def test_the_fused_float32_linear_gives_each_row_the_same_bits_whatever_the_rows_and_threads(gelu):
    """Rows 1 to 64 in one call, on 1 and 2 threads: every row's bits are those it gets alone on one thread (the
    AVX2 path's 6-row blocks and the AVX-512 path's 4 x 4 groups both end short somewhere in that range)."""
    g = torch.Generator().manual_seed(7)
    n, k = 112, 96
    packed, bias = kernels.encoder_pack(torch.randn(n, k, generator=g) / 10), torch.randn(n, generator=g)
    x = torch.randn(64, k, generator=g)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        alone = torch.cat([kernels.encoder_linear(x[i:i + 1], packed, n, bias, gelu) for i in range(64)])
        for count in (1, 2):
            torch.set_num_threads(count)
            for t in range(1, 65):
                assert torch.equal(kernels.encoder_linear(x[:t], packed, n, bias, gelu), alone[:t]), (count, t)
    finally:
        torch.set_num_threads(threads)


@needs_kernels
@pytest.mark.parametrize("weights", ["bfloat16", "float32"])
def test_the_compiled_steps_equal_the_torch_steps_and_reuse_their_buffers(weights):
    """The encoder with its compiled steps against the same weights through torch's steps (bfloat16: the linears'
    bfloat16 products, rounded where the steps differ; float32: the same products, the erf GELU within 1.5e-7);
    a second pass (the kept buffers) and a pass running while another is half done give the same rows."""
    cfg = tiny_config(hidden_size=64, num_attention_heads=2, intermediate_size=128)
    enc = BertEncoder(BertConfig.from_dict(cfg), _tiny_weights(cfg), weights)
    assert enc.compiled_steps()
    torch.manual_seed(1)
    batch = PackedBatch.pack([torch.randint(0, 99, (n,)).tolist() for n in (1, 7, 33, 64, 2)])
    compiled = enc.forward(batch, 16)
    torch_steps = BertEncoder(BertConfig.from_dict(cfg), _tiny_weights(cfg), weights)
    torch_steps.compiled_steps = lambda: False
    ref = torch_steps.forward(batch, 16)
    if weights == "float32":
        torch.testing.assert_close(compiled, ref, atol=2e-5, rtol=0)
    assert F.cosine_similarity(compiled, ref).min().item() > 0.999
    assert torch.equal(enc.forward(batch, 16), compiled)
    first = enc.units(batch, lambda: 16)
    next(first), next(first)
    assert torch.equal(enc.forward(batch, 16), compiled)  # the buffers were taken: this pass made its own
    assert torch.equal(drain(first)[0], compiled)


def _tiny_weights(cfg) -> dict:
    from transformers import BertConfig as HFBertConfig, BertModel

    torch.manual_seed(0)
    return BertModel(HFBertConfig(**cfg), add_pooling_layer=False).eval().state_dict()


@needs_kernels
@pytest.mark.parametrize("form", ["float32", "bfloat16 from float32", "bfloat16 from bfloat16"])
def test_the_feed_forward_in_one_call_is_its_steps_one_by_one_bit_for_bit(form):
    g = torch.Generator().manual_seed(11)
    rows, hidden, inter, eps = 13, 64, 256, 1e-12
    dtype = torch.float32 if form == "float32" else torch.bfloat16
    ws = [torch.randn(n, k, generator=g) / 8 for n, k in ((hidden, hidden), (inter, hidden), (hidden, inter))]
    weights = tuple(kernels.encoder_pack(w.to(dtype)) for w in ws)
    biases = tuple(torch.randn(n, generator=g) for n in (hidden, inter, hidden))
    norms = tuple((torch.rand(hidden, generator=g) + 0.5, torch.randn(hidden, generator=g)) for _ in range(2))
    ctx = torch.randn(rows, 2 * hidden, generator=g)[:, :hidden]  # strided rows, as a q/k/v slice may be
    if form == "bfloat16 from bfloat16":
        ctx = ctx.bfloat16()
    residual = torch.randn(rows, hidden, generator=g)
    # the steps one by one
    x = ctx if dtype == torch.float32 or ctx.dtype == dtype else ctx.to(dtype)
    a = torch.empty(rows, hidden)
    a16 = torch.empty(rows, hidden, dtype=torch.bfloat16) if dtype == torch.bfloat16 else None
    kernels.encoder_add_norm(kernels.encoder_linear(x, weights[0], hidden), biases[0], residual, norms[0], eps, a, a16)
    up = kernels.encoder_linear(a16 if a16 is not None else a, weights[1], inter, biases[1], gelu=True)
    want = torch.empty(rows, hidden)
    want16 = torch.empty(rows, hidden, dtype=torch.bfloat16) if dtype == torch.bfloat16 else None
    kernels.encoder_add_norm(kernels.encoder_linear(up, weights[2], hidden), biases[2], a, norms[1], eps, want, want16)
    # in one call
    h = residual.clone()
    buffers = dict(a=torch.empty(rows, hidden), g=torch.empty(rows, inter, dtype=dtype))
    if dtype == torch.bfloat16:
        buffers |= dict(h16=torch.empty(rows, hidden, dtype=dtype), a16=torch.empty(rows, hidden, dtype=dtype),
                        y=torch.empty(rows, hidden, dtype=dtype))
    kernels.encoder_ffn(ctx, weights, biases, norms, eps, h, **buffers)
    assert torch.equal(h, want) and torch.isfinite(h).all()
    if dtype == torch.bfloat16:
        assert torch.equal(buffers["h16"], want16)


@needs_kernels
@pytest.mark.parametrize("weights", ["float32", "bfloat16"])
def test_a_whole_layer_in_one_call_is_its_steps_unit_by_unit_bit_for_bit(weights):
    """A layer runs as one kernel call a group of whole sequences that fit a unit (kernels.encoder_layer); its
    rows are the same bits as the same layer's steps one unit each, for one group, several, and a pass whose
    longer sequences are past a unit (one-call groups for the short ones, then steps for the rest)."""
    cfg = tiny_config(hidden_size=64, num_attention_heads=2, intermediate_size=128)
    enc = BertEncoder(BertConfig.from_dict(cfg), _tiny_weights(cfg), weights)
    torch.manual_seed(2)
    lens = (1, 7, 33, 64, 2, 40)
    batch = PackedBatch.pack([torch.randint(0, 99, (n,)).tolist() for n in lens])

    def run(chunk_rows):
        return drain(enc.units(batch, lambda: chunk_rows))

    layers = cfg["num_hidden_layers"]
    steps, step_units = run(0)  # no sequence fits: every step a unit of one row (attention: one sequence)
    assert step_units == 1 + layers * (147 + 6 + 147)
    one_call = weights == "float32" or kernels.encoder_bf16_attention(cfg["hidden_size"] // 2) is not None
    # 147 rows in length order 1 2 7 33 40 64: one group; [1 2 7 33 40] [64]; [1 2 7 33] [40] [64];
    # at 16 rows [1 2 7] in one call, then the 137 rows of 33 40 64 step by step (9 + 3 + 9 units)
    for chunk_rows, units in ((1 << 20, 1), (90, 2), (64, 3), (16, 1 + 9 + 3 + 9)):
        whole, count = run(chunk_rows)
        assert torch.equal(whole, steps), chunk_rows
        if one_call:
            assert count == 1 + layers * units, (chunk_rows, count)


@needs_kernels
@pytest.mark.parametrize("weights", ["float32", "bfloat16"])
def test_a_unit_never_covers_more_rows_than_its_limit_when_the_limit_shrinks_mid_pass(weights):
    """The runner shrinks chunk_rows (idle 1024 -> busy 32 rows) when chat work starts: from then on a one-call
    group covers no more rows than the limit read before it, the sequences that no longer fit run step by step,
    and the result is the same bits."""
    cfg = tiny_config(hidden_size=64, num_attention_heads=2, intermediate_size=128)
    enc = BertEncoder(BertConfig.from_dict(cfg), _tiny_weights(cfg), weights)
    torch.manual_seed(3)
    batch = PackedBatch.pack([torch.randint(0, 99, (n,)).tolist() for n in (1, 7, 33, 64, 2, 40, 5)])
    want = enc.forward(batch)
    limits, groups = iter([1024] + [8] * 10_000), []
    last = [None]

    def chunk_rows():
        last[0] = next(limits)
        return last[0]

    call = enc._layer_in_one_call

    def recorded(index, batch, group, *rest):
        groups.append((sum(batch.seq_lens[group[0]:group[1]]), last[0]))
        return call(index, batch, group, *rest)

    enc._layer_in_one_call = recorded
    got, _ = drain(enc.units(batch, chunk_rows))
    assert torch.equal(got, want)
    one_call = weights == "float32" or kernels.encoder_bf16_attention(cfg["hidden_size"] // 2) is not None
    if one_call:
        assert groups[0] == (152, 1024) and len(groups) > 1
    assert all(rows <= limit for rows, limit in groups), groups


@needs_kernels
@pytest.mark.parametrize("weights", ["float32", "bfloat16"])
def test_a_pass_of_no_sequences_gives_no_rows(weights):
    cfg = tiny_config(hidden_size=64, num_attention_heads=2, intermediate_size=128)
    enc = BertEncoder(BertConfig.from_dict(cfg), _tiny_weights(cfg), weights)
    none = torch.zeros(0, dtype=torch.int64)
    out = enc.forward(PackedBatch(none, none, none, [], [], []))
    assert out.shape == (0, 64) and out.dtype == torch.float32


@needs_kernels
def test_a_layer_s_kept_arguments_run_only_over_rows_of_its_form():
    """kernels.encoder_layer_run refuses a layer's kept weights (encoder_layer_weights) with a group's rows
    (encoder_layer_rows) of another dtype or width, before the C function reads a pointer."""
    cfg = tiny_config(hidden_size=64, num_attention_heads=2, intermediate_size=128)
    f32 = BertEncoder(BertConfig.from_dict(cfg), _tiny_weights(cfg), "float32")._layer_weights()[0]
    bf16, rows = torch.bfloat16, 4

    def group(dtype, inter=128):
        buffers = (torch.randn(rows, 64), torch.zeros(rows, 64), torch.zeros(rows, inter, dtype=dtype))
        extra = tuple(torch.zeros(rows, 64, dtype=bf16) for _ in range(3)) if dtype == bf16 else ()
        return kernels.encoder_layer_rows(torch.tensor([0]), torch.tensor([rows]), 2, 0.125,
                                          torch.zeros(rows, 192, dtype=dtype), torch.zeros(rows, 64, dtype=dtype),
                                          *buffers, *extra)
    for wrong in (group(bf16), group(torch.float32, inter=64)):
        with pytest.raises(AssertionError):
            kernels.encoder_layer_run(f32, wrong)
    right = group(torch.float32)
    h = right[3][4]
    before = h.clone()
    kernels.encoder_layer_run(f32, right)   # the same form runs: h is the layer's output now
    assert not torch.equal(h, before) and torch.isfinite(h).all()
