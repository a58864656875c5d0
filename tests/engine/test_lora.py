"""LoRA adapters in the engine: PEFT parity per architecture, mixed batches, slots, refusals, prefix cache."""
import json

import pytest
import torch

from inference.engine import kernels
from inference.engine.config import EngineConfig, ModelConfig
from inference.engine.llm_engine import LLMEngine
from inference.engine.lora import LoraError, LoraNotFound, load_adapter
from inference.engine.request import EngineRequest
from inference.engine.sampling_params import SamplingParams

from .tiny_adapters import make_tiny_adapter, peft_logits
from .tiny_models import make_tiny_model


def engine_for(folder, weights="model", **kw) -> LLMEngine:
    return LLMEngine(EngineConfig(model_path=str(folder), kv_cache_bytes=4 << 20, weights=weights, **kw))


def adapter(engine, name, path):
    return load_adapter(name, path, engine.model_config, engine.config.model_path, engine.config.max_lora_rank)


def logits_of(engine, prompt, decode, lora=None, chunk=None):
    """Logits float32 [len(prompt) + len(decode), V] of one sequence: prefill (in chunks of `chunk`),
    then one decode step per token."""
    seq = engine.add_request(EngineRequest(list(prompt), SamplingParams(temperature=0, max_tokens=len(decode) + 1),
                                           lora_name=lora))
    sched = engine.scheduler
    if chunk:
        sched.max_num_batched_tokens = chunk
    rows = []
    while seq.num_computed_tokens < len(prompt):
        batch = sched.schedule()
        rows.append(engine.runner.forward_logits(batch))
        for s, n in batch.items:
            s.num_computed_tokens += n
    for tok in decode:
        seq.token_ids.append(tok)
        batch = sched.schedule()
        assert batch.num_decodes == 1
        rows.append(engine.runner.forward_logits(batch))
        seq.num_computed_tokens += 1
    engine.abort(seq)
    return torch.cat(rows)


def tokens(n, seed):
    return torch.randint(3, 320, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


@pytest.mark.parametrize("arch", ["llama", "llama3", "mistral", "qwen2", "qwen3"])
def test_it_matches_peft_on_tiny_random_models(arch, tmp_path):
    """float weights: the engine's logits with an adapter equal PeftModel's within 1e-4, for an adapter
    on every projection, one with rank/alpha patterns and rsLoRA, and one on q/v only."""
    folder = make_tiny_model(arch, tmp_path / arch)
    variants = {
        "all": make_tiny_adapter(folder, tmp_path / "all", seed=1),
        "patterns": make_tiny_adapter(folder, tmp_path / "patterns", seed=2, r=4, alpha=16, use_rslora=True,
                                      rank_pattern={"down_proj": 2, "layers.1.self_attn.q_proj": 6},
                                      alpha_pattern={"v_proj": 3}),
        "qv": make_tiny_adapter(folder, tmp_path / "qv", seed=3, r=8, target_modules=["q_proj", "v_proj"]),
    }
    engine = engine_for(folder, kv_cache_dtype="float32")  # the exact KV cache: the math against PEFT's
    for name, path in variants.items():
        engine.add_lora(adapter(engine, name, path))
    prompt, decode = tokens(40, 1), tokens(8, 2)
    base = peft_logits(folder, None, prompt + decode)
    for name, path in variants.items():
        ref = peft_logits(folder, path, prompt + decode)
        assert (ref - base).abs().max().item() > 1e-2  # the adapter changes the logits
        ours = logits_of(engine, prompt, decode, lora=name)
        assert (ours - ref).abs().max().item() <= 1e-4, name
        chunked = logits_of(engine, prompt, decode, lora=name, chunk=16)
        assert (chunked - ref).abs().max().item() <= 1e-4, name
    assert (logits_of(engine, prompt, decode) - base).abs().max().item() <= 1e-4


def batch_logits(engine, prompts, decodes, loras):
    """Like logits_of for several sequences run in the same batches: a list of per-sequence logits."""
    seqs = [engine.add_request(EngineRequest(list(p), SamplingParams(temperature=0, max_tokens=len(d) + 1),
                                             lora_name=lo)) for p, d, lo in zip(prompts, decodes, loras)]
    out = {id(s): [] for s in seqs}
    sched = engine.scheduler

    def step():
        batch = sched.schedule()
        logits = engine.runner.forward_logits(batch)
        row = 0
        for s, n in batch.items:
            out[id(s)].append(logits[row:row + n])
            row += n
            s.num_computed_tokens += n

    while any(s.num_computed_tokens < s.num_prompt_tokens for s in seqs):
        step()
    for k in range(len(decodes[0])):
        for s, d in zip(seqs, decodes):
            s.token_ids.append(d[k])
        step()
    for s in seqs:
        engine.abort(s)
    return [torch.cat(out[id(s)]) for s in seqs]


@pytest.fixture(scope="module")
def llama_with_adapters(tmp_path_factory):
    root = tmp_path_factory.mktemp("lora")
    folder = make_tiny_model("qwen3", root / "qwen3")
    paths = {f"a{i}": make_tiny_adapter(folder, root / f"a{i}", seed=10 + i, r=2 + 2 * i) for i in range(3)}
    return folder, paths


@pytest.mark.parametrize("weights", ["model", "int8", "q4"])
def test_a_batch_mixing_three_adapters_and_the_base_gives_each_row_what_it_gives_alone(llama_with_adapters, weights):
    """With compact weights (int8, Q4 blocks) the rows take the compiled decode layers (the update
    inside the C call, after each weight format's GEMM): bit for bit; on the torch path within
    float rounding."""
    if weights != "model" and not kernels.available():
        pytest.skip("the compiled CPU kernels are unavailable")
    folder, paths = llama_with_adapters
    engine = engine_for(folder, weights)
    assert (engine.runner.fused is not None) == (weights != "model")
    for name, path in paths.items():
        engine.add_lora(adapter(engine, name, path))
    loras = ["a0", None, "a1", "a2"]
    prompts = [tokens(20 + 3 * i, 20 + i) for i in range(4)]
    decodes = [tokens(6, 30 + i) for i in range(4)]
    together = batch_logits(engine, prompts, decodes, loras)
    for p, d, lo, rows in zip(prompts, decodes, loras, together):
        alone = logits_of(engine, p, d, lora=lo)
        if weights != "model":
            assert torch.equal(rows, alone), lo
        else:
            assert (rows - alone).abs().max().item() <= 1e-5, lo
    # and the adapters do change what the rows give
    assert (together[0] - logits_of(engine, prompts[0], decodes[0])).abs().max().item() > 1e-2


def test_int8_weights_with_an_adapter_stay_within_the_base_models_kl_bound(llama_with_adapters):
    """The default quantized weights with an adapter lose no more than the base model does (the bound
    of test_model_parity's int8 test: mean KL <= 0.02 nats, max <= 0.15), against PEFT's exact logits."""
    if not kernels.available():
        pytest.skip("the compiled CPU kernels are unavailable")
    folder, paths = llama_with_adapters
    engine = engine_for(folder, "int8")
    engine.add_lora(adapter(engine, "a2", paths["a2"]))
    prompt, decode = tokens(30, 5), tokens(10, 6)
    exact = peft_logits(folder, paths["a2"], prompt + decode)
    base_int8 = logits_of(engine, prompt, decode)
    fast = logits_of(engine, prompt, decode, lora="a2")
    assert (fast - base_int8).abs().max().item() > 1e-2  # the update ran on the int8 path
    log_p, log_q = torch.log_softmax(exact, -1), torch.log_softmax(fast, -1)
    kl = (log_p.exp() * (log_p - log_q)).sum(-1)
    print("KL mean", kl.mean().item(), "max", kl.max().item())
    assert kl.mean().item() <= 0.02 and kl.max().item() <= 0.15


def test_it_refuses_folders_that_do_not_fit_the_served_model(llama_with_adapters, tmp_path):
    folder, paths = llama_with_adapters
    engine = engine_for(folder)
    cfg = engine.model_config
    with pytest.raises(LoraNotFound):
        adapter(engine, "x", tmp_path / "nowhere")
    other = make_tiny_model("llama", tmp_path / "qwen3")  # another shape under the served folder's name
    with pytest.raises(LoraError, match="lora_"):
        adapter(engine, "x", make_tiny_adapter(other, tmp_path / "llama_a"))
    with pytest.raises(LoraError, match="trained on"):  # its base model is another folder
        load_adapter("x", paths["a0"], cfg, str(tmp_path / "elsewhere"), 64)
    with pytest.raises(LoraError, match="exceeds"):
        load_adapter("x", paths["a2"], cfg, engine.config.model_path, 4)
    bad = tmp_path / "bad"
    make_tiny_adapter(folder, bad)
    config = json.loads((bad / "adapter_config.json").read_text())
    (bad / "adapter_config.json").write_text(json.dumps({**config, "target_modules": ["q_proj", "lm_head"]}))
    with pytest.raises(LoraError, match="lm_head"):
        adapter(engine, "x", bad)
    (bad / "adapter_config.json").write_text(json.dumps({**config, "use_dora": True}))
    with pytest.raises(LoraError, match="DoRA"):
        adapter(engine, "x", bad)
    (bad / "adapter_config.json").write_text(json.dumps({**config, "r": 3}))
    with pytest.raises(LoraError, match="rank 4"):
        adapter(engine, "x", bad)
    (bad / "adapter_config.json").write_text("{not json")
    with pytest.raises(LoraError, match="JSON"):
        adapter(engine, "x", bad)
    (bad / "adapter_config.json").write_text(json.dumps(config))
    (bad / "adapter_model.safetensors").write_bytes(b"garbage")
    with pytest.raises(LoraError, match="cannot be read"):
        adapter(engine, "x", bad)


def test_slots_are_bounded_names_unique_and_unknown_names_rejected(llama_with_adapters):
    from inference.engine.outputs import RequestRejected

    folder, paths = llama_with_adapters
    engine = engine_for(folder, max_loras=2)
    engine.add_lora(adapter(engine, "a0", paths["a0"]))
    with pytest.raises(ValueError, match="already loaded"):
        engine.add_lora(adapter(engine, "a0", paths["a1"]))
    engine.add_lora(adapter(engine, "a1", paths["a1"]))
    with pytest.raises(ValueError, match="METRALE_MAX_LORAS"):
        engine.add_lora(adapter(engine, "a2", paths["a2"]))
    with pytest.raises(RequestRejected, match="not loaded"):
        engine.add_request(EngineRequest([5, 6, 7], SamplingParams(max_tokens=2), lora_name="a2"))
    with pytest.raises(KeyError):
        engine.remove_lora("a2")
    engine.remove_lora("a1")
    engine.add_lora(adapter(engine, "a2", paths["a2"]))  # the freed slot serves another adapter
    off = engine_for(folder, max_loras=0)
    with pytest.raises(ValueError, match="off"):
        off.add_lora(adapter(off, "a0", paths["a0"]))


def test_loading_and_unloading_one_name_50_times_keeps_memory_flat(llama_with_adapters):
    """vLLM's unload long left its slot taken (a reload leaked a slot each time): here every unload
    frees the slot and drops the tensors, and a load_inplace reload replaces the old version."""
    import gc
    import weakref

    folder, paths = llama_with_adapters
    engine = engine_for(folder, max_loras=2)
    refs = []
    for i in range(50):
        a = adapter(engine, "a", paths["a2"])
        engine.add_lora(a)
        refs.append(weakref.ref(next(iter(a.modules.values()))[0]))
        if i % 2:
            engine.add_lora(adapter(engine, "a", paths["a1"]), replace=True)  # load_inplace
        assert engine.loras.num_bytes > 0
        engine.remove_lora("a")
        assert engine.loras.slots == [None, None] and engine.loras.num_bytes == 0
        del a
    gc.collect()
    assert all(r() is None for r in refs)  # no adapter's tensors outlive its unload


def test_an_unloaded_adapters_requests_in_flight_finish_on_it(llama_with_adapters):
    folder, paths = llama_with_adapters
    engine = engine_for(folder, max_loras=1)
    engine.add_lora(adapter(engine, "a0", paths["a0"]))
    prompt = tokens(12, 40)
    params = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)

    def run(name, unload_after=None):
        seq = engine.add_request(EngineRequest(prompt, params, lora_name=name))
        steps = 0
        while not seq.is_finished:
            engine.step()
            steps += 1
            if steps == unload_after:
                engine.remove_lora(name)
                assert engine.loras.slots[0] is not None  # still draining
        return seq.output_token_ids

    alone = run("a0")
    assert alone != run(None)
    assert run("a0", unload_after=2) == alone
    assert engine.loras.slots == [None]  # freed once its last request ended


def test_the_prefix_cache_never_serves_one_adapters_kv_to_another(llama_with_adapters):
    folder, paths = llama_with_adapters
    engine = engine_for(folder)
    engine.add_lora(adapter(engine, "a0", paths["a0"]))
    engine.add_lora(adapter(engine, "a1", paths["a1"]))
    prompt = tokens(70, 41)
    params = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)

    def run(name):
        seq = engine.add_request(EngineRequest(prompt, params, lora_name=name))
        while not seq.is_finished:
            engine.step()
        return seq.num_cached_tokens, seq.output_token_ids

    first = run("a0")
    assert first[0] == 0
    assert run("a0") == (69, first[1])  # the same adapter reuses its own blocks (4 full, 5 tokens of its tail)
    assert run("a1")[0] == 0 and run(None)[0] == 0
    engine.add_lora(adapter(engine, "a0", paths["a2"]), replace=True)
    assert run("a0")[0] == 0  # a reload under the same name is another adapter


def test_async_engine_loads_and_unloads_between_steps(llama_with_adapters):
    import asyncio

    from inference.engine.async_engine import AsyncEngine
    from inference.engine.lora_control import load_lora, loaded_loras, unload_lora
    from inference.engine.outputs import Failed, TokenEvent

    folder, paths = llama_with_adapters
    ae = AsyncEngine(engine_for(folder))

    async def run():
        a = await load_lora(ae, "a0", str(paths["a0"]))
        assert loaded_loras(ae) == {"a0": a} and a.slot >= 0
        with pytest.raises(ValueError):
            await load_lora(ae, "a0", str(paths["a0"]))
        with pytest.raises(LoraNotFound):
            await load_lora(ae, "a9", str(paths["a0"]) + "-missing")
        handle = ae.submit(EngineRequest([5, 6, 7], SamplingParams(max_tokens=3, ignore_eos=True), lora_name="a0"))
        events = [ev async for ev in handle]
        assert sum(isinstance(e, TokenEvent) for e in events) == 3
        await unload_lora(ae, "a0")
        with pytest.raises(KeyError):
            await unload_lora(ae, "a0")
        handle = ae.submit(EngineRequest([5, 6, 7], SamplingParams(max_tokens=3), lora_name="a0"))
        events = [ev async for ev in handle]
        assert isinstance(events[-1], Failed) and "not loaded" in events[-1].message

    try:
        asyncio.run(run())
    finally:
        ae.stop()
