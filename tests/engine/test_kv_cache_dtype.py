"""The KV cache's dtype: bfloat16 (the default) and int8 against float32 (exact) on the same weights.

A bfloat16 KV cache rounds every stored K/V element to 8 significant bits, so its logits are not
float32's. These tests bound the difference the way the int8 paths are bounded
(test_block_weights.kl_and_agreement): the mean and largest KL(float32 KV || bfloat16 KV) of the
next-token distributions over a fixed corpus of prompt and decode rows, and the same greedy token
wherever float32's top-two margin exceeds a stated threshold. An int8 cache (METRALE_KV_CACHE_DTYPE=int8,
layers/kv_quant.py) is bounded the same way, with its rows' rule and its attention checked first. The
pool's accounting follows the dtype.
"""
import pytest
import torch

from inference.engine import kernels
from inference.engine.config import EngineConfig, ModelConfig
from inference.engine.layers import kv_quant
from inference.engine.llm_engine import LLMEngine
from inference.engine.model_runner import ModelRunner

from .test_block_weights import kl_and_agreement
from .test_model_parity import run_ours
from .tiny_models import make_tiny_model

CHATS = (
    ("Name three rivers of Europe.", "Three rivers of Europe are the Danube, the Rhine and the Seine. The Danube "
                                     "flows through Vienna and Budapest."),
    ("What is the capital of France?", "The capital of France is Paris. It is famous for the Eiffel Tower and the "
                                       "Louvre museum."),
    ("Write a haiku about the sea.", "Waves fold into foam, the salt wind carries gull cries, the tide keeps its time."),
)


def both_kv_dtypes(folder, corpus, kv_dtype=torch.bfloat16, **kw) -> tuple[torch.Tensor, torch.Tensor]:
    """Logits float32 [rows, V] of every (prompt, decode) pair of `corpus` with a float32 KV cache and
    with a `kv_dtype` one (run_ours's keywords `kw` for both), rows of all pairs concatenated."""
    exact = torch.cat([run_ours(folder, p, d, kv_dtype=torch.float32, **kw) for p, d in corpus])
    other = torch.cat([run_ours(folder, p, d, kv_dtype=kv_dtype, **kw) for p, d in corpus])
    return exact, other


def tiny_corpus() -> list[tuple[list[int], list[int]]]:
    """Three (prompt of 48, decode of 24) random token lists."""
    return [(torch.randint(3, 320, (48,), generator=torch.Generator().manual_seed(s)).tolist(),
             torch.randint(3, 320, (24,), generator=torch.Generator().manual_seed(100 + s)).tolist())
            for s in range(3)]


@pytest.mark.parametrize("weights", ["model", pytest.param("auto", marks=pytest.mark.skipif(
    not kernels.available(), reason="the default weights' compiled layers need a C compiler"))])
@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_a_bfloat16_kv_cache_keeps_a_tiny_models_distributions(arch, weights, tmp_path):
    """weights="model": the torch layers (float weights; prefill SDPA on K/V cast back from bfloat16,
    decode in the compiled attention kernel); "auto": the default path (int8 linears, the compiled
    decode layers for decode rows and short prompts). Chunked prefill, three prompts. Tiny random
    models' logits span about +-0.8: measured KL mean <= 6e-8, max <= 6e-7, largest logit change 0.0017."""
    folder = make_tiny_model(arch, tmp_path / arch)
    exact, half = both_kv_dtypes(folder, tiny_corpus(), chunk=20, weights=weights)
    assert 0 < (exact - half).abs().max().item() <= 5e-3  # the bfloat16 cache did take part
    kl, agree, confident = kl_and_agreement(exact, half, margin=0.02)
    assert kl.mean().item() <= 1e-6 and kl.max().item() <= 1e-5
    assert confident >= 100 and agree


def smollm2_corpus(folder) -> list[tuple[list[int], list[int]]]:
    from inference.engine.tokenizer import Tokenizer

    tok = Tokenizer.from_folder(folder)
    return [(tok.encode(tok.apply_chat_template([{"role": "user", "content": q}])), tok.encode(a)) for q, a in CHATS]


@pytest.mark.skipif(not kernels.available(), reason="the default weights' compiled layers need a C compiler")
def test_a_bfloat16_kv_cache_keeps_smollm2s_distributions_on_the_default_path(smollm2_blocks_dir):
    """The served default: the GGUF's blocks with int8 activation blocks (weights="auto") through the
    compiled layers, chunked prefill, on three chats (174 rows). The int8 activations' rounding turns
    the cache's small changes into changes of their own size (this bound is test_block_weights' bound
    for int8 activations against float32 ones): measured 2026-12-01 KL mean 0.0056, max 0.033, largest
    logit change 1.85 of logits spanning +-38; the 6 rows whose greedy token changed had float32
    margins under 0.34. On the exact weights (weights="model") the same corpus measured KL mean 5e-5,
    max 3.4e-4, no greedy token changed."""
    exact, half = both_kv_dtypes(smollm2_blocks_dir, smollm2_corpus(smollm2_blocks_dir), chunk=24, weights="auto")
    kl, agree, confident = kl_and_agreement(exact, half, margin=0.5)
    assert kl.mean().item() <= 0.01 and kl.max().item() <= 0.1
    assert confident >= 100 and agree


def test_the_default_kv_cache_is_bfloat16_and_the_pool_holds_twice_the_tokens(tmp_path):
    """The same byte budget holds twice as many blocks in bfloat16 as in float32 (and so the longest
    request the pool fits doubles); float32 stays selectable."""
    from inference.operations.runtime import engine_config

    assert EngineConfig(model_path="x").kv_cache_dtype == "bfloat16"
    assert engine_config({"MODEL": "x", "KV_CACHE_DTYPE": None}).kv_cache_dtype == "bfloat16"
    folder = make_tiny_model("llama", tmp_path / "m")  # max_position_embeddings 256
    budget = 6 * ModelRunner.kv_bytes_per_block(ModelConfig.from_folder(folder), 16, torch.float32)
    default = LLMEngine(EngineConfig(model_path=str(folder), kv_cache_bytes=budget))
    exact = LLMEngine(EngineConfig(model_path=str(folder), kv_cache_bytes=budget, kv_cache_dtype="float32"))
    assert default.kv_dtype == torch.bfloat16 and exact.kv_dtype == torch.float32
    assert default.runner.kv_caches[0][0].dtype == torch.bfloat16
    assert exact.runner.kv_caches[0][0].dtype == torch.float32
    assert exact.block_manager.num_blocks == 6 and default.block_manager.num_blocks == 12
    assert exact.max_request_tokens == 6 * 16 and default.max_request_tokens == 12 * 16
    assert sum(k.nbytes + v.nbytes for k, v in default.runner.kv_caches) == budget


def test_int8_rows_hold_each_value_within_half_a_step_of_their_scale():
    """kv_quant's rule: per (token, head), scale = amax / 127, values round(x * 127 / amax); the row
    carries its scale; the value read back is within scale / 2 of the value written; a zero row stays zero."""
    x = torch.randn(6, 3, 64, generator=torch.Generator().manual_seed(1)) * torch.tensor([0.01, 1.0, 40.0])[:, None]
    x[2, 1] = 0
    rows = kv_quant.quantize(x)
    assert rows.dtype == torch.int8 and rows.shape == (6, 3, 64 + kv_quant.SCALE_BYTES)
    step = x.abs().amax(-1, keepdim=True) / 127
    back = kv_quant.dequantize(rows)
    assert bool(((back - x).abs() <= step * (0.5 + 1e-5)).all())
    assert torch.equal(back[2, 1], torch.zeros(64))
    assert int(rows[..., :64].abs().max()) == 127  # each nonzero row's largest value takes the full range
    assert kv_quant.head_row_bytes(64, torch.int8) == 68 and kv_quant.head_row_bytes(64, torch.bfloat16) == 128


@pytest.mark.skipif(not kernels.available(), reason="the compiled decode attention needs a C compiler")
def test_int8_kv_decode_attention_stays_within_its_bound_of_float32():
    """The compiled decode attention on an int8 cache against SDPA on the float32 K/V it was made from
    (unit-normal q, K, V; GQA groups 3 and 8; contexts 1 to 100): measured at most 0.011 (bfloat16: 0.007)."""
    from .test_cpu_kernels import reference_decode_attention

    g = torch.Generator().manual_seed(3)
    for n_heads, n_kv, head_dim in ((9, 3, 64), (8, 1, 128)):
        k = torch.randn(40, 16, n_kv, head_dim, generator=g)
        v = torch.randn(40, 16, n_kv, head_dim, generator=g)
        lens = torch.tensor([1, 17, 100, 64, 33])
        tables = torch.stack([torch.randperm(40, generator=g)[:7] for _ in lens])
        q = torch.randn(len(lens), n_heads, head_dim, generator=g)
        out = kernels.paged_decode_attention(q, kv_quant.quantize(k), kv_quant.quantize(v), tables, lens,
                                             head_dim ** -0.5)
        exact = reference_decode_attention(q, k, v, tables, lens)
        assert 0 < (out - exact).abs().max().item() <= 0.03


@pytest.mark.parametrize("weights", ["model", pytest.param("auto", marks=pytest.mark.skipif(
    not kernels.available(), reason="the default weights' compiled layers need a C compiler"))])
@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_an_int8_kv_cache_keeps_a_tiny_models_distributions(arch, weights, tmp_path):
    """As the bfloat16 test above, with METRALE_KV_CACHE_DTYPE=int8: measured 2026-12-01 KL mean
    <= 3.8e-7, max <= 1.6e-6, largest logit change 0.0052 (bfloat16: 6e-8, 6e-7, 0.0017)."""
    folder = make_tiny_model(arch, tmp_path / arch)
    exact, q8 = both_kv_dtypes(folder, tiny_corpus(), kv_dtype=torch.int8, chunk=20, weights=weights)
    assert 0 < (exact - q8).abs().max().item() <= 0.01
    kl, agree, confident = kl_and_agreement(exact, q8, margin=0.02)
    assert kl.mean().item() <= 2e-6 and kl.max().item() <= 1e-5
    assert confident >= 100 and agree


def test_an_int8_pool_holds_the_tokens_its_rows_bytes_allow(tmp_path):
    """int8 rows are head_dim + 4 bytes (the scale): the pool's blocks, caches and longest request follow."""
    folder = make_tiny_model("llama", tmp_path / "m")  # head_dim 16, 2 KV heads, 2 layers
    cfg = ModelConfig.from_folder(folder)
    per_block = ModelRunner.kv_bytes_per_block(cfg, 16, torch.int8)
    assert per_block == 2 * 2 * 16 * 2 * (16 + 4)
    budget = 6 * ModelRunner.kv_bytes_per_block(cfg, 16, torch.float32)
    engine = LLMEngine(EngineConfig(model_path=str(folder), kv_cache_bytes=budget, kv_cache_dtype="int8"))
    assert engine.kv_dtype == torch.int8 and engine.block_manager.num_blocks == budget // per_block == 19
    k_cache = engine.runner.kv_caches[0][0]
    assert k_cache.dtype == torch.int8 and k_cache.shape == (19, 16, 2, 20)
    assert sum(k.nbytes + v.nbytes for k, v in engine.runner.kv_caches) == 19 * per_block <= budget
    assert engine.max_request_tokens == min(engine.max_model_len, 19 * 16)
