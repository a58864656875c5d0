"""manage.py swap_model PATH [--name NAME]: the running server(s) swap their model for PATH without dropping a request."""
from __future__ import annotations

import time
from pathlib import Path

from django.core.management.base import BaseCommand, CommandError

from adapters.models import ServedModel


class Command(BaseCommand):
    help = ("Swap the served model for the HF folder PATH: writes the served-model setting that every server "
            "sharing this database follows (adapters.swap_watch), then waits for the swap's outcome.")

    def add_arguments(self, parser):
        parser.add_argument("path", help="An HF model folder (config.json, *.safetensors, tokenizer.json).")
        parser.add_argument("--name", default="", help="The served model id (default: the folder's name).")
        parser.add_argument("--wait", type=float, default=600.0, help="Seconds to wait for the servers (default 600).")
        parser.add_argument("--no-wait", action="store_true", help="Write the setting and return.")
        parser.add_argument("--replaces", default=None, help=(
            "The configured default chat model (its folder, GGUF file or name, as the servers' METRALE_MODELS or "
            "METRALE_MODEL say it) the swap replaces; servers configured with another default ignore the swap. "
            "Default: this shell's configuration."))

    def handle(self, path, name, wait, no_wait, replaces=None, **options):
        folder = Path(path).expanduser().resolve()
        if not (folder / "config.json").is_file():
            raise CommandError(f"{folder} is not a model folder (no config.json)")
        from adapters.swap_watch import configured_default
        from inference.operations.model_specs import spec_for

        # The swap replaces the default chat model of servers configured with `replaces` (swap_watch's precedence).
        configured = spec_for(replaces).source if replaces else configured_default()
        self.stdout.write(f"the swap replaces the configured default {configured}")
        ServedModel.objects.update_or_create(pk=1, defaults={"path": str(folder), "served_name": name,
                                                             "configured": configured,
                                                             "state": "pending", "error": "", "fingerprint": ""})
        row = ServedModel.objects.get(pk=1)
        if no_wait:
            self.stdout.write(f"asked the servers to serve {row.name!r} from {folder}")
            return
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            row = ServedModel.objects.get(pk=1)
            if row.path != str(folder) or row.served_name != name:
                raise CommandError("another swap was asked for meanwhile")
            if row.state == "serving":
                self.stdout.write(f"serving {row.name!r} from {folder} ({row.fingerprint})")
                return
            if row.state == "failed":
                raise CommandError(f"the swap failed; the previous model still serves: {row.error}")
            time.sleep(0.5)
        raise CommandError(f"no server reported the swap within {wait:g} s (state: {row.state})")
