"""The size limit of a JSON schema a request carries (response formats, structured outputs, tool parameters), and
of structured_outputs' choice lists, regexes and grammars.

A schema becomes a grammar compiled on the grammar worker thread (engine/grammar.py), which serves
every request in turn: a 1 MB `const` held it ~2 s. METRALE["MAX_SCHEMA_BYTES"] (default 64 KiB)
bounds each schema, measured as compact JSON in UTF-8, before anything compiles it.
"""
from __future__ import annotations

import json

from django.conf import settings

from .errors import bad_request


def check_schema_size(schema, param: str, what: str = "a schema") -> None:
    """Raise ApiError 400 (code `schema_too_large`, naming `param`, e.g.
    `response_format.json_schema.schema` or `tools[0].function.parameters`) when `schema` (a
    parsed JSON value) is over METRALE["MAX_SCHEMA_BYTES"] bytes as compact JSON; None otherwise.
    `what` names it in the message (structured_outputs' choice lists, regexes and grammars are
    bounded the same way)."""
    limit = settings.METRALE["MAX_SCHEMA_BYTES"]
    size = len(json.dumps(schema, ensure_ascii=False, separators=(",", ":")).encode("utf-8", "surrogatepass"))
    if size > limit:
        raise bad_request(f"'{param}' is {size} bytes as JSON; {what} may have at most {limit} bytes.",
                          param, code="schema_too_large")
