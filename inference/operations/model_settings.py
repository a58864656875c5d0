"""The registry's two value syntaxes: a keep_alive (Ollama's meaning) and a memory size (METRALE_MEMORY_BUDGET).

keep_alive, as Ollama's API reads it (docs/api.md, "keep_alive"; its api.Duration): a number is
seconds; a string is a Go duration ("5m", "1h30m", "300ms", "-1s"); 0 unloads the model as soon as
no request holds it; any negative value keeps it loaded for good. A string of a bare number
("300", "-1") is read as seconds too (Ollama's CLI accepts it). The result is seconds, with
`math.inf` for "never".

A size is a number of bytes with an optional unit: B, KB / MB / GB / TB (powers of 1000) or KiB /
MiB / GiB / TiB (powers of 1024), case-insensitive; "4GB" is 4_000_000_000 bytes.
"""
from __future__ import annotations

import math
import re

_GO_UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "μs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
# ASCII digits only (a bare \d would take any script's digits, which neither Go nor Ollama reads).
_GO_PART = re.compile(r"([0-9]+(?:\.[0-9]*)?|\.[0-9]+)(ns|us|µs|μs|ms|s|m|h)")
_NUMBER = re.compile(r"[+-]?([0-9]+(?:\.[0-9]*)?|\.[0-9]+)")
# Go's longest time.Duration (2^63 - 1 ns, about 292 years): a keep_alive at least this long is "never".
GO_MAX_DURATION_S = (2**63 - 1) / 1e9


class SettingError(ValueError):
    """A keep_alive or size value that cannot be read; the message names what is accepted."""


def parse_keep_alive(value) -> float:
    """Seconds a model stays loaded once idle: `value` as Ollama reads keep_alive (module doc).

    value: int / float (seconds) or str (a Go duration or a bare number of seconds). Returns seconds
    (float, >= 0), math.inf for a negative value or one past GO_MAX_DURATION_S (never unload). Raises
    SettingError for anything else (a bool, NaN or an infinite number, an unknown unit, another script's
    digits, an empty string)."""
    if isinstance(value, bool) or value is None:
        raise SettingError(f"keep_alive must be a duration such as \"5m\" or a number of seconds, not {value!r}")
    if isinstance(value, (int, float)):
        seconds = float(value)
    elif isinstance(value, str):
        seconds = _go_duration(value.strip())
    else:
        raise SettingError(f"keep_alive must be a duration such as \"5m\" or a number of seconds, not {value!r}")
    if math.isnan(seconds) or (math.isinf(seconds) and seconds > 0):
        raise SettingError(f"keep_alive must be a finite number of seconds, not {value!r}")
    return math.inf if seconds < 0 or seconds >= GO_MAX_DURATION_S else seconds


def _go_duration(text: str) -> float:
    """A Go time.ParseDuration string (or a bare number: seconds) in seconds."""
    if _NUMBER.fullmatch(text):
        return float(text)
    sign = -1.0 if text.startswith("-") else 1.0
    body = text[1:] if text[:1] in "+-" else text
    if body == "0":
        return 0.0
    pos, total = 0, 0.0
    for match in _GO_PART.finditer(body):
        if match.start() != pos:
            break
        total += float(match.group(1)) * _GO_UNITS[match.group(2)]
        pos = match.end()
    if not body or pos != len(body):
        raise SettingError(f"keep_alive {text!r} is not a duration: use a number of seconds or units "
                           "ns, us, ms, s, m, h (e.g. \"5m\", \"1h30m\", \"-1\" for never)")
    return sign * total


_SIZE = re.compile(r"\s*(\d+(?:\.\d*)?|\.\d+)\s*([kmgt]i?b|b)?\s*", re.IGNORECASE)
_SIZE_UNITS = {"b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
               "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "tib": 1 << 40}


def parse_size(value) -> int:
    """Bytes of a size such as "4GB", "512MiB" or 1000000 (module doc). Raises SettingError."""
    if isinstance(value, bool):
        raise SettingError(f"a size must be bytes or a number with a unit such as 4GB, not {value!r}")
    if isinstance(value, int):
        if value <= 0:
            raise SettingError(f"a size must be positive, not {value!r}")
        return value
    match = _SIZE.fullmatch(str(value))
    if match is None:
        raise SettingError(f"{value!r} is not a size: use bytes or a number with B, KB, MB, GB, TB (1000s) or "
                           "KiB, MiB, GiB, TiB (1024s), e.g. 4GB")
    size = int(float(match.group(1)) * _SIZE_UNITS[(match.group(2) or "b").lower()])
    if size <= 0:
        raise SettingError(f"a size must be positive, not {value!r}")
    return size


def format_keep_alive(seconds: float) -> str:
    """A keep_alive in seconds as the admin and /v1/models show it: "never", "0s", "5m", "90s"."""
    if math.isinf(seconds):
        return "never"
    if seconds >= 60 and seconds % 60 == 0:
        return f"{int(seconds // 60)}m"
    return f"{seconds:g}s"
