"""The engine thread: continuous batching, cancellation, deadlines, and the KV pool returning whole."""
import asyncio
import threading

import pytest
import torch

from inference.engine.async_engine import AsyncEngine
from inference.engine.config import EngineConfig
from inference.engine.llm_engine import LLMEngine
from inference.engine.outputs import Finished, RequestRejected, TokenEvent
from inference.engine.sampling_params import SamplingParams
from inference.engine.request import EngineRequest

from .tiny_models import make_tiny_model


@pytest.fixture(scope="module")
def tiny_folder(tmp_path_factory):
    return make_tiny_model("llama", tmp_path_factory.mktemp("tiny") / "llama")


def make_engine(folder, **kw) -> LLMEngine:
    """An engine on float weights unless the test asks for a compact format (the server's default)."""
    kw.setdefault("weights", "model")
    return LLMEngine(EngineConfig(model_path=str(folder), kv_cache_bytes=kw.pop("kv_cache_bytes", 4 << 20), **kw))


async def collect(handle):
    tokens, end = [], None
    async for ev in handle:
        if isinstance(ev, TokenEvent):
            tokens.append(ev.token_id)
        else:
            end = ev
    return tokens, end


def prompts(n, length=20, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(3, 320, (length + 3 * i,), generator=g).tolist() for i in range(n)]


# compact decode weights: the compiled decode layers; compact prefill too: the same GEMM on every row
@pytest.mark.parametrize("weights, prefill_weights", [("model", "same"), ("int8", "model"), ("int8", "same"),
                                                      ("q4", "model"), ("q4", "same"), ("q8", "same")])
def test_it_gives_each_request_the_same_tokens_batched_as_alone(tiny_folder, weights, prefill_weights):
    engine = make_engine(tiny_folder, step_log=True, weights=weights, prefill_weights=prefill_weights)
    ae = AsyncEngine(engine)
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)

    async def run():
        alone = [await collect(ae.submit(EngineRequest(p, params))) for p in prompts(6)]
        together = await asyncio.gather(*(collect(ae.submit(EngineRequest(p, params))) for p in prompts(6)))
        return alone, together

    alone, together = asyncio.run(run())
    assert [t for t, _ in alone] == [t for t, _ in together]
    assert all(isinstance(e, Finished) and e.reason == "length" for _, e in together)
    assert max(d + p for d, p, _ in engine.step_log) > 1
    assert engine.block_manager.num_free_blocks == engine.block_manager.num_blocks
    ae.stop()


def test_it_gives_seeded_requests_the_same_tokens_whatever_the_batch(tiny_folder):
    ae = AsyncEngine(make_engine(tiny_folder))
    seeded = SamplingParams(temperature=1.0, top_p=0.9, top_k=50, seed=1234, max_tokens=10, ignore_eos=True)
    other = SamplingParams(temperature=1.2, max_tokens=10, ignore_eos=True)
    p = prompts(3)

    async def run():
        alone = await collect(ae.submit(EngineRequest(p[0], seeded)))
        mixed = await asyncio.gather(collect(ae.submit(EngineRequest(p[1], other))), collect(ae.submit(EngineRequest(p[0], seeded))),
                                     collect(ae.submit(EngineRequest(p[2], other))))
        return alone, mixed[1]

    alone, batched = asyncio.run(run())
    assert alone[0] == batched[0]
    ae.stop()


def test_it_frees_the_pool_after_cancel_timeout_and_finish(tiny_folder):
    engine = make_engine(tiny_folder)
    ae = AsyncEngine(engine)
    long = SamplingParams(temperature=0, max_tokens=200, ignore_eos=True)

    async def run():
        h_cancel = ae.submit(EngineRequest(prompts(1)[0], long))
        got = 0
        async for ev in h_cancel:
            if isinstance(ev, TokenEvent):
                got += 1
                if got == 3:
                    h_cancel.abort()
            else:
                cancel_end = ev
                break
        timed = await collect(ae.submit(EngineRequest(prompts(1)[0], long, timeout_s=0.05)))
        done = await collect(ae.submit(EngineRequest(prompts(1)[0], SamplingParams(temperature=0, max_tokens=5))))
        return cancel_end, got, timed, done

    cancel_end, got, timed, done = asyncio.run(run())
    assert isinstance(cancel_end, Finished) and cancel_end.reason == "cancelled" and got < 200
    assert timed[1].reason == "timeout" and len(timed[0]) < 200
    assert done[1].reason in ("stop", "length")
    assert engine.block_manager.num_free_blocks == engine.block_manager.num_blocks
    assert not engine.scheduler.running and not engine.scheduler.waiting
    ae.stop()


def test_it_preempts_when_blocks_run_out_and_still_gives_the_same_tokens(tiny_folder):
    # A pool of 8 blocks of 16 tokens cannot hold four 60-token sequences at once.
    small = make_engine(tiny_folder, kv_cache_bytes=8 * LLMEngine_block_bytes(tiny_folder))
    big = make_engine(tiny_folder)
    params = SamplingParams(temperature=0, max_tokens=30, ignore_eos=True)
    ps = prompts(4, length=30, seed=3)

    async def run(engine):
        ae = AsyncEngine(engine)
        out = await asyncio.gather(*(collect(ae.submit(EngineRequest(p, params))) for p in ps))
        ae.stop()
        return [t for t, _ in out]

    assert asyncio.run(run(small)) == asyncio.run(run(big))
    assert small.scheduler.num_preemptions > 0 and big.scheduler.num_preemptions == 0
    assert small.block_manager.num_free_blocks == small.block_manager.num_blocks


def test_a_preempted_request_reports_each_prompt_logprob_once(tiny_folder):
    small = make_engine(tiny_folder, kv_cache_bytes=8 * LLMEngine_block_bytes(tiny_folder))
    big = make_engine(tiny_folder)
    params = SamplingParams(temperature=0, max_tokens=30, ignore_eos=True, prompt_logprobs=1)
    ps = prompts(4, length=30, seed=3)

    async def run(engine):
        ae = AsyncEngine(engine)
        out = await asyncio.gather(*(collect(ae.submit(EngineRequest(p, params))) for p in ps))
        ae.stop()
        return [end.prompt_logprobs for _, end in out]

    preempted, alone = asyncio.run(run(small)), asyncio.run(run(big))
    assert small.scheduler.num_preemptions > 0
    assert [len(lps) for lps in preempted] == [len(p) for p in ps]
    assert preempted == alone


def LLMEngine_block_bytes(folder, kv_dtype: str | None = None):
    """Bytes of one KV block of 16 tokens in `kv_dtype` (default: EngineConfig's, the engine's)."""
    from inference.engine.config import ModelConfig
    from inference.engine.model_runner import ModelRunner

    kv_dtype = kv_dtype or EngineConfig(model_path=str(folder)).kv_cache_dtype
    return ModelRunner.kv_bytes_per_block(ModelConfig.from_folder(folder), 16, getattr(torch, kv_dtype))


def test_it_refuses_a_request_that_can_never_fit(tiny_folder):
    ae = AsyncEngine(make_engine(tiny_folder))

    async def run():
        with pytest.raises(RequestRejected):
            ae.submit(EngineRequest(list(range(3, 200)), SamplingParams(max_tokens=100)))

    asyncio.run(run())
    ae.stop()


def test_it_refuses_token_ids_outside_the_vocabulary_and_serves_on(tiny_folder):
    """A prompt or prediction id past the vocabulary (or negative) is refused for that request alone, before it
    could index past the embedding rows; the engine then serves the next request."""
    engine = make_engine(tiny_folder)
    vocab = engine.model_config.vocab_size
    for prompt, prediction in (([3, vocab], None), ([-1, 4], None), ([3, 4], [5, vocab + 7])):
        with pytest.raises(RequestRejected, match="outside the vocabulary"):
            engine.add_request(EngineRequest(prompt, SamplingParams(max_tokens=2), prediction_token_ids=prediction))
    engine.add_request(EngineRequest([3, vocab - 1], SamplingParams(max_tokens=2, temperature=0)), request_id="ok")
    finished = []
    while engine.has_work():
        finished += [e for _, events in engine.step() for e in events if isinstance(e, Finished)]
    assert len(finished) == 1 and finished[0].completion_tokens == 2


def test_it_gives_the_same_tokens_and_prompt_logprobs_when_short_and_long_prompts_share_a_step(tiny_folder,
                                                                                              monkeypatch):
    """With int8 prefill, short prompts run through the compiled layers and long ones through torch's
    (model_runner.FUSED_PREFILL_MAX_CONTEXT), packed in a different order than the batch's: each
    request still gets its own prompt logprobs and the tokens it gets alone."""
    from inference.engine import kernels, model_runner

    if not kernels.available():
        pytest.skip("int8 prefill needs the compiled CPU kernels (no C compiler here)")
    monkeypatch.setattr(model_runner, "FUSED_PREFILL_MAX_CONTEXT", 40)
    engine = make_engine(tiny_folder, step_log=True, weights="int8")
    ae = AsyncEngine(engine)
    params = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True, prompt_logprobs=2)
    g = torch.Generator().manual_seed(5)
    mixed = [torch.randint(3, 320, (n,), generator=g).tolist() for n in (90, 12, 70, 25)]  # long, short, ...

    async def run():
        alone = [await collect(ae.submit(EngineRequest(p, params))) for p in mixed]
        together = await asyncio.gather(*(collect(ae.submit(EngineRequest(p, params))) for p in mixed))
        return alone, together

    alone, together = asyncio.run(run())
    for (tokens_a, end_a), (tokens_b, end_b), prompt in zip(alone, together, mixed):
        assert tokens_a == tokens_b and len(tokens_a) == 6
        assert len(end_b.prompt_logprobs) == len(prompt) and end_b.prompt_logprobs[0] is None
        assert end_a.prompt_logprobs == end_b.prompt_logprobs
    assert max(p for _, p, _ in engine.step_log) >= 2  # prompts did share steps (step_log: decodes, prefills, tokens)
    ae.stop()


def test_from_a_config_the_engine_thread_builds_the_engine_and_serves(tiny_folder):
    from inference.engine import llm_engine

    built_on = []
    real_init = llm_engine.LLMEngine.__init__

    def spy(self, config, *args):
        built_on.append(threading.current_thread().name)
        real_init(self, config, *args)

    llm_engine.LLMEngine.__init__ = spy
    try:
        ae = AsyncEngine(config=EngineConfig(model_path=str(tiny_folder), kv_cache_bytes=4 << 20,
                                             weights="model"))
    finally:
        llm_engine.LLMEngine.__init__ = real_init
    assert built_on == ["metrale-engine"]  # the thread that steps it, not the caller's
    params = SamplingParams(temperature=0, max_tokens=5, ignore_eos=True)

    async def run():
        return await collect(ae.submit(EngineRequest(prompts(1)[0], params)))

    tokens, end = asyncio.run(run())
    assert len(tokens) == 5 and isinstance(end, Finished) and end.reason == "length"
    ae.stop()
    assert not ae._thread.is_alive()


def test_a_config_that_cannot_load_raises_in_the_caller_and_leaves_no_thread(tmp_path):
    from inference.engine.config import ConfigError

    before = set(threading.enumerate())
    with pytest.raises(ConfigError, match="config.json"):
        AsyncEngine(config=EngineConfig(model_path=str(tmp_path / "missing"), kv_cache_bytes=4 << 20))
    assert not [t for t in set(threading.enumerate()) - before if t.name == "metrale-engine"]
    with pytest.raises(TypeError):
        AsyncEngine()
