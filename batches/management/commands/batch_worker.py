"""manage.py batch_worker: a Celery worker that loads the engine once and runs batches (METRALE["BATCH_QUEUE"])."""
from __future__ import annotations

import os
import socket

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from inference.operations import heartbeat
from inference.operations.registry import ModelLoadFailed, process_registry


class Command(BaseCommand):
    help = ("Run batches from CELERY_BROKER_URL's `batches` queue on this process's engine (loaded once). "
            "One engine per process: the solo pool (default) or threads, never prefork.")

    def add_arguments(self, parser):
        parser.add_argument("--pool", choices=("solo", "threads"), default="solo",
                            help="solo: one batch at a time; threads: several share the engine.")
        parser.add_argument("--concurrency", type=int, default=1, help="Batches at once with --pool threads.")
        parser.add_argument("--loglevel", default="INFO")

    def handle(self, *args, pool, concurrency, loglevel, **options):
        if not settings.CELERY_BROKER_URL:
            raise CommandError("CELERY_BROKER_URL is not set: without a broker the server runs batches itself.")
        heartbeat.start()
        try:
            registry = process_registry()
            registry.start()  # the pinned models; the others load when a line names them
            default = registry.default()
            if default is not None and default.pinned:
                try:
                    registry.acquire_blocking(default).release()
                except ModelLoadFailed as exc:
                    raise CommandError(str(exc)) from exc
            from metrale_site.celery import app

            app.worker_main(["worker", "--queues", settings.METRALE["BATCH_QUEUE"], "--pool", pool,
                             "--concurrency", str(concurrency if pool == "threads" else 1),
                             "--loglevel", loglevel, "--without-gossip", "--without-mingle",
                             "--hostname", f"batches-{os.getpid()}@{socket.gethostname()}"])
        finally:
            heartbeat.stop()
