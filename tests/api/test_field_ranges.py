"""Every numeric field of every JSON route has a range the engine can represent, and every route types its
fields as strictly as chat does: past a bound, or of the wrong JSON type, a value is a 400 naming the field."""
import math

import pytest

from inference.serving.fields import INT64_MAX, INT64_MIN
from tests.fuzz.routes import ROUTES, body_for, declared_fields, numeric_fields

from .fake_engine import call

NUMERIC = [(route, name, limits) for route in ROUTES for name, limits in numeric_fields(route.serializer).items()]


def test_every_route_has_numeric_fields_and_each_is_bounded_within_what_the_engine_keeps():
    assert {route.path for route, _, _ in NUMERIC} >= {"/v1/chat/completions", "/v1/completions", "/v1/responses"}
    for route, name, limits in NUMERIC:
        low, high = limits["low"], limits["high"]
        if limits["integer"]:
            low = INT64_MIN if low is None else low
            high = INT64_MAX if high is None else high
            assert INT64_MIN <= low <= high <= INT64_MAX, (route.path, name, limits)
        else:
            assert low is not None and high is not None and math.isfinite(low) and math.isfinite(high), (name, limits)
            assert abs(low) <= 1e9 and abs(high) <= 1e9, (route.path, name, limits)


def assert_names(route, answer, name: str, value) -> None:
    """The 400 names the field: in `param` (OpenAI's shape), in the message (Anthropic's has no param; Ollama's
    error is the message alone)."""
    error = answer.json()["error"]
    if route.shape == "ollama":
        assert list(answer.json()) == ["error"] and f"'{name}'" in error, (value, answer.body[:300])
    elif route.shape == "anthropic":
        assert f"'{name}'" in error["message"] and answer.json()["type"] == "error", (value, answer.body[:300])
    else:
        assert error["param"] == name, (value, answer.body[:300])


def past_the_bounds(limits: dict) -> list:
    """Values just past each bound, and far past them (past int64, past a double's integers)."""
    high = limits["high"] if limits["high"] is not None else INT64_MAX
    low = limits["low"] if limits["low"] is not None else INT64_MIN
    step = 1 if limits["integer"] else 1e-3 * max(1.0, abs(high))
    values = [high + step, 2**64, 18446744073709551616, 10**300, -(2**64), 10**4000]
    values.append(low if limits["low_open"] else low - step)
    return values


@pytest.mark.parametrize("route, name, limits", NUMERIC, ids=[f"{r.path}:{n}" for r, n, _ in NUMERIC])
def test_a_number_past_its_range_is_a_400_naming_the_field(fake_rt, route, name, limits):
    for value in past_the_bounds(limits):
        body = body_for(route, name, value)
        answer = call(route.method, route.path, body)
        assert answer.status == 400, (name, value, answer.body[:300])
        assert_names(route, answer, name, value)


def test_top_n_sigma_past_int64_is_refused_before_the_engine(fake_rt):
    answer = call("POST", "/v1/completions", {"prompt": "x", "max_tokens": 2, "top_n_sigma": 18446744073709551616})
    assert answer.status == 400 and answer.json()["error"]["param"] == "top_n_sigma"
    assert fake_rt.engine.submissions == []


def test_float_fields_hand_floats_to_the_engine(fake_rt):
    answer = call("POST", "/v1/completions", {"prompt": "x", "max_tokens": 2, "top_n_sigma": 3, "temperature": 1,
                                              "min_p": 0, "dry_multiplier": 1, "dry_base": 2})
    assert answer.status == 200, answer.body
    params = fake_rt.engine.submissions[0].params
    for name in ("top_n_sigma", "temperature", "min_p", "dry_multiplier", "dry_base"):
        assert type(getattr(params, name)) is float, name


# Wrong JSON types, each refused by chat today, on the route's own fields of that kind.
WRONG = {"number": [True, "0.5", [1], {"a": 1}], "integer": [True, "4", 4.5, [4]],
         "string": [5, 5.5, True, ["x"], {"a": "x"}], "boolean": [1, 0, "true", "yes", [True]]}


def field_kind(field) -> str | None:
    from inference.serving import fields as strict

    if isinstance(field, strict.NumberField):
        return "integer" if field.limits["integer"] else "number"
    if isinstance(field, strict.StringField):
        return "string"
    if isinstance(field, strict.BooleanField):
        return "boolean"
    return None


TYPED = [(route, name, kind) for route in ROUTES for name, field in declared_fields(route.serializer).items()
         if (kind := field_kind(field)) is not None]


@pytest.mark.parametrize("route, name, kind", TYPED, ids=[f"{r.path}:{n}" for r, n, _ in TYPED])
def test_a_value_of_the_wrong_json_type_is_a_400_naming_the_field(fake_rt, route, name, kind):
    for value in WRONG[kind]:
        body = body_for(route, name, value)
        answer = call(route.method, route.path, body)
        assert answer.status == 400, (name, value, answer.body[:300])
        assert_names(route, answer, name, value)


@pytest.mark.parametrize("fields", [{"temperature": True}, {"temperature": "0.5"}, {"top_p": True},
                                    {"max_output_tokens": "4"}, {"instructions": 5}, {"model": 5}, {"user": 5},
                                    {"previous_response_id": 5}, {"truncation": 1}, {"service_tier": True}])
def test_responses_rejects_what_chat_rejects(fake_rt, fields):
    answer = call("POST", "/v1/responses", {"input": "x", **fields})
    assert answer.status == 400 and answer.json()["error"]["param"] == next(iter(fields))


def test_every_declared_field_of_responses_is_strict():
    from rest_framework import serializers

    from inference.serving.fields import StrictField

    for route in ROUTES:
        for name, field in declared_fields(route.serializer).items():
            assert isinstance(field, StrictField), (route.path, name, type(field))
            assert not isinstance(field, (serializers.CharField, serializers.IntegerField, serializers.FloatField,
                                          serializers.BooleanField, serializers.ChoiceField)), (route.path, name)
