"""Thinking-block signatures: an HMAC-SHA256 of the thinking text under the server's secret.

Anthropic signs every thinking block it returns and refuses a thinking block sent back whose
signature does not match its text (a modified or foreign block). The same rule here: the key is
derived from Django's SECRET_KEY (`salted_hmac`, with this module's salt), so a signature verifies
on every process that shares the secret, and only there.
"""
from __future__ import annotations

import base64

from django.utils.crypto import constant_time_compare, salted_hmac

SALT = "metrale.anthropic.thinking"


def sign(thinking: str) -> str:
    """The signature of a thinking block's text: URL-safe base64 (no padding) of 32 HMAC bytes."""
    digest = salted_hmac(SALT, thinking, algorithm="sha256").digest()
    return base64.urlsafe_b64encode(digest).rstrip(b"=").decode("ascii")


def verifies(thinking: str, signature: object) -> bool:
    """Whether `signature` is this server's signature of `thinking` (False for a non-string)."""
    return isinstance(signature, str) and constant_time_compare(sign(thinking), signature)
