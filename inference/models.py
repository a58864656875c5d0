"""The inference app's models; each lives in its own module."""
from .stored_completions import StoredChatCompletion  # noqa: F401
