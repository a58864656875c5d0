"""Registries for tests: ModelRegistry (inference/operations/registry.py) with a FakeLoader that hands out given
stand-ins (a Runtime around a FakeEngine, an EmbeddingService) instead of loading weights."""
from __future__ import annotations

import threading
from pathlib import Path

from inference.operations.model_specs import CHAT, EMBEDDING, ModelSpec
from inference.operations.registry import Loaded, Loader, ModelRegistry
from inference.operations.runtime import EmbeddingService

REFUSED = "loading a model is off in in-process tests (install a registry with the model: fake_rt, real_rt)"


class FakeLoader(Loader):
    """Loads `models[name]` (the object itself, or a callable making a fresh one per load); `sizes[name]`:
    its resident bytes, `estimates[name]`: what estimate() says; `fail[name]`: an exception its loads raise;
    `gate`: an Event every load waits for (a load "under way" until set); `beside`: what fits_beside answers
    (the machine's memory holds a swap's new model beside the old). Records `loads` and `released`."""

    def __init__(self, models: dict | None = None, *, sizes: dict | None = None, estimates: dict | None = None,
                 fail: dict | None = None, gate: threading.Event | None = None, beside: bool = True):
        self.models = dict(models or {})
        self.sizes = dict(sizes or {})
        self.estimates = dict(estimates or {})
        self.fail = dict(fail or {})
        self.gate = gate
        self.beside = beside
        self.loads: list[str] = []
        self.released: list[str] = []
        self.lock = threading.Lock()

    def estimate(self, spec: ModelSpec) -> int:
        return self.estimates.get(spec.name, 0)

    def fits_beside(self, spec: ModelSpec, old: Loaded) -> bool:
        return self.beside

    def load(self, spec: ModelSpec, registry) -> Loaded:
        with self.lock:
            self.loads.append(spec.name)
        if self.gate is not None:
            assert self.gate.wait(30), "the test never opened the load gate"
        if spec.name in self.fail:
            raise self.fail[spec.name]
        if spec.name not in self.models:
            raise RuntimeError(REFUSED)
        made = self.models[spec.name]
        model = made() if callable(made) and not hasattr(made, "engine") and not hasattr(made, "runner") else made
        return Loaded(model, self.sizes.get(spec.name, 0), release=lambda: self.released.append(spec.name))


def spec_of(model) -> ModelSpec:
    """The ModelSpec a stand-in is served under: a Runtime's model_id (chat), an EmbeddingService's name."""
    if isinstance(model, ModelSpec):
        return model
    if isinstance(model, EmbeddingService):
        return ModelSpec(model.name, Path(model.path), EMBEDDING)
    return ModelSpec(model.model_id, Path(model.model_path or "."), CHAT)


def registry_of(*models, loader: FakeLoader | None = None, loaded: bool = True, **kw) -> ModelRegistry:
    """A ModelRegistry serving `models` (Runtimes, EmbeddingServices, or ModelSpecs the loader knows), in
    order; with `loaded`, each stand-in is loaded through the registry first (as a request would)."""
    specs = [spec_of(m) for m in models]
    loader = loader or FakeLoader({s.name: m for s, m in zip(specs, models) if not isinstance(m, ModelSpec)})
    registry = ModelRegistry(specs, loader, **kw)
    if loaded:
        for spec, model in zip(specs, models):
            if not isinstance(model, ModelSpec):
                registry.load(spec.name).result(10)
    return registry
