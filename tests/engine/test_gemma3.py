"""Gemma 3 through the whole engine: continuous batching, chunked prefill, prefix-cache hits and
preemption give transformers' greedy tokens on a tiny random Gemma 3 whose prompts pass its
24-token sliding window; the compiled decode step against the torch layers (int8, Q8_0 / Q4_1
blocks, K-quant super-blocks; both KV pools); the GGUF import of a tiny gemma3 file; the real
270M where pulled."""
import asyncio
import json
import shutil
from pathlib import Path

import pytest
import torch

from inference.engine import kernels
from inference.engine.async_engine import AsyncEngine
from inference.engine.config import ModelConfig
from inference.engine.request import EngineRequest
from inference.engine.sampling_params import SamplingParams
from inference.engine.sequence import Sequence

from .test_async_engine import LLMEngine_block_bytes, collect, make_engine
from .tiny_models import make_tiny_model

needs_kernels = pytest.mark.skipif(not kernels.available(), reason="no C compiler here to build the CPU kernels")

NEW = 12  # tokens generated per request


@pytest.fixture(scope="module")
def gemma_folder(tmp_path_factory):
    return make_tiny_model("gemma3", tmp_path_factory.mktemp("tiny") / "gemma3")


@pytest.fixture(scope="module")
def reference(gemma_folder):
    """transformers' greedy continuation (NEW tokens, float32, no KV cache) of a prompt, each prompt's once."""
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(gemma_folder, dtype=torch.float32).eval()
    done: dict[tuple[int, ...], list[int]] = {}  # prompt -> its continuation (several tests share prompts)

    def greedy(prompt: list[int]) -> list[int]:
        if tuple(prompt) not in done:
            ids = list(prompt)
            with torch.no_grad():
                for _ in range(NEW):
                    ids.append(int(model(torch.tensor([ids])).logits[0, -1].argmax()))
            done[tuple(prompt)] = ids[len(prompt):]
        return list(done[tuple(prompt)])

    return greedy


def prompts(lengths, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(3, 320, (n,), generator=g).tolist() for n in lengths]


def run_all(engine, ps, **kw):
    params = SamplingParams(temperature=0, max_tokens=NEW, ignore_eos=True)

    async def run():
        ae = AsyncEngine(engine)
        out = await asyncio.gather(*(collect(ae.submit(EngineRequest(p, params, **kw))) for p in ps))
        ae.stop()
        return out

    return asyncio.run(run())


@pytest.mark.parametrize("block_size, chunk", [(16, 512), (8, 20), (16, 7)])
def test_batched_requests_give_transformers_greedy_tokens(gemma_folder, reference, block_size, chunk):
    """Prompts shorter and longer than the window, decoding across it, in one batch; prefill in
    chunks that end inside and outside the window; window starts inside a block."""
    ps = prompts([10, 23, 40, 70])
    engine = make_engine(gemma_folder, block_size=block_size, max_num_batched_tokens=chunk)
    out = run_all(engine, ps)
    assert [tokens for tokens, _ in out] == [reference(p) for p in ps]
    assert engine.block_manager.num_free_blocks == engine.block_manager.num_blocks


def test_a_prefix_cache_hit_past_the_window_gives_the_same_tokens(gemma_folder, reference):
    prompt = prompts([70], seed=1)[0]
    engine = make_engine(gemma_folder)
    first, second, longer = (run_all(engine, [p])[0] for p in (prompt, prompt, prompt + [5, 6, 7]))
    assert first[0] == second[0] == reference(prompt)
    assert second[1].cached_tokens == 64 and longer[1].cached_tokens == 64
    assert longer[0] == reference(prompt + [5, 6, 7])


def test_preemption_gives_the_same_tokens(gemma_folder, reference):
    # 6 blocks of 16 tokens cannot hold four sequences of 40+ tokens at once.
    ps = prompts([40, 43, 46, 49], seed=2)
    small = make_engine(gemma_folder, kv_cache_bytes=6 * LLMEngine_block_bytes(gemma_folder))
    out = run_all(small, ps)
    assert small.scheduler.num_preemptions > 0
    assert [tokens for tokens, _ in out] == [reference(p) for p in ps]


def test_the_config_reads_gemma3_fields(gemma_folder):
    cfg = ModelConfig.from_folder(gemma_folder)
    assert cfg.architecture == "Gemma3ForCausalLM" and cfg.sliding_window == 24
    assert [cfg.is_sliding(i) for i in range(4)] == [True, True, False, True]
    assert (cfg.rope_theta, cfg.rope_local_theta) == (1_000_000.0, 10_000.0)
    assert cfg.attention_scale == 24 ** -0.5 and cfg.final_logit_softcapping == 30.0
    assert cfg.hidden_activation == "gelu_pytorch_tanh"


def test_the_kv_cost_of_a_token_is_reported(gemma_folder, caplog):
    with caplog.at_level("INFO", logger="metrale.engine"):
        engine = make_engine(gemma_folder, kv_cache_dtype="float32")
        one_pool = make_engine(gemma_folder, kv_cache_dtype="float32", window_pool=False)
    # (K + V) x 2 KV heads x 16 dims x 4 bytes = 256 B a layer: 1 full layer, 3 window layers
    assert (engine.kv_bytes_per_token, engine.window_kv_bytes_per_token) == (256, 768)
    assert "256 B of KV a token, 768 B more inside the 24-token window of 3 layers" in caplog.text
    assert (one_pool.kv_bytes_per_token, one_pool.window_kv_bytes_per_token) == (1024, 0)
    assert "1024 B of KV a token)" in caplog.text


def test_the_270m_matches_transformers_past_its_window(gemma3_float_dir):
    """The real Gemma 3 270M (the GGUF dequantized to float32): a 600-token prompt over its 512-token
    window, prefilled in chunks of 256, then decode steps. Every row's hidden state after the final norm
    (measured 1.4e-4 apart at values up to 104), and the logits (measured 6e-5 apart at values up to 47)
    of every row from position 496 on (the window's end, the rows past it, the decode steps) and of every
    16th row before: the LM head over the 262,144-token vocabulary on all 606 rows would cost as much
    as the layers."""
    from .test_model_parity import reference_logits, run_ours

    from inference.engine.tokenizer import Tokenizer

    tok = Tokenizer.from_folder(gemma3_float_dir)
    prompt = tok.encode((Path(__file__).parents[2] / "README.md").read_text(), add_special_tokens=True)[:600]
    decode = tok.encode(" The engine runs on CPUs.")
    rows = [*range(0, 496, 16), *range(496, len(prompt) + len(decode))]
    hidden, ours = run_ours(gemma3_float_dir, prompt, decode, chunk=256, logit_rows=rows)
    ref_hidden, ref = reference_logits(gemma3_float_dir, prompt + decode, logit_rows=rows)
    assert hidden.shape == ref_hidden.shape == (606, 640) and ours.shape == ref.shape == (len(rows), 262144)
    assert (hidden - ref_hidden).abs().max().item() <= 1e-3
    assert (ours - ref).abs().max().item() <= 5e-4
    assert torch.equal(ours.argmax(-1), ref.argmax(-1))


def test_the_pulled_270m_serves_its_gguf_blocks(gemma3_dir):
    """pull_model's folder: Q8_0 blocks kept (the tied embedding / head, attn_v), the rest float until
    K-quants and Q5_0 run as blocks; Gemma's turn format as the chat template; <end_of_turn> ends."""
    from inference.engine.tokenizer import Tokenizer

    config = json.loads((gemma3_dir / "config.json").read_text())
    assert config["architectures"] == ["Gemma3ForCausalLM"] and config["sliding_window"] == 512
    assert config["layer_types"].count("full_attention") == 3 and len(config["layer_types"]) == 18
    assert config["quantization_config"]["weights"]["model.embed_tokens.weight"] == "q8_0"
    tok = Tokenizer.from_folder(gemma3_dir)
    text = tok.apply_chat_template([{"role": "user", "content": "Hi"}])
    assert text == "<bos><start_of_turn>user\nHi<end_of_turn>\n<start_of_turn>model\n"
    assert tok.encode(text)[:3] == [2, 105, 2364]
    assert 106 in tok.eos_token_ids


def pools_whole(engine) -> bool:
    bm = engine.block_manager
    return all(p.num_free_blocks == p.num_blocks for p in (bm.full, bm.window))


def test_the_window_layers_keep_only_their_windows_blocks(gemma_folder, reference):
    """Block size 8, window 24: a decoding sequence's window layers hold at most 4 blocks (the window's
    3 and the one it starts in) while its full layers hold them all; the tokens are transformers'."""
    from inference.engine.block_manager import BlockManager

    engine = make_engine(gemma_folder, block_size=8)
    prompt = prompts([70], seed=3)[0]
    seq = engine.add_request(EngineRequest(prompt, SamplingParams(temperature=0, max_tokens=NEW, ignore_eos=True)))
    window = engine.block_manager.window
    held_most = full_most = 0
    while engine.has_work():
        engine.step()
        if seq.is_finished:
            break
        held = [b for b in seq.window_table if b != BlockManager.NO_BLOCK]
        assert len(seq.block_table) == -(-seq.num_computed_tokens // 8)
        assert window.num_blocks - window.num_free_blocks == len(held)
        held_most, full_most = max(held_most, len(held)), max(full_most, len(seq.block_table))
        assert len(held) <= 4
    assert held_most == 4 and full_most == 10  # 81 tokens computed at the last step
    assert seq.token_ids[len(prompt):] == reference(prompt)
    assert pools_whole(engine)


def test_beam_search_forks_both_pools_and_returns_them_whole(gemma_folder):
    from inference.engine.beam_search import BeamSpec
    from inference.serving.beam_search import beam_request

    prompt = prompts([40], seed=4)[0]
    results = []
    for window_pool in (True, False):
        engine = make_engine(gemma_folder, block_size=8, window_pool=window_pool)
        root = engine.add_request(beam_request(prompt, BeamSpec(3, 2), 10, [2]))
        outputs = []
        while engine.has_work():
            outputs += engine.step()
        (_, events), = [o for o in outputs if o[0] is root and o[1] and hasattr(o[1][-1], "beams")]
        results.append([(b.output, round(b.cum_logprob, 4)) for b in events[-1].beams])
        assert engine.block_manager.num_free_blocks == engine.block_manager.num_blocks
        if window_pool:
            assert pools_whole(engine)
    assert results[0] == results[1]


def test_rope_tables_grown_on_demand_equal_the_full_ones():
    from inference.engine.layers.rotary import RotaryEmbedding

    full = RotaryEmbedding(16, 300, 10_000.0, None)
    grown = RotaryEmbedding(16, 300, 10_000.0, None, first_rows=4)
    assert grown.cos.shape[0] == 4
    positions = torch.tensor([3, 250, 7])
    for a, b in zip(full.tables(positions, torch.float32), grown.tables(positions, torch.float32)):
        assert torch.equal(a, b)
    assert grown.cos.shape[0] == 251 and torch.equal(grown.cos, full.cos[:251])


# The linears of kquant_gemma: fused q/k/v and gate/up become stacks of two K-quant formats.
KQ_GEMMA = {"q_proj": "q4_k", "k_proj": "q4_k", "v_proj": "q6_k", "o_proj": "q5_k", "gate_proj": "q4_k",
            "up_proj": "q5_k", "down_proj": "q6_k"}


@pytest.fixture(scope="module")
def gemma64_folders(tmp_path_factory):
    """A tiny Gemma 3 with head_dim 64 (the attention's vector paths) at hidden 256 (whole K-quant
    super-blocks), its logits capped at 2 (so a missing cap shows), as floats and with its linears as
    K-quant super-blocks (KQ_GEMMA; the tied embedding float): {"float": folder, "kquant": folder}."""
    from safetensors.torch import load_file, save_file

    from inference.engine.layers.blocks import BlockWeight, quantization_config

    from .kquants import quantize_kquant

    tmp = tmp_path_factory.mktemp("gemma64")
    floats = make_tiny_model("gemma3", tmp / "float", hidden_size=256, intermediate_size=512, head_dim=64,
                             final_logit_softcapping=2.0)
    state = load_file(floats / "model.safetensors")
    formats = {}
    for name in list(state):
        fmt = KQ_GEMMA.get(name.split(".")[-2])
        if fmt:
            state.update(BlockWeight.from_gguf(quantize_kquant(state.pop(name).numpy(), fmt), fmt).tensors(name))
            formats[name] = fmt
    out = tmp / "kquant"
    shutil.copytree(floats, out)
    save_file(state, out / "model.safetensors", metadata={"format": "pt"})
    config = json.loads((out / "config.json").read_text())
    config["quantization_config"] = quantization_config(formats)
    (out / "config.json").write_text(json.dumps(config))
    return {"float": floats, "kquant": out}


def steps_engine(folder, *, weights, kv_dtype, window_pool=True, prefill="model"):
    """run_steps' engine: block size 8, chunks of 16, no prefix caching, no drafts."""
    return make_engine(folder, weights=weights, prefill_weights=prefill, kv_cache_dtype=kv_dtype, block_size=8,
                       window_pool=window_pool, max_num_batched_tokens=16, enable_prefix_caching=False,
                       speculative="off")


def run_steps(folder, prompt, decode, *, weights, kv_dtype, window_pool=True, fused=True, prefill="model",
              engine=None, prompt_logits=True):
    """Logits float32 [len(prompt) + len(decode), V] through an engine's block manager (both pools
    with window_pool, window blocks released as the window passes them) and runner, block size 8:
    the prompt in chunks of 16, then one decode step per token, each in the one call ModelRunner.execute
    makes for an all-decode step (decode_logits). fused=False: the same weights through the torch layers.
    engine: a steps_engine(folder, ...) to run on (its sequence's blocks are freed at the end, so the
    next run starts from whole pools; after a fused=False run it keeps to the torch layers), else a new
    one. prompt_logits=False: the prompt's rows run without the LM head and only the decode steps' logits
    [len(decode), V] come back."""
    if engine is None:
        engine = steps_engine(folder, weights=weights, kv_dtype=kv_dtype, window_pool=window_pool, prefill=prefill)
    runner, model = engine.runner, engine.runner.model
    assert (runner.fused is not None) == fused or not fused
    if not fused:
        runner.fused, runner.fused_prefill = None, False
    seq = Sequence("r", list(prompt), SamplingParams(temperature=0, max_tokens=len(decode) + 1))
    engine.scheduler.add(seq)
    rows = []

    def advance(batch):
        for s, n in batch.items:
            s.num_computed_tokens += n
        engine.block_manager.cache_full_blocks(seq)

    while seq.num_computed_tokens < len(prompt):
        batch = engine.scheduler.schedule()
        if prompt_logits:
            rows.append(runner.forward_logits(batch))
        else:
            ids, positions, meta, _ = runner.prepare(batch)
            model(ids, positions, runner.kv_caches, meta, runner.fused)
        advance(batch)
    for tok in decode:
        seq.token_ids.append(tok)
        batch = engine.scheduler.schedule()
        assert batch.num_decodes == 1
        ids, positions, meta, sample_rows = runner.prepare(batch)
        if fused:
            _, logits = model.decode_logits(ids, positions, meta, runner.fused, sample_rows)
            logits = logits.clone()  # the compiled step reuses its logits buffer
        else:
            hidden = model(ids, positions, runner.kv_caches, meta, None)
            logits = model.compute_logits(hidden[sample_rows], model.compact_rows(1, 1))
        rows.append(logits)
        advance(batch)
    engine.scheduler.finish(seq, "length")
    return torch.cat(rows)


# The Llama step's bounds (test_cpu_kernels.test_fused_decode_layers_match_the_torch_layers): bfloat16
# KV: a 1e-7 difference before the cast can round a K/V element one bf16 step apart; int8 KV: one int8 step.
# float32 KV: 2e-4 here (Llama's 1e-4): Gemma's six norms a layer give the torch and compiled sums more
# 1-ulp differences, which int8 activations' rounding turns into 1e-4 steps (measured: 1.4e-4 over 20
# steps at hidden 256; Qwen3 at the same size 7e-5).
BOUND = {"float32": 2e-4, "bfloat16": 5e-3, "int8": 1e-2}
# Block forms quantise activations per 32 (or 256): a value that the two paths' few-ulp difference moves
# across a rounding edge changes that block's integer by one. Where that value feeds only the step's own
# logits, a logit moves by up to ~5e-3 (measured 4.5e-3 on 2 of 20 steps, 6.6e-3 with Q8_0; on the others
# 2e-7). Where it feeds a later layer's K/V, that row is written off by the flip and every later step reads
# it, in any KV dtype: with Q4_1 weights and float32 KV (an AMD EPYC, AVX-512 VNNI), layer 1's attention
# output at position 50 held -78.50004 x (127 / amax) in the torch layers, 5 ulps from the half-way edge, so
# 79 there and 78 in the compiled step; layers 2 and 3 wrote K/V rows 0.024 and 0.029 apart, and the logits
# stayed 8e-3..1.4e-2 apart from that step on (moving that one value 5 ulps in the torch layers makes every
# step agree to 4e-7). Which value lands that near an edge follows the low bits of the whole run (the prompt's
# K/V come from torch's float GEMMs, whose kernels differ by CPU), so a machine sees such a flip or not: the
# max gets this bound (3e-2 for every KV dtype; bfloat16 or int8 KV round such a K/V row once more: measured
# 2.7e-2 for the K-quants on bfloat16), the median step the KV dtype's, which a real defect would exceed.
BLOCK_FLIP = {"float32": 3e-2, "bfloat16": 3e-2, "int8": 3e-2}


@needs_kernels
@pytest.mark.parametrize("form, kv_dtype, window_pool", [
    *[(form, kv, True) for form in ("int8", "q8", "q4", "kquant") for kv in BOUND],
    *[(form, "float32", False) for form in ("int8", "q8", "q4", "kquant")]])
def test_the_compiled_decode_step_gives_the_torch_layers_logits(gemma64_folders, form, kv_dtype, window_pool):
    """A 40-token prompt, then 20 decode steps past the 24-token window (its first key inside a block
    of 8) through the compiled step and through the torch layers on the same weights: int8, Q8_0 and
    Q4_1 blocks of the float model (q8, q4), the K-quant folder's super-blocks; the window layers in
    their own pool (released blocks cut from the tables) or in the full one."""
    folder = gemma64_folders["kquant" if form == "kquant" else "float"]
    weights = "auto" if form == "kquant" else form
    g = torch.Generator().manual_seed(7)
    prompt = torch.randint(3, 320, (40,), generator=g).tolist()
    decode = torch.randint(3, 320, (20,), generator=g).tolist()
    kw = dict(weights=weights, kv_dtype=kv_dtype, window_pool=window_pool)
    engine = steps_engine(folder, **kw)  # the compiled step's run, then the torch layers' on the same engine
    fused = run_steps(folder, prompt, decode, engine=engine, **kw)
    plain = run_steps(folder, prompt, decode, fused=False, engine=engine, **kw)
    per_step = (fused - plain).abs().amax(-1)
    assert per_step.max().item() <= (BOUND[kv_dtype] if form == "int8" else BLOCK_FLIP[kv_dtype])
    assert per_step.median().item() <= BOUND[kv_dtype]
    if form == "int8" and kv_dtype == "float32":  # and near transformers' float32 (int8 weights on decode rows)
        from .test_model_parity import reference_logits

        ref = reference_logits(folder, prompt + decode)
        assert (fused[:len(prompt)] - ref[:len(prompt)]).abs().max().item() <= 1e-4
        assert (fused - ref).abs().max().item() <= 0.05


@needs_kernels
def test_head_dim_16_and_prompt_rows_take_the_compiled_step_too(gemma_folder):
    """The 16-wide heads (the attention's portable path) and, with int8 prefill, the prompt rows of
    short contexts through the compiled layers, against the torch layers on the same int8 weights."""
    g = torch.Generator().manual_seed(8)
    prompt = torch.randint(3, 320, (45,), generator=g).tolist()
    decode = torch.randint(3, 320, (12,), generator=g).tolist()
    for prefill in ("model", "same"):
        kw = dict(weights="int8", kv_dtype="float32", prefill=prefill)
        engine = steps_engine(gemma_folder, **kw)
        fused = run_steps(gemma_folder, prompt, decode, engine=engine, **kw)
        plain = run_steps(gemma_folder, prompt, decode, fused=False, engine=engine, **kw)
        assert (fused - plain).abs().max().item() <= (1e-4 if prefill == "model" else 1e-3)  # measured 3e-5, 5e-5


@needs_kernels
def test_the_engine_on_the_compiled_step_gives_the_torch_layers_greedy_tokens(gemma64_folders):
    """Six requests (steps of 1 to 6 decode rows: the step's few-rows and shared forms) past the window,
    prefix hits, chunked prefill: the same greedy tokens on the compiled step as on the torch layers."""
    folder = gemma64_folders["float"]
    ps = prompts([10, 23, 40, 70, 33, 51], seed=5) + prompts([70], seed=5)[-1:]
    outs = []
    for fused in (True, False):
        engine = make_engine(folder, weights="int8", block_size=8, max_num_batched_tokens=32, speculative="off")
        assert engine.runner.fused is not None
        if not fused:
            engine.runner.fused = None
        outs.append([tokens for tokens, _ in run_all(engine, ps)])
        assert pools_whole(engine)
    assert outs[0] == outs[1]


@needs_kernels
def test_the_pulled_270m_compiled_step_is_as_close_to_its_float_weights_as_the_torch_layers(
        gemma3_dir, gemma3_float_dir):
    """The GGUF's blocks on the default decode path (int8 activation blocks; bfloat16 KV) through the
    compiled step and through the torch layers, each against the same GGUF dequantised to float32 with
    float32 activations and KV. Both stray from the float logits by the activations' rounding (measured:
    a max of 0.7-3 a step over a 262,144-token vocabulary, the compiled and torch paths as far from
    each other as from the float ones); a fault in the compiled layer would put it further off."""
    from inference.engine.tokenizer import Tokenizer

    tok = Tokenizer.from_folder(gemma3_dir)
    ids = tok.encode((Path(__file__).parents[2] / "README.md").read_text()[:3000], add_special_tokens=True)
    prompt, decode = ids[:20], ids[20:36]
    # The float logits of the decode tokens' positions in one pass (their tokens as prompt rows, chunks of 16):
    # the torch layers give the same logits to prompt rows as to decode steps (to ~1e-4, the 600-token test).
    ref = run_steps(gemma3_float_dir, prompt + decode, [], weights="model", kv_dtype="float32", fused=False)
    ref = ref[len(prompt):]
    # One engine on the GGUF's blocks for both paths: the compiled step first, then the torch layers; the
    # prompt's rows run without the LM head (their logits come from the exact weights, not compared).
    engine = steps_engine(gemma3_dir, weights="auto", kv_dtype="bfloat16")
    err = {}
    for fused in (True, False):
        ours = run_steps(gemma3_dir, prompt, decode, weights="auto", kv_dtype="bfloat16", fused=fused, engine=engine,
                         prompt_logits=False)
        err[fused] = (ours - ref).abs().amax(-1)
        agree = (ours.argmax(-1) == ref.argmax(-1)).float().mean().item()
        assert agree >= 0.8, (fused, agree)
    assert pools_whole(engine)
    assert err[True].median() <= 1.5 * err[False].median(), err
    assert err[True].max() <= 2 * err[False].max(), err
