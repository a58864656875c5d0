"""Thinking controls resolve by priority: thinking, then the budget fields, then effort, then the template kwarg."""
import pytest

from inference.serving.errors import ApiError
from inference.serving.thinking import Thinking, resolve_thinking, validate_thinking


@pytest.mark.parametrize("req, expected", [
    ({}, Thinking()),
    ({"chat_template_kwargs": {"enable_thinking": False}}, Thinking(False)),
    ({"reasoning_effort": "low", "chat_template_kwargs": {"enable_thinking": False}}, Thinking(True, None, "low")),
    ({"reasoning_effort": "none"}, Thinking(False, None, "none")),
    ({"thinking_budget": 0, "reasoning_effort": "high"}, Thinking(False, None, "high")),
    ({"max_thinking_tokens": 9, "reasoning_effort": "none"}, Thinking(True, 9, "none")),
    ({"thinking_token_budget": 3, "thinking_budget": 0}, Thinking(True, 3)),
    ({"thinking": {"enabled": False, "budget_tokens": None}, "thinking_token_budget": 5}, Thinking(False)),
    ({"thinking": {"enabled": True, "budget_tokens": 0}}, Thinking(True, 0)),
    ({"thinking": {"enabled": True, "budget_tokens": None}, "thinking_token_budget": 0}, Thinking(True)),
])
def test_it_resolves_by_priority(req, expected):
    assert resolve_thinking(req) == expected


def test_off_is_a_cap_of_zero_and_the_template_hears_of_it():
    assert Thinking(False).engine_cap() == 0 and Thinking(True, 7).engine_cap() == 7
    assert Thinking().engine_cap() is None and Thinking().template_kwargs() == {}
    assert Thinking(False, None, "none").template_kwargs() == {"enable_thinking": False, "reasoning_effort": "none"}


def test_responses_effort_is_passed_in():
    assert resolve_thinking({}, effort="xhigh") == Thinking(True, None, "xhigh")


@pytest.mark.parametrize("data, param", [("x", "thinking"), ({"type": "maybe"}, "thinking.type"),
                                         ({"budget_tokens": -2}, "thinking.budget_tokens"),
                                         ({"budget_tokens": True}, "thinking.budget_tokens")])
def test_bad_thinking_objects_name_the_field(data, param):
    with pytest.raises(ApiError) as err:
        validate_thinking(data)
    assert err.value.param == param
