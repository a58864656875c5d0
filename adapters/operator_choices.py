"""The operators' choices over the configuration, applied to the process's registry at start and when saved.

Precedence (README "Models"; swap_watch's module doc): the configuration says which models exist; an
operator's swap (ServedModel) replaces the default chat model where it was made over the same configured
default; an operator's ModelSetting row sets its model's pin and keep_alive over the configuration's.
The start-up log says which applied and why.
"""
from __future__ import annotations

import logging
from pathlib import Path

from django.db import DatabaseError

from inference.operations.model_settings import SettingError, parse_keep_alive
from inference.operations.model_specs import CHAT, ModelSpec

from .models import ModelSetting

log = logging.getLogger("metrale")


def apply_setting(registry, row: ModelSetting) -> bool:
    """Apply one ModelSetting row to `registry` (operations/registry.ModelRegistry): its pin (pinning loads
    the model) and keep_alive, where set. Returns False when the registry has no model of that name."""
    if row.name not in registry.entries:
        return False
    if row.keep_alive:
        try:
            registry.set_keep_alive(row.name, parse_keep_alive(row.keep_alive))
        except SettingError as exc:
            log.error("the operators' keep_alive of %s is ignored: %s", row.name, exc)
    if row.pinned is not None:
        registry.entries[row.name].pinned = row.pinned
    return True


def apply_operator_choices(sender=None, registry=None, **kwargs) -> None:
    """runtime_starting's receiver (before the pinned models load): the operators' swap of the default chat
    model where it applies (swap_watch.chosen_model), then their ModelSetting rows; each logged with why."""
    from . import swap_watch

    if registry is None:
        return
    chosen = swap_watch.chosen_model()
    default = registry.default(CHAT)
    if chosen is not None and default is not None:
        path, name = chosen
        if Path(path) != Path(default.spec.folder) or (name or Path(path).name) != default.name:
            registry.install(default, ModelSpec(name or Path(path).name, Path(path), CHAT), None)
            log.info("the operators' swap applies: the default chat model is %s (%s) in place of the configured %s "
                     "(a swap made over this configured default; `manage.py swap_model` or the admin)",
                     name or Path(path).name, path, default.name)
    try:
        rows = list(ModelSetting.objects.all())
    except DatabaseError:
        return
    for row in rows:
        if apply_setting(registry, row):
            log.info("the operators' setting of %s applies: pinned %s, keep_alive %s", row.name,
                     "as configured" if row.pinned is None else row.pinned, row.keep_alive or "as configured")
