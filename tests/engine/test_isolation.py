"""One request's failure ends that request alone: at admission, in the step (found by retrying), and the
companions of a failed request finish with exactly their solo output."""
import asyncio

import pytest

from inference.engine import sampler as sampler_module
from inference.engine.async_engine import AsyncEngine
from inference.engine.outputs import Failed, Finished, TokenEvent
from inference.engine.request import EngineRequest
from inference.engine.sampling_params import SamplingParams

from .test_async_engine import make_engine, prompts
from .tiny_models import make_tiny_model

POISON = "poison"


@pytest.fixture(scope="module")
def tiny_folder(tmp_path_factory):
    return make_tiny_model("llama", tmp_path_factory.mktemp("tiny") / "llama")


def companions() -> list[EngineRequest]:
    """7 requests: greedy, and seeded draws with truncation and penalties."""
    seeded = [SamplingParams(temperature=0.9, top_p=0.9, seed=11, max_tokens=10, ignore_eos=True),
              SamplingParams(temperature=1.3, top_k=40, seed=12, max_tokens=10, ignore_eos=True,
                             presence_penalty=0.5),
              SamplingParams(temperature=0.7, min_p=0.05, seed=13, max_tokens=10, ignore_eos=True, logprobs=2)]
    greedy = [SamplingParams(temperature=0, max_tokens=10, ignore_eos=True),
              SamplingParams(temperature=0, max_tokens=10, ignore_eos=True, repetition_penalty=1.2),
              SamplingParams(temperature=0, max_tokens=10, ignore_eos=True, logprobs=1)]
    params = seeded + greedy + [SamplingParams(temperature=1.0, seed=14, max_tokens=10, ignore_eos=True)]
    return [EngineRequest(p, sp, request_id=f"c{i}") for i, (p, sp) in enumerate(zip(prompts(7, seed=9), params))]


def drive(engine, requests: list[EngineRequest]) -> list[tuple[list[int], object]]:
    """Add every request at once (they share the first step), step until done; per request, the
    token ids and the last event its handle would get."""
    seqs = [engine.add_request(r) for r in requests]
    events: dict[int, list] = {id(s): [] for s in seqs}
    while engine.has_work():
        for seq, evs in engine.step():
            events[id(seq)].extend(evs)
    return [([e.token_id for e in events[id(s)] if isinstance(e, TokenEvent)], events[id(s)][-1]) for s in seqs]


def outputs(results) -> list:
    """What a client gets of each request: its tokens and how it ended."""
    return [(tokens, end.reason if isinstance(end, Finished) else end) for tokens, end in results]


def run_alone_then_together(engine, poison: EngineRequest, make_companions=companions):
    """Each companion alone, then the companions and the poison in one batch (the poison last, as in
    the report: a later row broke the step for the earlier ones). Returns (alone, poison's, companions')."""
    alone = [drive(engine, [r])[0] for r in make_companions()]
    first_step = len(engine.step_log)
    together = drive(engine, [*make_companions(), poison])
    assert sum(engine.step_log[first_step][:2]) == 8  # all eight in the first step
    assert engine.block_manager.num_free_blocks == engine.block_manager.num_blocks
    assert not engine.scheduler.running and not engine.scheduler.waiting
    return alone, together[-1], together[:-1]


def test_a_failure_in_one_requests_sampling_leaves_its_seven_companions_their_solo_output(tiny_folder, monkeypatch):
    """The failure comes after the batch's draws, so the seeded companions' generators must be put back."""
    real = sampler_module.Sampler.__call__

    def poisoned(self, logits, seqs):
        result = real(self, logits, seqs)
        if any(s.request_id == POISON for s in seqs):
            raise RuntimeError("injected sampling failure")
        return result

    monkeypatch.setattr(sampler_module.Sampler, "__call__", poisoned)
    engine = make_engine(tiny_folder)
    poison = EngineRequest(prompts(1, seed=4)[0], SamplingParams(temperature=0, max_tokens=10), request_id=POISON)
    alone, (_, poison_end), together = run_alone_then_together(engine, poison)
    assert isinstance(poison_end, Failed) and "injected sampling failure" in poison_end.message
    assert outputs(together) == outputs(alone)
    assert all(isinstance(end, Finished) and end.reason == "length" for _, end in together)


BIG = 18446744073709551616  # 2**64: the report's top_n_sigma


def test_a_top_n_sigma_of_2_to_the_64_is_converted_at_admission_and_every_request_runs(tiny_folder):
    """ignore_eos: an unseeded draw at temperature 1 from the tiny random model may pick its end-of-sequence id."""
    engine = make_engine(tiny_folder)
    params = SamplingParams(temperature=1.0, max_tokens=4, top_n_sigma=BIG, ignore_eos=True)
    poison = EngineRequest(prompts(1, seed=4)[0], params, request_id=POISON)
    alone, (tokens, end), together = run_alone_then_together(engine, poison)
    assert isinstance(end, Finished) and len(tokens) == 4
    assert outputs(together) == outputs(alone)


def sampled_companions() -> list[EngineRequest]:
    """7 seeded requests whose top_n_sigma came as a JSON integer, as a client may send it."""
    return [EngineRequest(p, SamplingParams(temperature=1.0, top_n_sigma=2, seed=20 + i, max_tokens=6,
                                            ignore_eos=True), request_id=f"s{i}")
            for i, p in enumerate(prompts(7, seed=9))]


def test_a_top_n_sigma_of_2_to_the_64_that_reaches_the_step_fails_that_request_alone(tiny_folder, monkeypatch, caplog):
    """The original report: with admission's conversion skipped, the raw integer reaches the step,
    where torch.tensor([2, ..., 2**64]) raises "Overflow when unpacking long long" for the batch."""
    monkeypatch.setattr(SamplingParams, "for_engine", lambda self, vocab_size: self)
    engine = make_engine(tiny_folder)
    params = SamplingParams(temperature=1.0, max_tokens=4, top_n_sigma=BIG, ignore_eos=True)
    poison = EngineRequest(prompts(1, seed=4)[0], params, request_id=POISON)
    with caplog.at_level("WARNING", logger="metrale.engine"):
        alone, (_, end), together = run_alone_then_together(engine, poison, sampled_companions)
    assert isinstance(end, Failed) and "Overflow when unpacking long long" in end.message
    assert outputs(together) == outputs(alone)
    assert "request poison failed in the engine" in caplog.text and "retrying it" in caplog.text
    engine = make_engine(tiny_folder)
    monkeypatch.undo()  # with the conversion, the same batch runs whole
    alone, (tokens, end), together = run_alone_then_together(engine, poison, sampled_companions)
    assert isinstance(end, Finished) and len(tokens) == 4
    assert outputs(together) == outputs(alone)


@pytest.mark.parametrize("params, words", [
    (SamplingParams(temperature=1.0, seed=BIG, max_tokens=4), "Overflow"),
    (SamplingParams(temperature=1.0, max_tokens=4, dry_multiplier=0.8, dry_base=0.0), "math domain error"),
    (SamplingParams(temperature=1.0, max_tokens=4, frequency_penalty=10 ** 400), "too large"),
])
def test_a_parameter_no_step_can_use_fails_its_request_at_admission_with_an_in_band_error(tiny_folder, params,
                                                                                         words):
    engine = make_engine(tiny_folder)
    ae = AsyncEngine(engine)

    async def collect(request):
        return [ev async for ev in ae.submit(request)]

    async def run():
        alone = [await collect(r) for r in companions()]
        together = await asyncio.gather(collect(EngineRequest(prompts(1)[0], params)),
                                        *(collect(r) for r in companions()))
        return alone, together

    try:
        alone, (poison, *together) = asyncio.run(run())
    finally:
        ae.stop()
    assert len(poison) == 1 and isinstance(poison[0], Failed)
    assert words in poison[0].message and "cannot be used" in poison[0].message
    tokens = [[e.token_id for e in evs if isinstance(e, TokenEvent)] for evs in together]
    assert tokens == [[e.token_id for e in evs if isinstance(e, TokenEvent)] for evs in alone]
    assert all(isinstance(evs[-1], Finished) for evs in together)
    assert engine.block_manager.num_free_blocks == engine.block_manager.num_blocks


def test_a_lone_request_whose_step_always_fails_ends_with_failed(tiny_folder, monkeypatch):
    engine = make_engine(tiny_folder)

    def broken(self, batch):
        raise RuntimeError("broken forward")

    monkeypatch.setattr(type(engine.runner), "execute", broken)
    ((tokens, end),) = drive(engine, [EngineRequest(prompts(1)[0], SamplingParams(max_tokens=3))])
    assert not tokens and isinstance(end, Failed) and "broken forward" in end.message
    assert engine.block_manager.num_free_blocks == engine.block_manager.num_blocks
