"""The fuzz suite against the real SmolLM2 engine in-process: generated bodies for the generating routes, with
short completions, through the whole ASGI stack. No answer is a 5xx, errors are in OpenAI's shape, and
afterwards the engine answers a greedy request exactly as it did before."""
import os
import time

import pytest
from hypothesis import given, settings

from inference.operations.registry import serving
from inference.operations.runtime import Runtime
from tests.api.registries import registry_of
from tests.api.fake_engine import call
from tests.api.conftest import smollm2_engine  # noqa: F401

from .checks import check_answer
from .conftest import FIGURES
from .routes import ROUTES
from .strategies import SHORT, routes_and_bodies

pytestmark = pytest.mark.slow

EXAMPLES = int(os.environ.get("METRALE_FUZZ_ENGINE_EXAMPLES", "60"))
GREEDY = {"messages": [{"role": "user", "content": "What is the capital of France?"}], "temperature": 0,
          "max_tokens": 12}


@pytest.fixture
def real_rt(smollm2_engine, smollm2_dir, smollm2_tokenizer, monkeypatch, raw_asgi_requests, db):  # noqa: F811
    rt = Runtime(smollm2_engine, smollm2_tokenizer, "smollm2-135m-instruct", smollm2_dir, int(time.time()))
    with serving(registry_of(rt)):
        yield rt


def greedy_answer() -> str:
    answer = call("POST", "/v1/chat/completions", GREEDY)
    assert answer.status == 200, answer.body
    return answer.json()["choices"][0]["message"]["content"]


def test_generated_bodies_on_the_real_engine_leave_it_serving_as_before(real_rt):
    before = greedy_answer()
    generating = [r for r in ROUTES if r.generates]

    @settings(settings.get_profile("metrale-fuzz"), max_examples=EXAMPLES)
    @given(case=routes_and_bodies(generating, SHORT, plausible=0.5))
    def one(case):
        route, body = case
        answer = call("POST", route.path, raw=body.raw, headers={"content-type": body.content_type})
        FIGURES[(route.path, answer.status)] += 1
        check_answer(route, body, answer.status, answer.headers, answer.body)

    one()
    assert greedy_answer() == before
    deadline = time.monotonic() + 10
    while real_rt.engine.engine.has_work() and time.monotonic() < deadline:  # aborted ones leave at a step
        time.sleep(0.05)
    assert not real_rt.engine.engine.has_work()
