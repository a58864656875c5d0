"""The reasoning budget: the close tag is forced after N reasoning tokens, in the sampler, one token per step;
and the one tracker per sequence that the budget and the grammar both read."""
import math

import pytest
import torch

from inference.engine.config import EngineConfig
from inference.engine.llm_engine import LLMEngine
from inference.engine.reasoning import ReasoningSpec
from inference.engine.sampler import Sampler
from inference.engine.sampling_params import SamplingParams
from inference.engine.sequence import Sequence
from inference.engine.request import EngineRequest

from .tiny_models import make_tiny_model

V = 32
FAVOURITE = 10        # what the scripted logits pick when nothing is forced
START, END = (5, 6), (7, 8)


def generate(params: SamplingParams, script: list[int] | None = None, steps: int = 10) -> list[int]:
    """Draw `steps` tokens for one sequence; logits favour script[i] at step i, else FAVOURITE."""
    seq = Sequence("r", [1, 2, 3], params)
    sampler = Sampler([2], seed=0)
    for step in range(steps):
        logits = torch.zeros(1, V)
        logits[0, (script or [])[step] if step < len(script or []) else FAVOURITE] = 10.0
        seq.token_ids.append(sampler(logits, [seq]).token_ids[0])
    return seq.output_token_ids


def budget(n, **kw) -> SamplingParams:
    return SamplingParams(temperature=0.0, reasoning=ReasoningSpec(START, END, budget_tokens=n, **kw))


def test_it_forces_the_close_tag_after_the_budget_when_the_prompt_opened_reasoning():
    assert generate(budget(3, starts_in_reasoning=True)) == [10, 10, 10, 7, 8, 10, 10, 10, 10, 10]


def test_it_closes_at_once_with_a_zero_budget():
    assert generate(budget(0, starts_in_reasoning=True), steps=4) == [7, 8, 10, 10]


def test_it_counts_from_the_model_opened_start_tag_and_not_before():
    out = generate(budget(2), script=[11, 12, 5, 6])
    assert out == [11, 12, 5, 6, 10, 10, 7, 8, 10, 10]


def test_a_close_tag_the_model_wrote_itself_ends_reasoning_and_the_budget_spans_blocks():
    # 2 tokens + the natural close (2 more) use 4 of 5; the reopened block gets 1 more token.
    out = generate(budget(5, starts_in_reasoning=True), script=[11, 12, 7, 8, 13, 5, 6], steps=12)
    assert out == [11, 12, 7, 8, 13, 5, 6, 10, 7, 8, 10, 10]


def test_it_finishes_a_close_tag_the_model_had_begun():
    out = generate(budget(2, starts_in_reasoning=True), script=[11, 7], steps=5)
    assert out == [11, 7, 8, 10, 10]


@pytest.mark.parametrize("mode", ["raw_logprobs", "processed_logprobs"])
def test_it_leaves_rows_without_a_budget_alone_and_works_for_sampled_rows(mode):
    sampler = Sampler([2], seed=0, logprobs_mode=mode)
    seqs = [Sequence("a", [1], SamplingParams(temperature=1.0, reasoning=ReasoningSpec(
                end_ids=END, starts_in_reasoning=True, budget_tokens=0), logprobs=1)),
            Sequence("b", [1], SamplingParams(temperature=0.0, logprobs=1))]
    logits = torch.zeros(2, V)
    logits[:, FAVOURITE] = 10.0
    res = sampler(logits, seqs)
    assert res.token_ids == [7, FAVOURITE]
    if mode == "processed_logprobs":
        assert res.logprobs[0][0] == 0.0  # the forced token is certain in the distribution drawn from
    else:  # the model's own view of the forced token (all logits 0 but FAVOURITE's 10)
        assert res.logprobs[0][0] == pytest.approx(-math.log(V - 1 + math.exp(10)), abs=1e-4)


def test_it_needs_the_close_tag_and_a_budget_of_at_least_zero():
    with pytest.raises(ValueError):
        ReasoningSpec(end_ids=(), budget_tokens=3)
    with pytest.raises(ValueError):
        ReasoningSpec(end_ids=END, budget_tokens=-1)


def test_without_a_budget_nothing_is_forced():
    spec = ReasoningSpec(START, END, starts_in_reasoning=True)
    assert generate(SamplingParams(temperature=0.0, reasoning=spec), steps=4) == [10, 10, 10, 10]


@pytest.fixture(scope="module")
def tiny_folder(tmp_path_factory):
    return make_tiny_model("llama", tmp_path_factory.mktemp("tiny") / "llama")


def run_engine(folder, params: SamplingParams) -> list[int]:
    engine = LLMEngine(EngineConfig(model_path=str(folder), kv_cache_bytes=2 << 20, weights="model"))
    seq = engine.add_request(EngineRequest(list(range(3, 15)), params, request_id="r"))
    while engine.has_work():
        engine.step()
    return seq.output_token_ids


def test_a_tiny_model_follows_its_own_tokens_until_the_budget_then_the_fake_close_tag(tiny_folder):
    free = run_engine(tiny_folder, SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True))
    close = (300, 301)
    capped = run_engine(tiny_folder, SamplingParams(
        temperature=0.0, max_tokens=12, ignore_eos=True,
        reasoning=ReasoningSpec(end_ids=close, starts_in_reasoning=True, budget_tokens=4)))
    assert capped[:4] == free[:4]
    assert capped[4:6] == list(close)
    assert len(capped) == 12
