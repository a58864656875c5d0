"""The bench's HTTP client against a live server, in both of its modes: ignore_eos with usage (ours)
and banned special tokens with chunks counted (for servers without ignore_eos, e.g. llama-cpp-python)."""
import pytest

from inference.bench.http_streams import run_http
from inference.bench.workload import BenchRequest
from inference.engine.tokenizer import Tokenizer

pytestmark = pytest.mark.e2e


def test_both_modes_stream_exactly_the_tokens_asked_for(metrale_server, smollm2_dir):
    tok = Tokenizer.from_folder(smollm2_dir)
    # short answers, so the model would want to stop before max_tokens
    reqs = [BenchRequest("Say hi.", 3, 24), BenchRequest("Say bye.", 3, 17)]
    ours, _ = run_http(metrale_server.url, reqs, 2)
    assert [t.output_tokens for t in ours] == [24, 17]
    banned, wall = run_http(metrale_server.url, reqs, 2, suppress=sorted(tok.special_ids))
    assert [t.output_tokens for t in banned] == [24, 17]  # one content chunk per token here
    assert all(0 < t.ttft_s <= t.total_s <= wall for t in banned)


def test_the_side_by_side_comparison_runs_new_prompts_each_round(metrale_server, smollm2_dir):
    from inference.bench.peer import compare
    from inference.bench.workload import sharegpt_like

    tok = Tokenizer.from_folder(smollm2_dir)
    asked = []

    def workloads_for(rnd):
        asked.append(rnd)
        return {2: sharegpt_like(tok, 2, seed=rnd + 5, prompt_range=(8, 16), output_range=(4, 6))}

    cmp = compare(metrale_server.url, metrale_server.url, workloads_for, tok, sorted(tok.special_ids), rounds=2,
                  prompt_tokens=32, log=lambda line: None)
    assert asked == [-1, 0, 1]  # the warm-up's, then one per round
    assert len(cmp.streams[("ours", 2)]) == len(cmp.streams[("peer", 2)]) == 2
    assert cmp.median_tok_s("ours", 2) > 0 and cmp.median_tok_s("peer", 2) > 0
    assert len(cmp.prompt["ours"]) == 2 and all(rate > 0 for rate in cmp.prompt["peer"])
