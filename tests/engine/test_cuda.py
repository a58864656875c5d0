"""The engine's invariants on a CUDA device (parity with transformers on the GPU is
test_model_parity's device="cuda" case). CI machines have no GPU: these run where one is
present. The same checks, as a one-off script, ran on an NVIDIA H200 (torch 2.11.0+cu130) on
2026-11-30 and all held (fp32 logits within 4.2e-7 of transformers'); this file itself has not
run on a GPU yet."""
import pytest
import torch

from inference.engine.config import EngineConfig
from inference.engine.llm_engine import LLMEngine
from inference.engine.model_runner import ModelRunner
from inference.engine.sampling_params import SamplingParams
from inference.engine.request import EngineRequest

from .tiny_models import make_tiny_model

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device on this machine")


def _generate(engine, prompts, params, together=True):
    seqs = []
    for i, p in enumerate(prompts):
        seqs.append(engine.add_request(EngineRequest(p, params, request_id=f"r{i}-{len(seqs)}-{together}")))
        if not together:
            while engine.has_work():
                engine.step()
    while engine.has_work():
        engine.step()
    return [s.output_token_ids for s in seqs]


def test_the_engine_keeps_its_invariants_on_the_gpu(tmp_path):
    folder = make_tiny_model("llama", tmp_path / "llama")
    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(3, 320, (20 + 3 * i,), generator=g).tolist() for i in range(6)]
    greedy = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    engine = LLMEngine(EngineConfig(model_path=str(folder), device="cuda", dtype="float32", kv_cache_bytes=4 << 20))
    alone = _generate(engine, prompts, greedy, together=False)
    assert _generate(engine, prompts, greedy) == alone
    assert engine.block_manager.num_free_blocks == engine.block_manager.num_blocks
    block = ModelRunner.kv_bytes_per_block(engine.model_config, 16, engine.kv_dtype)
    small = LLMEngine(EngineConfig(model_path=str(folder), device="cuda", dtype="float32", kv_cache_bytes=8 * block))
    assert _generate(small, prompts, greedy) == alone  # with preemptions
    assert small.block_manager.num_free_blocks == small.block_manager.num_blocks
    seeded = SamplingParams(temperature=1.0, top_p=0.9, top_k=50, seed=1234, max_tokens=10, ignore_eos=True)
    assert _generate(engine, prompts[:1], seeded)[0] == _generate(engine, prompts[:3], seeded)[0]
