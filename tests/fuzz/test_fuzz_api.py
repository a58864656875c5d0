"""The fuzz suite in-process: generated bodies for every JSON route (its serializer's fields with their
kinds and ranges, and the hostile kinds) through the whole ASGI stack against the scripted engine.
No answer is a 5xx, every error is in its route's shape, a field at fault is named, and afterwards the engine
still serves an ordinary request."""
import pytest
from hypothesis import given, settings

from tests.api.fake_engine import call

from .checks import check_answer
from .conftest import EXAMPLES, FIGURES
from .routes import ROUTES
from .strategies import bodies


def send(route, body, conversation: str):
    path = route.path.replace("conv_fuzz", conversation)
    return call("POST", path, raw=body.raw, headers={"content-type": body.content_type})


@pytest.mark.parametrize("route", ROUTES, ids=[r.path for r in ROUTES])
def test_generated_bodies_get_no_5xx_and_errors_in_the_route_s_shape(fake_rt, conversation, route):
    @settings(settings.get_profile("metrale-fuzz"), max_examples=EXAMPLES)
    @given(body=bodies(route))
    def one(body):
        answer = send(route, body, conversation)
        FIGURES[(route.path, answer.status)] += 1
        check_answer(route, body, answer.status, answer.headers, answer.body)

    one()
    after = call("POST", "/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}],
                                                  "temperature": 0})
    assert after.status == 200 and after.json()["choices"][0]["message"]["content"] == "Hello world"
