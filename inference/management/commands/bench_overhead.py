"""`manage.py bench_overhead`: the share of a 1-token chat completion's time spent outside the engine.

Starts a daphne server, sends --requests blocking requests one after another
(max_tokens 1, greedy) and reads each response's Server-Timing: `engine` (submit
to the engine's last event, in serving) and `app` (the API middleware's whole
request: auth, parse, template, tokenize, engine, encode), `prep` (parse, validate,
template, tokenize, admit) and `view`. Prints the medians of the server-side share
(app - engine) / app and the client-side share (client wall time - engine) / client
wall time, and the median milliseconds of each part. A script, not a test: the share
depends on how fast the engine is on the machine (and on what else runs there).
"""
import logging
import re
import statistics
import tempfile
import time
from pathlib import Path

import httpx
from django.conf import settings
from django.core.management.base import BaseCommand

from inference.bench.live_server import LiveServer

TIMING = re.compile(r"(\w+);dur=([0-9.]+)")


def one_request(client: httpx.Client, url: str, prompt: str) -> dict:
    """One blocking 1-token completion: client wall ms and the server's Server-Timing entries (ms)."""
    body = {"model": "bench", "messages": [{"role": "user", "content": prompt}], "max_tokens": 1, "temperature": 0}
    t0 = time.perf_counter()
    r = client.post(url + "/v1/chat/completions", json=body)
    wall_ms = (time.perf_counter() - t0) * 1000
    r.raise_for_status()
    timings = {k: float(v) for k, v in TIMING.findall(r.headers["server-timing"])}
    return {"client": wall_ms, **timings}


class Command(BaseCommand):
    help = "Median share of a 1-token chat completion's time spent outside the engine (through HTTP)."

    def add_arguments(self, parser):
        parser.add_argument("--requests", type=int, default=200)
        parser.add_argument("--prompt", default="What is the capital of France?")

    def handle(self, *args, requests, prompt, **options):
        logging.getLogger("httpx").setLevel(logging.WARNING)
        model = settings.METRALE["MODEL"]
        with tempfile.TemporaryDirectory() as tmp, LiveServer({"METRALE_MODEL": model}, Path(tmp)) as server, \
                httpx.Client(timeout=120) as client:
            for _ in range(5):  # warm-up: first-use costs (template compile, DB connection)
                one_request(client, server.url, prompt)
            rows = [one_request(client, server.url, prompt) for _ in range(requests)]
        for r in rows:
            r["auth+middleware"] = r["app"] - r["view"]
            r["encode"] = r["view"] - r["prep"] - r["engine"]
            r["outside (server)"] = r["app"] - r["engine"]
            r["outside (client)"] = r["client"] - r["engine"]
        server_share = statistics.median((r["app"] - r["engine"]) / r["app"] for r in rows)
        client_share = statistics.median((r["client"] - r["engine"]) / r["client"] for r in rows)
        self.stdout.write(f"{requests} blocking chat completions, max_tokens=1, prompt {prompt!r}")
        for key in ("client", "app", "engine", "prep", "encode", "auth+middleware", "outside (server)",
                    "outside (client)"):
            values = sorted(r[key] for r in rows)
            self.stdout.write(f"  {key:<18} median {statistics.median(values):8.2f} ms   "
                              f"p10 {values[len(values) // 10]:8.2f}   p90 {values[len(values) * 9 // 10]:8.2f}")
        self.stdout.write(f"median share outside the engine: {server_share:.1%} of the server's time, "
                          f"{client_share:.1%} of the client's wall time")
