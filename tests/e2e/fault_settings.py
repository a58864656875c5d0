"""Settings of a live server whose engine thread dies at its first request (test_engine_fault.py, and
tests/faults/test_serve.py's `manage.py serve`).

The real settings, plus one fault: LLMEngine.add_request raises an error that is no request's
(not RequestRejected), so the engine thread's loop dies while draining its commands.

The fault is put in as inference.engine.llm_engine is first imported, not here: importing it here
would import torch (seconds of CPU) in every process these settings start, `manage.py serve`'s
supervisor included, which never runs an engine.
"""
import importlib.abc
import importlib.util
import sys

from metrale_site.settings import *  # noqa: F401,F403

ENGINE_MODULE = "inference.engine.llm_engine"


def _admission_bug(self, request, *args, **kwargs):
    raise RuntimeError("injected engine-thread fault")


def _put_in(module) -> None:
    module.LLMEngine.add_request = _admission_bug


class _FaultOnImport(importlib.abc.MetaPathFinder):
    """Finds the engine module as the other finders do, and has its loader put the fault in once the
    module has run."""

    def find_spec(self, name, path, target=None):
        if name != ENGINE_MODULE:
            return None
        sys.meta_path.remove(self)  # the module is found once; find_spec below asks the other finders
        spec = importlib.util.find_spec(name)
        run = spec.loader.exec_module

        def exec_module(module):
            run(module)
            _put_in(module)

        spec.loader.exec_module = exec_module
        return spec


if ENGINE_MODULE in sys.modules:
    _put_in(sys.modules[ENGINE_MODULE])
else:
    sys.meta_path.insert(0, _FaultOnImport())
