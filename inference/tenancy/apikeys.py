"""API key material: generating a key, the prefix people see, and the hash that is stored.

A key reads `mk-` + 8 lowercase letters/digits (the lookup part, stored in clear as the prefix)
+ 43 URL-safe characters of secret (256 bits). Keys are random, so one SHA-256 is the right hash
(as for GitHub's tokens); a slow password hash would only cost time on every request.
"""
from __future__ import annotations

import hashlib
import hmac
import secrets
import string

KEY_START = "mk-"
_LOOKUP_ALPHABET = string.ascii_lowercase + string.digits
_LOOKUP_CHARS = 8
PREFIX_LENGTH = len(KEY_START) + _LOOKUP_CHARS
_DUMMY_HASH = hashlib.sha256(b"metrale: no such key").hexdigest()


def generate_key() -> str:
    """A new random key, e.g. `mk-k3v9x0aa…` (54 characters)."""
    lookup = "".join(secrets.choice(_LOOKUP_ALPHABET) for _ in range(_LOOKUP_CHARS))
    return KEY_START + lookup + secrets.token_urlsafe(32)


def key_prefix(key: str) -> str:
    """The part of a key that is stored in clear and shown to people (`mk-` + 8 characters)."""
    return key[:PREFIX_LENGTH]


def looks_like_key(key: str) -> bool:
    """True when `key` has the shape of one of ours (so a prefix lookup is worth a query)."""
    return key.startswith(KEY_START) and len(key) > PREFIX_LENGTH


def hash_key(key: str) -> str:
    """The stored form of a key: SHA-256, hex."""
    return hashlib.sha256(key.encode("utf-8", "surrogatepass")).hexdigest()


def key_matches(key: str, stored_hash: str | None) -> bool:
    """Compare `key` with a stored hash in constant time. With no stored hash (no key has the
    prefix) the same work is done against a dummy, so timing does not tell the two apart."""
    return digest_matches(hash_key(key), stored_hash)


def digest_matches(digest: str, stored_hash: str | None) -> bool:
    """key_matches for a key already hashed (hash_key's digest)."""
    return hmac.compare_digest(digest, stored_hash or _DUMMY_HASH) and stored_hash is not None
