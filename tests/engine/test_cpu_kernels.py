"""The compiled CPU kernels (inference/engine/kernels): int8 linear, paged decode attention and
whole decode layers, each against plain torch, and each row independent of its batch."""
import pytest
import torch
import torch.nn.functional as F

from inference.engine import kernels
from inference.engine.kernels.build import build
from inference.engine.layers import kv_quant
from inference.engine.layers.linear import quantize_int8
from .isa_builds import narrower_builds as _narrower_builds

from .test_model_parity import reference_logits, run_ours
from .tiny_models import make_tiny_model

pytestmark = pytest.mark.skipif(not kernels.available(), reason="no C compiler here to build the CPU kernels")


def int8_linear_reference(x, q, scale):
    """The documented rule of kernels.int8_linear in plain torch: each row quantised to int16
    with scale amax / A (round half to even, in float32), exact integer sums, then
    (float32(sum) * sx) * scale."""
    limit = kernels.activation_limit(x.shape[1])
    amax = x.abs().amax(dim=1, keepdim=True)
    xq = torch.round(x * (torch.tensor(float(limit)) / amax)).clamp(-limit, limit).to(torch.int64)
    sums = xq @ q.to(torch.int64).T
    return (sums.to(torch.float32) * (amax / limit)) * scale


@pytest.mark.parametrize("n, k", [(96, 64), (100, 72), (37, 13), (576, 1536), (17, 1)])
def test_int8_linear_follows_its_rule_bitwise_and_each_row_is_batch_independent(n, k):
    g = torch.Generator().manual_seed(n * k)
    q, scale = quantize_int8(torch.randn(n, k, generator=g))
    packed, scale = kernels.int8_pack(q), scale.float()
    exact = q.double() * scale.double()[:, None]
    for m in (1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 17, 33, 100):  # every micro-kernel and remainder shape
        x = torch.randn(m, k, generator=g)
        y = kernels.int8_linear(x, packed, scale)
        assert y.shape == (m, n) and y.dtype == torch.float32
        assert torch.equal(y, int8_linear_reference(x, q, scale))
        # Against the unquantised activations: within half a quantisation step per term.
        ref = x.double() @ exact.T
        step = x.abs().amax(dim=1, keepdim=True).double() / kernels.activation_limit(k)
        bound = 0.5 * step * exact.abs().sum(dim=1)[None, :] + 1e-5 * ref.abs().max()
        assert bool(((y.double() - ref).abs() <= bound).all())
        for row in range(m):  # bitwise: the same row alone gives the same floats
            assert torch.equal(kernels.int8_linear(x[row:row + 1], packed, scale)[0], y[row])




@pytest.mark.parametrize("extra", _narrower_builds() or [pytest.param((), marks=pytest.mark.skip(
    reason="this CPU has neither AVX2 nor AVX-512 VNNI: the scalar path is the only one and is tested above"))])
def test_every_instruction_set_path_gives_the_same_int8_linear_bitwise(extra):
    """The AVX-512 VNNI, AVX2 and scalar kernels sum the same integers: one machine's build and its
    narrower builds must agree bit for bit (a CI machine may be any of them)."""
    import ctypes

    lib = ctypes.CDLL(str(build(extra)))
    lib.metrale_kernels_isa.restype = ctypes.c_char_p
    narrower = "int8 GEMM avx2" if extra == ("-mno-avx512f",) else "int8 GEMM portable"
    assert lib.metrale_kernels_isa().decode().startswith(narrower)  # the path under test really was built
    lib.metrale_int8_linear.argtypes = [ctypes.c_void_p] * 4 + [ctypes.c_long] * 3 + [ctypes.c_int]
    g = torch.Generator().manual_seed(7)
    for n, k in ((576, 576), (37, 13), (100, 1536)):
        q, scale = quantize_int8(torch.randn(n, k, generator=g))
        packed, scale = kernels.int8_pack(q), scale.float()
        for m in (1, 3, 8, 12, 25, 100):
            x = torch.randn(m, k, generator=g)
            y = torch.empty(m, n)
            lib.metrale_int8_linear(x.data_ptr(), packed.data_ptr(), scale.data_ptr(), y.data_ptr(), m, n, k, 2)
            assert torch.equal(y, kernels.int8_linear(x, packed, scale)), (extra, n, k, m)
            assert torch.equal(y, int8_linear_reference(x, q, scale))


@pytest.mark.parametrize("extra", _narrower_builds() or [pytest.param((), marks=pytest.mark.skip(
    reason="this CPU has neither AVX2 nor AVX-512: the portable path is the only one and is tested below"))])
@pytest.mark.parametrize("kv_dtype", [torch.float32, torch.bfloat16, torch.int8])
def test_every_instruction_set_path_of_decode_attention_matches_sdpa(extra, kv_dtype):
    """The AVX2 and portable attention builds of this machine (CI machines differ) against SDPA."""
    import ctypes

    lib = ctypes.CDLL(str(build(extra)))
    lib.metrale_kernels_isa.restype = ctypes.c_char_p
    narrower = ", attention avx2" if extra == ("-mno-avx512f",) else ", attention portable"
    assert lib.metrale_kernels_isa().decode().endswith(narrower)
    c_p, c_l, c_i = ctypes.c_void_p, ctypes.c_long, ctypes.c_int
    lib.metrale_paged_decode_attention.argtypes = [c_p] * 6 + [c_l, c_i, c_i, c_i, c_i, c_l, ctypes.c_float, c_i, c_i]
    g = torch.Generator().manual_seed(3)
    for n_heads, n_kv, head_dim in ((9, 3, 64), (8, 1, 128)):
        k_cache = as_cache(torch.randn(40, 16, n_kv, head_dim, generator=g), kv_dtype)
        v_cache = as_cache(torch.randn(40, 16, n_kv, head_dim, generator=g), kv_dtype)
        lens = torch.tensor([1, 17, 100, 64, 33])
        tables = torch.stack([torch.randperm(40, generator=g)[:7] for _ in lens])
        q = torch.randn(len(lens), n_heads, head_dim, generator=g)
        out = torch.empty_like(q)
        lib.metrale_paged_decode_attention(q.data_ptr(), k_cache.data_ptr(), v_cache.data_ptr(), tables.data_ptr(),
                                           lens.data_ptr(), out.data_ptr(), len(lens), n_heads, n_kv, head_dim, 16, 7,
                                           head_dim ** -0.5, kernels.kv_dtype_code(kv_dtype), 2)
        ref = reference_decode_attention(q, k_cache, v_cache, tables, lens)
        assert (out - ref).abs().max().item() <= 1e-5, (extra, n_heads, head_dim)


@pytest.mark.parametrize("extra", [()] + _narrower_builds())
@pytest.mark.parametrize("kv_dtype", [torch.float32, torch.bfloat16, torch.int8])
def test_decode_attention_from_each_rows_first_key_matches_sdpa_over_its_keys(extra, kv_dtype):
    """seq_starts (a sliding window starting inside a table's first block): keys [start, len) attended,
    on every instruction-set path of this machine; rows of one table in a group (different starts and
    lens), a lone row, head_dim 64 / 128 (vector paths) and 48 (portable everywhere)."""
    import ctypes

    lib = ctypes.CDLL(str(build(extra)))
    c_p, c_l, c_i = ctypes.c_void_p, ctypes.c_long, ctypes.c_int
    lib.metrale_paged_decode_attention_strided.argtypes = [c_p, c_l] + [c_p] * 6 + [
        c_l, c_i, c_i, c_i, c_i, c_l, ctypes.c_float, c_i, c_i]
    g = torch.Generator().manual_seed(6)
    for n_heads, n_kv, head_dim in ((9, 3, 64), (8, 1, 128), (4, 2, 48)):
        k_cache = as_cache(torch.randn(40, 16, n_kv, head_dim, generator=g) * 3, kv_dtype)
        v_cache = as_cache(torch.randn(40, 16, n_kv, head_dim, generator=g), kv_dtype)
        shared = torch.randperm(40, generator=g)[:7]
        lens = torch.tensor([40, 41, 42, 60, 100, 17, 5, 33])
        starts = torch.tensor([9, 10, 15, 0, 99, 16, 0, 1])
        tables = torch.stack([shared] * 5 + [torch.randperm(40, generator=g)[:7] for _ in range(3)])
        q = torch.randn(len(lens), n_heads, head_dim, generator=g)
        for rows in (slice(None), slice(5, 6), slice(0, 3)):
            qs, ts, ls, ss = q[rows].contiguous(), tables[rows].contiguous(), lens[rows].contiguous(), starts[rows].contiguous()
            out = torch.empty_like(qs)
            lib.metrale_paged_decode_attention_strided(
                qs.data_ptr(), n_heads * head_dim, k_cache.data_ptr(), v_cache.data_ptr(), ts.data_ptr(), ls.data_ptr(),
                ss.data_ptr(), out.data_ptr(), len(ls), n_heads, n_kv, head_dim, 16, 7, head_dim ** -0.5,
                kernels.kv_dtype_code(kv_dtype), 2)
            ref = reference_decode_attention(qs, k_cache, v_cache, ts, ls, ss)
            assert (out - ref).abs().max().item() <= 1e-5, (extra, n_heads, head_dim, rows)


def test_int8_linear_keeps_zero_rows_zero_and_does_not_hide_inf_or_nan():
    q, scale = quantize_int8(torch.randn(40, 27))
    packed, scale = kernels.int8_pack(q), scale.float()
    x = torch.randn(5, 27)
    x[1] = 0
    x[2, 5] = float("inf")
    x[3, 9] = float("nan")  # inside the vectorised part
    x[4, 25] = float("nan")  # in the scalar tail (24 values are read 8 at a time)
    y = kernels.int8_linear(x, packed, scale)
    assert torch.equal(y[1], torch.zeros(40))
    assert bool(y[2:].isnan().all())
    assert torch.equal(y[0], kernels.int8_linear(x[:1], packed, scale)[0])


def as_cache(x: torch.Tensor, kv_dtype: torch.dtype) -> torch.Tensor:
    """float32 K or V [num_blocks, block_size, n_kv, head_dim] stored as a `kv_dtype` cache."""
    return kv_quant.quantize(x) if kv_dtype == torch.int8 else x.to(kv_dtype)


def reference_decode_attention(q, k_cache, v_cache, tables, lens, starts=None):
    """SDPA over each sequence's gathered blocks (the values the cache holds, in float32), keys
    [starts[d], lens[d]) of its table (starts None: from 0), one sequence at a time."""
    n_kv, head_dim = k_cache.shape[2], q.shape[2]
    group = q.shape[1] // n_kv
    out = []
    for d in range(q.shape[0]):
        first, length = 0 if starts is None else int(starts[d]), int(lens[d])
        k = kv_quant.load(k_cache[tables[d]], torch.float32).reshape(-1, n_kv, head_dim)[first:length].transpose(0, 1)
        v = kv_quant.load(v_cache[tables[d]], torch.float32).reshape(-1, n_kv, head_dim)[first:length].transpose(0, 1)
        qd = q[d].view(n_kv, group, head_dim)
        out.append(F.scaled_dot_product_attention(qd, k, v).reshape(-1, head_dim))
    return torch.stack(out)


@pytest.mark.parametrize("kv_dtype", [torch.float32, torch.bfloat16, torch.int8])
# group sizes 3, 1, 8 (two passes of 4 heads), 7 (4 + 3) and 6 (4 + 2); head_dim 128 (two 64-wide
# slabs); head_dim 48 takes the portable path
@pytest.mark.parametrize("n_heads, n_kv, head_dim", [(9, 3, 64), (4, 4, 64), (8, 1, 64), (14, 2, 128), (12, 2, 64),
                                                     (6, 2, 48)])
def test_paged_decode_attention_matches_sdpa(kv_dtype, n_heads, n_kv, head_dim):
    g = torch.Generator().manual_seed(n_heads)
    block_size, num_blocks = 16, 40
    k_cache = as_cache(torch.randn(num_blocks, block_size, n_kv, head_dim, generator=g), kv_dtype)
    v_cache = as_cache(torch.randn(num_blocks, block_size, n_kv, head_dim, generator=g), kv_dtype)
    lens = torch.tensor([1, 17, 100, 64, 33])
    width = 7
    tables = torch.stack([torch.randperm(num_blocks, generator=g)[:width] for _ in lens])
    q = torch.randn(len(lens), n_heads, head_dim, generator=g)
    out = kernels.paged_decode_attention(q, k_cache, v_cache, tables, lens, head_dim ** -0.5)
    ref = reference_decode_attention(q, k_cache, v_cache, tables, lens)
    assert (out - ref).abs().max().item() <= 1e-5
    for d in range(len(lens)):  # alone (one task per KV head) equals batched (one task per sequence)
        alone = kernels.paged_decode_attention(q[d:d + 1], k_cache, v_cache, tables[d:d + 1], lens[d:d + 1],
                                               head_dim ** -0.5)
        assert torch.equal(alone[0], out[d])


@pytest.mark.parametrize("kv_dtype", [torch.float32, torch.bfloat16, torch.int8])
@pytest.mark.parametrize("n_heads, n_kv, head_dim", [(9, 3, 64), (14, 2, 128), (6, 2, 48)])
def test_rows_that_share_a_block_table_attend_as_they_would_alone(kv_dtype, n_heads, n_kv, head_dim):
    """A sequence's verify (or prompt) rows read one block table at consecutive lengths; the kernel
    fetches each K/V row once for such a group (of at most 32 rows). Each row's output must be
    the same floats as that row attending alone, and match SDPA: groups of 1, 9 and 40 rows
    (40 splits into 32 + 8), lengths that end inside an 8-key group and across a KV block."""
    g = torch.Generator().manual_seed(n_heads * head_dim)
    block_size, num_blocks, width = 16, 60, 12
    k_cache = as_cache(torch.randn(num_blocks, block_size, n_kv, head_dim, generator=g), kv_dtype)
    v_cache = as_cache(torch.randn(num_blocks, block_size, n_kv, head_dim, generator=g), kv_dtype)
    shared = torch.randperm(num_blocks, generator=g)[:width]
    other = torch.randperm(num_blocks, generator=g)[:width]
    lens = torch.cat([torch.tensor([57]), 27 + torch.arange(9), torch.tensor([5]), 120 + torch.arange(40)])
    tables = torch.stack([other] + [shared] * 9 + [other] + [shared] * 40)
    q = torch.randn(len(lens), n_heads, head_dim, generator=g)
    out = kernels.paged_decode_attention(q, k_cache, v_cache, tables, lens, head_dim ** -0.5)
    ref = reference_decode_attention(q, k_cache, v_cache, tables, lens)
    assert (out - ref).abs().max().item() <= 1e-5
    for d in range(len(lens)):
        alone = kernels.paged_decode_attention(q[d:d + 1], k_cache, v_cache, tables[d:d + 1], lens[d:d + 1],
                                               head_dim ** -0.5)
        assert torch.equal(alone[0], out[d]), d
    # One group alone in a call (its rows split among the threads, where the kernel splits them): the same.
    for a, b in ((1, 10), (11, 51), (12, 15)):
        part = kernels.paged_decode_attention(q[a:b], k_cache, v_cache, tables[a:b], lens[a:b], head_dim ** -0.5)
        assert torch.equal(part, out[a:b]), (a, b)


@pytest.mark.parametrize("arch", ["llama", "llama3", "qwen2", "qwen3"])
@pytest.mark.parametrize("kv_dtype", [torch.float32, torch.bfloat16, torch.int8])
def test_fused_decode_layers_match_the_torch_layers(arch, kv_dtype, tmp_path, monkeypatch):
    """Decode rows through the compiled layers vs the torch layers with the same int8 weights."""
    from inference.engine.model_runner import ModelRunner

    folder = make_tiny_model(arch, tmp_path / arch)
    g = torch.Generator().manual_seed(2)
    prompt = torch.randint(3, 320, (40,), generator=g).tolist()
    decode = torch.randint(3, 320, (12,), generator=g).tolist()
    fused = run_ours(folder, prompt, decode, weights="int8", prefill="model", kv_dtype=kv_dtype)
    built = []
    original = ModelRunner.__init__

    def without_fused(self, *a, **kw):
        original(self, *a, **kw)
        built.append(self.fused is not None)
        self.fused = None

    monkeypatch.setattr(ModelRunner, "__init__", without_fused)
    plain = run_ours(folder, prompt, decode, weights="int8", prefill="model", kv_dtype=kv_dtype)
    assert built == [True]  # the first run did use the compiled layers
    # bfloat16 KV: a 1e-7 difference before the cast can round a K/V element one bf16 step apart;
    # int8 KV: one int8 step (the compiled write and kv_quant.quantize take the same steps)
    bound = {torch.float32: 1e-4, torch.bfloat16: 5e-3, torch.int8: 1e-2}[kv_dtype]
    assert (fused - plain).abs().max().item() <= bound
    if kv_dtype != torch.float32:
        return
    # and both stay close to transformers' float32 logits (int8 weights only on decode rows)
    ref = reference_logits(folder, prompt + decode)
    assert (fused[:len(prompt)] - ref[:len(prompt)]).abs().max().item() <= 1e-4
    assert (fused - ref).abs().max().item() <= 0.05


@pytest.mark.parametrize("arch", ["llama", "llama3", "qwen2", "qwen3"])
def test_prompt_rows_through_the_compiled_layers_match_the_torch_layers(arch, tmp_path, monkeypatch):
    """With int8 prefill, prompt rows of short contexts take the compiled layers (one attention row
    per token); the torch layers with the same int8 GEMM must give the same logits."""
    from inference.engine import model_runner

    folder = make_tiny_model(arch, tmp_path / arch)
    g = torch.Generator().manual_seed(4)
    prompt = torch.randint(3, 320, (45,), generator=g).tolist()
    decode = torch.randint(3, 320, (6,), generator=g).tolist()
    fused = run_ours(folder, prompt, decode, chunk=20, weights="int8")
    monkeypatch.setattr(model_runner, "FUSED_PREFILL_MAX_CONTEXT", 0)  # every prompt row through torch
    plain = run_ours(folder, prompt, decode, chunk=20, weights="int8")
    assert (fused - plain).abs().max().item() <= 1e-3
    assert (fused - reference_logits(folder, prompt + decode)).abs().max().item() <= 0.05


def test_without_the_kernels_the_torch_paths_still_match_transformers(tmp_path, monkeypatch):
    """METRALE_CPU_KERNELS=0 (or no compiler): masks, SDPA and torch's int8 kernel instead."""
    from inference.engine.model_runner import ModelRunner

    monkeypatch.setattr(kernels, "_load", lambda: None)
    assert not kernels.available()
    folder = make_tiny_model("llama", tmp_path / "llama")
    g = torch.Generator().manual_seed(3)
    prompt = torch.randint(3, 320, (30,), generator=g).tolist()
    decode = torch.randint(3, 320, (8,), generator=g).tolist()
    runners = []
    original = ModelRunner.__init__

    def spy(self, *a, **kw):
        original(self, *a, **kw)
        runners.append(self)

    monkeypatch.setattr(ModelRunner, "__init__", spy)
    ours = run_ours(folder, prompt, decode)
    assert not runners[0].decode_kernel and runners[0].fused is None
    assert (ours - reference_logits(folder, prompt + decode)).abs().max().item() <= 1e-4
    int8 = run_ours(folder, prompt, decode, weights="int8", prefill="model")
    assert runners[1].model.head.compact is None and runners[1].model.head.q is not None
    assert (int8 - ours).abs().max().item() <= 0.05
    # int8 prefill needs the compiled GEMM: without it prompt rows keep the float32 weights
    both = run_ours(folder, prompt, decode, weights="int8")
    assert not runners[2].model.compact_prefill and not runners[2].fused_prefill
    assert torch.equal(both[:len(prompt)], ours[:len(prompt)])


@pytest.mark.parametrize("weights", ["auto", "int8"])
def test_a_few_rows_give_bitwise_what_they_give_among_many(smollm2_blocks_dir, weights):
    """Steps of up to 4 rows take the compiled step's few-rows form (each thread keeps its own copy
    of the rows, six barriers a layer); larger steps the shared form. Each row's logits must be
    bitwise the same either way (decode_layer.c LEAN_ROWS): 1 and 3 of 8 decoding sequences alone
    against all 8, on SmolLM2's blocks and on per-channel int8."""
    from inference.engine.config import EngineConfig
    from inference.engine.llm_engine import LLMEngine
    from inference.engine.request import EngineRequest
    from inference.engine.sampling_params import SamplingParams

    engine = LLMEngine(EngineConfig(model_path=str(smollm2_blocks_dir), weights=weights, speculative="off",
                                    max_num_seqs=8, kv_cache_bytes=32 << 20, enable_prefix_caching=False))
    g = torch.Generator().manual_seed(5)
    for i in range(8):
        prompt = torch.randint(3, 40000, (20 + 7 * i,), generator=g).tolist()
        engine.add_request(EngineRequest(prompt, SamplingParams(temperature=0, max_tokens=20)), request_id=f"r{i}")
    for _ in range(4):
        engine.step()
    batch = engine.scheduler.schedule()
    assert batch.num_decodes == len(batch.items) == 8
    runner = engine.runner
    assert runner.fused is not None
    together = runner.execute(batch)
    for rows in ([5], [0, 3, 7]):
        alone = runner.execute(batch.subset(rows))
        assert alone.token_ids == [together.token_ids[i] for i in rows]
    many = runner.forward_logits(batch)
    for rows in ([2], [1, 4, 6], [0, 2, 5, 7]):
        assert torch.equal(runner.forward_logits(batch.subset(rows)), many[rows]), rows
