"""Small environment-variable readers that fail with ImproperlyConfigured on bad values."""
import json
import os

from django.core.exceptions import ImproperlyConfigured


def envstr(name: str, default: str | None = None) -> str | None:
    """Return the variable's text, or `default` when it is unset or empty."""
    value = os.environ.get(name, "")
    return value if value != "" else default


def envbool(name: str, default: bool | None) -> bool | None:
    """Read a boolean (1/0, true/false, yes/no, on/off).

    Raises ImproperlyConfigured for any other text."""
    value = os.environ.get(name, "").strip().lower()
    if value == "":
        return default
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off"):
        return False
    raise ImproperlyConfigured(f"{name} must be a boolean, got {value!r}")


def envint(name: str, default: int | None) -> int | None:
    """Read an integer. Raises ImproperlyConfigured when the text is not one."""
    value = os.environ.get(name, "").strip()
    if value == "":
        return default
    try:
        return int(value)
    except ValueError as exc:
        raise ImproperlyConfigured(f"{name} must be an integer, got {value!r}") from exc


def envfloat(name: str, default: float | None) -> float | None:
    """Read a float. Raises ImproperlyConfigured when the text is not one."""
    value = os.environ.get(name, "").strip()
    if value == "":
        return default
    try:
        return float(value)
    except ValueError as exc:
        raise ImproperlyConfigured(f"{name} must be a number, got {value!r}") from exc


_DURATION_UNITS_S = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def envduration_s(name: str, default: float) -> float:
    """Read a duration in seconds: a number of seconds, or a number with a unit s, m, h or d
    ("30d", "12h"). Raises ImproperlyConfigured for anything else or a negative value."""
    value = os.environ.get(name, "").strip().lower()
    if value == "":
        return default
    scale = _DURATION_UNITS_S.get(value[-1])
    number = value[:-1] if scale else value
    try:
        seconds = float(number) * (scale or 1)
    except ValueError as exc:
        raise ImproperlyConfigured(
            f"{name} must be a duration such as 3600, 12h or 30d, got {value!r}") from exc
    if seconds < 0:
        raise ImproperlyConfigured(f"{name} must not be negative, got {value!r}")
    return seconds


def envlist(name: str) -> list[str]:
    """Read a comma-separated list; blanks around items are dropped, empty items skipped."""
    return [item.strip() for item in os.environ.get(name, "").split(",") if item.strip()]


def envjson(name: str, default):
    """Read a JSON value. Raises ImproperlyConfigured when the text is not JSON."""
    value = os.environ.get(name, "").strip()
    if value == "":
        return default
    try:
        return json.loads(value)
    except json.JSONDecodeError as exc:
        raise ImproperlyConfigured(f"{name} must be JSON, got {value!r}: {exc}") from exc
