"""Beam search against a brute-force reference on a tiny model, and its request rules."""
import asyncio

import pytest
import torch

from inference.engine.async_engine import AsyncEngine
from inference.serving.beam_search import Beam, BeamSpec, beam_request, beam_result, score, search
from inference.serving.errors import ApiError
from inference.serving.protocol import ChatCompletionRequest, CompletionRequest, validate

from ..engine.test_async_engine import make_engine, prompts
from ..engine.tiny_models import make_tiny_model


@pytest.fixture(scope="module")
def tiny_folder(tmp_path_factory):
    return make_tiny_model("llama", tmp_path_factory.mktemp("tiny") / "llama")


def reference(hf, prompt, spec: BeamSpec, max_tokens: int, eos: set[int]) -> list[Beam]:
    """vLLM's beam search written plainly over transformers: every beam's next-token logprobs from a full
    forward of its whole sequence (no KV cache), the top 2 * width candidates of each, EOS ones complete."""
    live, done = [Beam(list(prompt))], []
    for _ in range(max_tokens):
        grown = []
        for beam in live:
            with torch.no_grad():
                lp = hf(torch.tensor([beam.tokens])).logits[0, -1].float().log_softmax(-1)
            values, ids = lp.topk(2 * spec.width)
            for t, v in zip(ids.tolist(), values.tolist()):
                child = Beam(beam.tokens + [t], beam.cum_logprob + v, t in eos, beam.output + [t])
                (done if child.finished else grown).append(child)
        live = sorted(grown, key=lambda b: score(b, spec.length_penalty), reverse=True)[:spec.width]
        if spec.early_stopping and len(done) >= spec.width:
            break
    return sorted(done + live, key=lambda b: score(b, spec.length_penalty), reverse=True)[:spec.n]


@pytest.mark.parametrize("width, n, length_penalty, early_stopping", [(1, 1, 1.0, False), (3, 2, 1.0, False),
                                                                       (4, 4, 0.5, False), (3, 3, 2.0, True)])
def test_it_equals_a_brute_force_beam_search(tiny_folder, width, n, length_penalty, early_stopping):
    import transformers

    hf = transformers.AutoModelForCausalLM.from_pretrained(tiny_folder, torch_dtype=torch.float32).eval()
    prompt = prompts(1, seed=8)[0]
    with torch.no_grad():  # an EOS the model likes early, so some beams complete
        first = hf(torch.tensor([prompt])).logits[0, -1].topk(3).indices.tolist()
    eos = {first[1]}
    spec = BeamSpec(width, n, length_penalty, early_stopping)
    want = reference(hf, prompt, spec, 6, eos)
    # float weights and float32 KV: the engine's logits are transformers' to ~1e-6
    engine = make_engine(tiny_folder, kv_cache_dtype="float32")
    ae = AsyncEngine(engine)
    try:
        got = asyncio.run(search(ae, prompt, spec, 6, eos))
    finally:
        ae.stop()
    assert [b.output for b in got] == [b.output for b in want]
    assert [b.finished for b in got] == [b.finished for b in want]
    assert [round(b.cum_logprob, 3) for b in got] == [round(b.cum_logprob, 3) for b in want]
    assert engine.block_manager.num_free_blocks == engine.block_manager.num_blocks
    assert all(b.ref_count == 0 for b in engine.block_manager.blocks)
    for beam in got:  # per token: its logprob among its step's 2 * width candidates; they sum to cum_logprob
        assert len(beam.logprobs) == len(beam.output)
        assert sum(lp for lp, _ in beam.logprobs) == pytest.approx(beam.cum_logprob, abs=1e-9)
        assert all((t, lp) in top and len(top) == 2 * width for t, (lp, top) in zip(beam.output, beam.logprobs))
    assert len(got) == n and len({tuple(b.output) for b in got}) == n  # n distinct hypotheses


def test_a_timed_out_search_ends_with_its_best_beams_so_far_and_frees_every_block(tiny_folder):
    engine = make_engine(tiny_folder)
    ae = AsyncEngine(engine)
    request = beam_request(prompts(1, seed=9)[0], BeamSpec(3, 2), 230, [2], timeout_s=0.02)

    async def run():
        return await beam_result(ae.submit(request))
    try:
        end = asyncio.run(run())
    finally:
        ae.stop()
    assert end.reason == "timeout" and 1 <= len(end.beams) <= 2
    assert all(len(b.output) < 230 and len(b.logprobs) == len(b.output) for b in end.beams)
    bm = engine.block_manager
    assert bm.num_free_blocks == bm.num_blocks and not engine.scheduler.running and not engine.scheduler.waiting


USER = [{"role": "user", "content": "hi"}]


@pytest.mark.parametrize("fields, param", [
    (dict(stream=True), "stream"), (dict(n=3, num_beams=2), "n"), (dict(num_beams=99), "num_beams"),
    (dict(prediction={"type": "content", "content": "x"}), "prediction"), (dict(stop=["x"]), "stop"),
    (dict(response_format={"type": "json_object"}), "response_format"),
])
def test_beam_search_refuses_what_it_cannot_do_naming_the_field(fields, param):
    with pytest.raises(ApiError) as err:
        validate(ChatCompletionRequest, {"messages": USER, "use_beam_search": True, **fields})
    assert err.value.status == 400 and err.value.param == param


def test_the_width_is_num_beams_else_n():
    chat = validate(ChatCompletionRequest, {"messages": USER, "use_beam_search": True, "n": 3})
    assert chat["beam"] == BeamSpec(3, 3)
    done = validate(CompletionRequest, {"prompt": "x", "use_beam_search": True, "num_beams": 4, "n": 2,
                                        "length_penalty": 0.5, "early_stopping": True})
    assert done["beam"] == BeamSpec(4, 2, 0.5, True)
    assert validate(ChatCompletionRequest, {"messages": USER})["beam"] is None
    with pytest.raises(ApiError) as err:
        validate(CompletionRequest, {"prompt": ["a", "b"], "use_beam_search": True})
    assert err.value.param == "prompt"
