"""Strict DRF fields for OpenAI request bodies: JSON types as sent, ranges checked, no silent coercion.

DRF's own fields coerce ("5" -> 5, "yes" -> True) and let NaN through range checks;
OpenAI's API answers such values with a 400, and so do these fields.
"""
from __future__ import annotations

import math
import re

from rest_framework import serializers

from .errors import bad_request


class StrictField(serializers.Field):
    """A field whose value is returned as validated (to_representation is the identity)."""

    def to_representation(self, value):
        return value


class BooleanField(StrictField):
    """A JSON boolean only."""

    def to_internal_value(self, data):
        if not isinstance(data, bool):
            raise serializers.ValidationError("must be a boolean.")
        return data


class StringField(StrictField):
    """A JSON string, optionally one of `choices` or at most `max_length` characters."""

    def __init__(self, *, choices: tuple[str, ...] | None = None, max_length: int | None = None, **kw):
        super().__init__(**kw)
        self.choices = choices
        self.max_length = max_length

    def to_internal_value(self, data):
        if not isinstance(data, str):
            raise serializers.ValidationError("must be a string.")
        if self.choices is not None and data not in self.choices:
            raise serializers.ValidationError(f"must be one of {', '.join(self.choices)}; got {data!r}.")
        if self.max_length is not None and len(data) > self.max_length:
            raise serializers.ValidationError(f"must be at most {self.max_length} characters.")
        return data


# Integers the engine keeps (seeds, token ids, counts) are int64 there; no integer field goes past it.
INT64_MIN, INT64_MAX = -2**63, 2**63 - 1


def check_number(data, *, integer: bool = False, low=None, high=None, low_open: bool = False):
    """`data` as an int (integer) or a float within [low, high] ((low, high] with low_open).

    Integers default to int64's range; a float range must be given (every float reaches a tensor
    or a timer, where only finite, bounded values make sense). Integral floats pass as integers
    (5.0 -> 5), as pydantic's lax mode does for vLLM; a JSON integer in a float field becomes a
    float once it is in range (torch cannot take a Python int past int64 where it wants a float).
    Raises ValidationError for bools, strings, NaN, infinities and out-of-range values.
    """
    if integer:
        low = INT64_MIN if low is None else low
        high = INT64_MAX if high is None else high
    elif low is None or high is None:
        raise TypeError("a float field needs both bounds")
    if isinstance(data, bool) or not isinstance(data, (int, float)):
        raise serializers.ValidationError("must be an integer." if integer else "must be a number.")
    if isinstance(data, float) and not math.isfinite(data):
        raise serializers.ValidationError("must be a finite number.")
    if integer:
        if isinstance(data, float) and not data.is_integer():
            raise serializers.ValidationError("must be an integer.")
        data = int(data)
    if data <= low if low_open else data < low:
        raise serializers.ValidationError(f"must be {'greater than' if low_open else 'at least'} {low}.")
    if data > high:
        raise serializers.ValidationError(f"must be at most {high}.")
    return data if integer else float(data)


class NumberField(StrictField):
    """A JSON number in [low, high] ((low, high] with low_open); `integer` for whole numbers (int64's
    range unless narrower). A float field must give both bounds."""

    def __init__(self, *, integer: bool = False, low=None, high=None, low_open: bool = False, **kw):
        super().__init__(**kw)
        if not integer and (low is None or high is None):
            raise TypeError("a float field needs both bounds")
        self.limits = {"integer": integer, "low": low, "high": high, "low_open": low_open}

    def to_internal_value(self, data):
        return check_number(data, **self.limits)


def IntegerField(**kw) -> NumberField:  # noqa: N802 - reads like a field class at the call site
    """A JSON whole number in [low, high] (int64's range where a bound is not given)."""
    return NumberField(integer=True, **kw)


class StopField(StrictField):
    """`stop`: a string or an array of at most 4 strings (OpenAI's limit). Empty strings are dropped."""

    max_items = 4

    def to_internal_value(self, data):
        if isinstance(data, str):
            data = [data]
        if not isinstance(data, list) or not all(isinstance(s, str) for s in data):
            raise serializers.ValidationError("must be a string or an array of strings.")
        if len(data) > self.max_items:
            raise serializers.ValidationError(f"accepts at most {self.max_items} sequences; got {len(data)}.")
        return [s for s in data if s]


class TokenIdListField(StrictField):
    """An array of non-negative token ids (ranges against the vocabulary are checked with the model)."""

    def __init__(self, *, allow_empty: bool = True, **kw):
        super().__init__(**kw)
        self.allow_empty = allow_empty

    def to_internal_value(self, data):
        if not isinstance(data, list):
            raise serializers.ValidationError("must be an array of token ids.")
        if not data and not self.allow_empty:
            raise serializers.ValidationError("must not be empty.")
        return [check_number(t, integer=True, low=0) for t in data]


class StringListField(StrictField):
    """An array of strings, at most `max_items` of them."""

    def __init__(self, *, max_items: int = 64, **kw):
        super().__init__(**kw)
        self.max_items = max_items

    def to_internal_value(self, data):
        if not isinstance(data, list) or not all(isinstance(s, str) for s in data):
            raise serializers.ValidationError("must be an array of strings.")
        if len(data) > self.max_items:
            raise serializers.ValidationError(f"accepts at most {self.max_items} items.")
        return data


_TOKEN_ID_KEY = re.compile(r"[0-9]{1,12}")


class LogitBiasField(StrictField):
    """`logit_bias`: {"<token id>": bias} with integer keys and biases in [-100, 100] (OpenAI's range)."""

    def to_internal_value(self, data):
        if not isinstance(data, dict):
            raise serializers.ValidationError("must be an object mapping token ids to biases.")
        out: dict[int, float] = {}
        for key, bias in data.items():
            if not _TOKEN_ID_KEY.fullmatch(key):
                raise serializers.ValidationError(f"keys must be token ids (non-negative integers); got {key!r}.")
            token_id = int(key)
            try:
                out[token_id] = float(check_number(bias, low=-100, high=100))
            except serializers.ValidationError as exc:
                raise serializers.ValidationError(f"the bias of token {key} {exc.detail[0]}") from None
        return out


def validate_metadata(data, param: str = "metadata") -> dict:
    """A metadata object: at most 16 pairs of string keys up to 64 and string values up to 512
    characters (OpenAI's limits). Raises ApiError 400 naming `param`."""
    if not isinstance(data, dict):
        raise bad_request(f"'{param}' must be an object of string keys and values.", param)
    if len(data) > 16:
        raise bad_request(f"'{param}' may hold at most 16 pairs; got {len(data)}.", param)
    for key, value in data.items():
        if len(key) > 64:
            raise bad_request(f"'{param}' keys are at most 64 characters: {key[:20]!r}... is longer.", param)
        if not isinstance(value, str) or len(value) > 512:
            raise bad_request(f"'{param}': the value of {key!r} must be a string of at most 512 characters.",
                              param)
    return dict(data)


class MetadataField(StrictField):
    """`metadata`: see validate_metadata."""

    def to_internal_value(self, data):
        return validate_metadata(data)


class ObjectField(StrictField):
    """Any JSON object (a dict), passed through."""

    def to_internal_value(self, data):
        if not isinstance(data, dict):
            raise serializers.ValidationError("must be an object.")
        return data


class ArrayField(StrictField):
    """Any JSON array of objects, passed through."""

    def to_internal_value(self, data):
        if not isinstance(data, list) or not all(isinstance(x, dict) for x in data):
            raise serializers.ValidationError("must be an array of objects.")
        return data


class KeepAliveField(StrictField):
    """`keep_alive` (Ollama's field, on every generating and embedding route): a duration string such as
    "5m" or a number of seconds; 0 unloads the model once idle, negative keeps it loaded
    (operations/model_settings.parse_keep_alive). Returned as sent; the views read it in seconds."""

    def to_internal_value(self, data):
        from inference.operations.model_settings import SettingError, parse_keep_alive

        if isinstance(data, bool) or not isinstance(data, (str, int, float)):
            raise serializers.ValidationError("must be a duration string such as \"5m\" or a number of seconds.")
        if isinstance(data, int) and not INT64_MIN <= data <= INT64_MAX:
            raise serializers.ValidationError("must be a number of seconds within int64.")
        try:
            parse_keep_alive(data)
        except (SettingError, OverflowError) as exc:
            raise serializers.ValidationError(str(exc)) from exc
        return data
