"""The tenant key that scopes every stored response and conversation to one tenant."""
from __future__ import annotations

DEFAULT_TENANT_KEY = "default"


def tenant_key_for(request) -> str:
    """The tenant key of `request`: `str(request.principal.tenant.pk)` once auth has set
    `request.principal`, else "default" (auth off: the whole server is one tenant).

    Every read, list, continuation and delete filters on this key, so another tenant's ids
    answer 404, never 403 (OpenAI does not reveal that an id exists elsewhere).
    """
    principal = getattr(request, "principal", None)
    if principal is None:
        return DEFAULT_TENANT_KEY
    return str(principal.tenant.pk)
