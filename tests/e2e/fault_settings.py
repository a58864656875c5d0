"""Settings of a live server whose engine thread dies at its first request (test_engine_fault.py only).

The real settings, plus one fault: LLMEngine.add_request raises an error that is no request's
(not RequestRejected), so the engine thread's loop dies while draining its commands.
"""
from metrale_site.settings import *  # noqa: F401,F403

from inference.engine.llm_engine import LLMEngine


def _admission_bug(self, request, *args, **kwargs):
    raise RuntimeError("injected engine-thread fault")


LLMEngine.add_request = _admission_bug
