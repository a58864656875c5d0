"""Repetition detection: the rule against a brute-force reading of vLLM's, and a scripted loop stopped in the engine."""
import random

import pytest

from inference.engine.request import EngineRequest
from inference.engine.repetition import RepetitionDetection, repeats
from inference.engine.sampling_params import SamplingParams

from .test_async_engine import make_engine, prompts
from .tiny_models import make_tiny_model


def reference(output: list[int], rule: RepetitionDetection) -> bool:
    """vLLM's definition written plainly: some size whose last `size` tokens, repeated min_count times, are the tail."""
    for size in range(rule.min_pattern_size, rule.max_pattern_size + 1):
        if size * rule.min_count <= len(output) and output[-size * rule.min_count:] == output[-size:] * rule.min_count:
            return True
    return False


def test_it_agrees_with_the_plain_definition_on_random_outputs():
    rng = random.Random(0)
    hits = 0
    for _ in range(3000):
        biggest = rng.randint(1, 6)
        rule = RepetitionDetection(biggest, rng.randint(0, biggest), rng.randint(2, 4))
        output = [rng.randint(0, 2) for _ in range(rng.randint(0, 30))]
        prompt = [rng.randint(0, 2) for _ in range(rng.randint(0, 5))]  # the prompt never counts
        want = reference(output, rule)
        hits += want
        assert repeats(prompt + output, len(output), rule) == want, (output, rule)
    assert hits > 100


def test_bad_rules_are_refused():
    for args in ((0, 1, 2), (2, 3, 2), (3, 1, 1)):
        with pytest.raises(ValueError):
            RepetitionDetection(*args)


@pytest.fixture(scope="module")
def tiny_folder(tmp_path_factory):
    return make_tiny_model("llama", tmp_path_factory.mktemp("tiny") / "llama")


def test_a_scripted_loop_stops_with_stop_and_keeps_its_repeats(tiny_folder):
    """logit_bias makes greedy decoding repeat two tokens in turn after a free start: the pattern [7, 9]."""
    engine = make_engine(tiny_folder)
    rule = RepetitionDetection(max_pattern_size=3, min_pattern_size=2, min_count=3)
    params = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True, logit_bias={7: 50.0, 9: 50.0},
                            repetition_penalty=1.0, repetition_detection=rule)
    seq = engine.add_request(EngineRequest(prompts(1)[0], params))
    free = engine.add_request(EngineRequest(prompts(1)[0], SamplingParams(
        temperature=0, max_tokens=40, ignore_eos=True, logit_bias={7: 50.0, 9: 50.0})))
    while engine.has_work():
        engine.step()
    out = seq.output_token_ids
    assert seq.finish_reason == "stop" and seq.stopped_by_repetition
    assert len(out) < 40 and reference(out, rule) and not reference(out[:-1], rule)
    assert out == free.output_token_ids[:len(out)] and free.finish_reason == "length"
    assert seq.finished_output().repetition
    assert engine.stats.request_success["repetition"] == 1 and engine.stats.request_success["length"] == 1
