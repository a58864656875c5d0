"""The fuzz suite in-process: generated bodies for every JSON route (its serializer's fields with their
kinds and ranges, and the hostile kinds) through the whole ASGI stack against the scripted engine.
No answer is a 5xx, every error is in its route's shape, a field at fault is named, and afterwards the engine
still serves an ordinary request."""
import pytest
from hypothesis import given, settings

from tests.api.fake_engine import call

from .checks import check_answer
from .conftest import EXAMPLES, FIGURES
from .routes import OLLAMA_ROUTES, ROUTES
from .strategies import bodies, routes_and_bodies


def send(route, body, conversation: str):
    path = route.path.replace("conv_fuzz", conversation)
    return call(route.method, path, raw=body.raw, headers={"content-type": body.content_type})


def serves_as_before() -> None:
    after = call("POST", "/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}],
                                                  "temperature": 0})
    assert after.status == 200 and after.json()["choices"][0]["message"]["content"] == "Hello world"


OWN = [r for r in ROUTES if r not in OLLAMA_ROUTES]


@pytest.mark.parametrize("route", OWN, ids=[r.path for r in OWN])
def test_generated_bodies_get_no_5xx_and_errors_in_the_route_s_shape(fake_rt, conversation, route):
    @settings(settings.get_profile("metrale-fuzz"), max_examples=EXAMPLES)
    @given(body=bodies(route))
    def one(body):
        answer = send(route, body, conversation)
        FIGURES[(route.path, answer.status)] += 1
        check_answer(route, body, answer.status, answer.headers, answer.body)

    one()
    serves_as_before()


def test_generated_bodies_on_ollama_s_routes_get_no_5xx_and_errors_in_its_shape(fake_rt, conversation):
    """Ollama's routes share one example budget (they share most of their fields; `make fuzz` runs many more)."""
    @settings(settings.get_profile("metrale-fuzz"), max_examples=EXAMPLES)
    @given(case=routes_and_bodies(OLLAMA_ROUTES))
    def one(case):
        route, body = case
        answer = send(route, body, conversation)
        FIGURES[(route.path, answer.status)] += 1
        check_answer(route, body, answer.status, answer.headers, answer.body)

    one()
    serves_as_before()
