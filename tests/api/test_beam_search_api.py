"""Beam search on chat and completions through the real SmolLM2 engine (in-process ASGI): n best beams as
n choices, blocking only."""
import json

import pytest

from .asgi_client import AsgiRequest, serve
from .fake_engine import Answer

pytestmark = pytest.mark.django_db

USER = [{"role": "user", "content": "Name a colour."}]


def post(path: str, body: dict) -> Answer:
    """One blocking request, waited for as long as a beam search on a loaded machine takes."""
    data = json.dumps(body).encode()

    async def run():
        req = await AsgiRequest("POST", path, {"content-type": "application/json",
                                               "content-length": str(len(data))}, data).start(timeout_s=300)
        return Answer(req.status, req.headers, await req.read_all(timeout_s=300))
    return serve(run)


def test_chat_beam_search_returns_n_distinct_choices(real_rt):
    body = post("/v1/chat/completions", {"model": "smollm2-135m-instruct", "messages": USER, "max_tokens": 6,
                                         "use_beam_search": True, "num_beams": 3, "n": 2}).json()
    choices = body["choices"]
    assert [c["index"] for c in choices] == [0, 1]
    assert len({c["message"]["content"] for c in choices}) == 2
    assert all(c["finish_reason"] in ("stop", "length") for c in choices)
    assert 0 < body["usage"]["completion_tokens"] <= 12


def test_completions_beam_search_of_width_1_is_greedy_and_its_400s(real_rt):
    one = post("/v1/completions", {"model": "smollm2-135m-instruct", "prompt": "The sky is", "max_tokens": 6, "use_beam_search": True})
    greedy = post("/v1/completions", {"model": "smollm2-135m-instruct", "prompt": "The sky is", "max_tokens": 6, "temperature": 0})
    assert one.json()["choices"][0]["text"] == greedy.json()["choices"][0]["text"] != ""
    two = post("/v1/completions", {"model": "smollm2-135m-instruct", "prompt": "The sky is", "max_tokens": 5, "use_beam_search": True,
                                   "n": 2}).json()
    assert len(two["choices"]) == 2 and two["choices"][0]["text"] != two["choices"][1]["text"]
    streamed = post("/v1/completions", {"model": "smollm2-135m-instruct", "prompt": "x", "max_tokens": 5, "stream": True,
                                        "use_beam_search": True})
    assert streamed.status == 400 and streamed.json()["error"]["param"] == "stream"
    wide = post("/v1/chat/completions", {"model": "smollm2-135m-instruct", "messages": USER, "use_beam_search": True, "n": 4,
                                         "num_beams": 2})
    assert wide.status == 400 and wide.json()["error"]["param"] == "n"


def by_score(choices: list[tuple[float, int, bool]], prompt_tokens: int, length_penalty: float) -> list[float]:
    """vLLM's beam score of each (summed logprob, output tokens, ended by EOS) choice."""
    return [lp / (prompt_tokens + n - (1 if eos else 0)) ** length_penalty for lp, n, eos in choices]


def test_beam_search_logprobs_sum_to_each_choice_s_cumulative_logprob_in_score_order(real_rt):
    body = post("/v1/chat/completions", {"model": "smollm2-135m-instruct", "messages": USER, "max_tokens": 5,
                                         "use_beam_search": True, "num_beams": 3, "n": 3, "length_penalty": 0.5,
                                         "logprobs": True, "top_logprobs": 2}).json()
    sums = []
    for choice in body["choices"]:
        content = choice["logprobs"]["content"]
        assert all(len(e["top_logprobs"]) == 2 and e["top_logprobs"][0]["logprob"] >= e["logprob"] for e in content)
        sums.append((sum(e["logprob"] for e in content), len(content), choice["finish_reason"] == "stop"))
    scores = by_score(sums, body["usage"]["prompt_tokens"], 0.5)
    assert scores == sorted(scores, reverse=True) and len(set(scores)) == 3
    assert body["usage"]["completion_tokens"] == sum(n for _, n, _ in sums)

    done = post("/v1/completions", {"model": "smollm2-135m-instruct", "prompt": "The sky is", "max_tokens": 4,
                                    "use_beam_search": True, "n": 2, "logprobs": 1}).json()
    sums = []
    for choice in done["choices"]:
        lps = choice["logprobs"]
        assert len(lps["tokens"]) == len(lps["token_logprobs"]) == len(lps["top_logprobs"]) > 0
        assert all(max(top.values()) >= lp for top, lp in zip(lps["top_logprobs"], lps["token_logprobs"]))
        sums.append((sum(lps["token_logprobs"]), len(lps["tokens"]), choice["finish_reason"] == "stop"))
    scores = by_score(sums, done["usage"]["prompt_tokens"], 1.0)
    assert scores == sorted(scores, reverse=True)
