"""manage.py models [list | load NAME | unload NAME]: the running servers' models, as `swap_model` reaches them.

The command writes to the database the servers share (adapters.models.ModelSetting): `load` and `unload`
leave a command in the model's row, which every server's watcher (adapters.swap_watch, every
METRALE_SWAP_POLL_S seconds) runs on its registry and clears; each server reports its models' states
into the rows, which `list` prints (with when they were reported).
"""
from __future__ import annotations

import time

from django.core.management.base import BaseCommand, CommandError


class Command(BaseCommand):
    help = "List, load or unload the models of the running server(s) sharing this database."

    def add_arguments(self, parser):
        parser.add_argument("action", nargs="?", default="list", choices=["list", "load", "unload"])
        parser.add_argument("name", nargs="?", help="The model's served name (load, unload).")
        parser.add_argument("--wait", type=float, default=120.0, help="Seconds to wait for the outcome (default 120).")
        parser.add_argument("--no-wait", action="store_true", help="Leave the command and return.")

    def handle(self, action, name, wait, no_wait, **options):
        from adapters.models import ModelSetting

        if action == "list":
            rows = list(ModelSetting.objects.all())
            if not rows:
                self.stdout.write("no server has reported its models yet")
            for row in rows:
                size = f"{row.resident_bytes / 1e6:.1f} MB" if row.resident_bytes else "-"
                reported = row.reported.isoformat(timespec="seconds") if row.reported else "never"
                self.stdout.write(f"{row.name}\t{row.state or '?'}\t{size}\treported {reported}"
                                  + (f"\t{row.error}" if row.error else ""))
            return
        if not name:
            raise CommandError(f"`models {action}` needs the model's name")
        row = ModelSetting.objects.filter(name=name).first()
        if row is None:
            raise CommandError(f"no server serves a model named {name!r} (`manage.py models list`)")
        ModelSetting.objects.filter(pk=row.pk).update(command=action)
        if no_wait:
            self.stdout.write(f"asked the servers to {action} {name}")
            return
        want = "loaded" if action == "load" else "unloaded"
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            row.refresh_from_db()
            if not row.command and row.state == want:
                self.stdout.write(f"{name}: {want}")
                return
            if not row.command and row.state == "failed":
                raise CommandError(f"{name} failed to load: {row.error}")
            time.sleep(0.5)
        raise CommandError(f"no server reported {name} {want} within {wait:g} s (state: {row.state or '?'}; an "
                           "unload waits for the model to be idle)")
