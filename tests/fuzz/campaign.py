"""`make fuzz`: a long fuzz campaign against a live daphne serving the real model, on loopback only.

Bodies come from the suite's own strategies (strategies.py: every route's fields with their kinds and
ranges, and the hostile kinds; --plausible of them plausible bodies that reach the engine, with short
completions),
generated in one thread and sent by a few client threads, plus the
transport-level kinds every so often (an over-size chunked body, multipart, a non-JSON answer's routes).
Each answer is judged as the in-process suite judges it (checks.check_answer); a timeout counts as a
finding (a hang). Every 2,000 requests, and at the end, a greedy request must answer as it did first.

Bounded by --requests and --time-s. Prints the figures as JSON (requests sent, by status, 5xx, findings,
wall time, the server's RSS) and writes each finding to --findings; exits 1 when there is one.

    python -m tests.fuzz.campaign --requests 20000 --time-s 3600
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import queue
import sys
import threading
import time
from collections import Counter
from pathlib import Path

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "metrale_site.settings")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import django  # noqa: E402

django.setup()

import httpx  # noqa: E402
from hypothesis import HealthCheck, Phase, given, settings  # noqa: E402

from inference.bench.live_server import LiveServer  # noqa: E402

from .checks import check_answer  # noqa: E402
from .routes import ROUTES, Route  # noqa: E402
from .strategies import SHORT, Body, routes_and_bodies  # noqa: E402

GREEDY = {"messages": [{"role": "user", "content": "What is the capital of France?"}], "temperature": 0,
          "max_tokens": 12}
PROBE_EVERY = 2000
TRANSPORT_EVERY = 1000
TIMEOUT_S = 120.0


def generate(out: queue.Queue, stop: threading.Event, errors: list, plausible: float, batch: int = 500) -> None:
    """Put (route, Body) pairs on `out` until `stop` is set, drawing new examples each batch. A broken
    strategy stops the campaign (its error in `errors`) rather than leaving the clients waiting."""
    @settings(max_examples=batch, database=None, deadline=None, phases=[Phase.generate],
              suppress_health_check=list(HealthCheck))
    @given(case=routes_and_bodies(ROUTES, SHORT, plausible=plausible))
    def draw(case):
        while not stop.is_set():
            try:
                out.put(case, timeout=0.5)
                return
            except queue.Full:
                continue

    while not stop.is_set():
        try:
            draw()
        except Exception as exc:
            errors.append(repr(exc)[:2000])
            stop.set()


class Campaign:
    """The counters, shared by the client threads."""

    def __init__(self, url: str, conversation: str, findings: Path):
        self.url = url
        self.conversation = conversation
        self.findings_path = findings
        self.lock = threading.Lock()
        self.sent = 0
        self.by_status: Counter = Counter()
        self.by_route: Counter = Counter()
        self.findings: list[dict] = []

    def record(self, route: str, status: int | str, finding: str | None = None, body: bytes = b"") -> None:
        with self.lock:
            self.sent += 1
            self.by_status[status] += 1
            self.by_route[route] += 1
            if finding is not None:
                entry = {"route": route, "status": status, "finding": finding[:2000],
                         "body": body[:4000].decode("utf-8", "backslashreplace")}
                self.findings.append(entry)
                with self.findings_path.open("a") as f:
                    f.write(json.dumps(entry) + "\n")

    def send(self, client: httpx.Client, route: Route, body: Body) -> None:
        path = route.path.replace("conv_fuzz", self.conversation)
        try:
            answer = client.request(route.method, self.url + path, content=body.raw,
                                    headers={"content-type": body.content_type})
        except httpx.TimeoutException as exc:
            self.record(route.path, "timeout", f"no answer in {TIMEOUT_S} s: {exc!r}", body.raw)
            return
        except httpx.HTTPError as exc:
            self.record(route.path, "transport", f"{exc!r}", body.raw)
            return
        try:
            check_answer(route, body, answer.status_code, dict(answer.headers), answer.content)
        except AssertionError as exc:
            self.record(route.path, answer.status_code, str(exc), body.raw)
            return
        self.record(route.path, answer.status_code)

    def transport_cases(self, client: httpx.Client) -> None:
        """The kinds below the JSON body: every answer JSON, an over-size chunked body refused."""
        limit = 32 << 20

        def chunks():
            piece = b" " * (1 << 20)
            for _ in range((limit >> 20) + 2):
                yield piece

        cases = [("POST", "/v1/chat/completions", chunks(), {"content-type": "application/json"}),
                 ("GET", "/v1/", None, {}), ("GET", "/v1", None, {}), ("POST", "/health", None, {}),
                 ("DELETE", "/health", None, {}), ("GET", "/tokenize/", None, {}),
                 ("POST", "/v1/completions", b"--x\r\n\r\n--x--", {"content-type": "multipart/form-data"}),
                 ("POST", "/v1/completions", b"a=%ff", {"content-type": "application/x-www-form-urlencoded"})]
        for method, path, content, headers in cases:
            try:
                answer = client.request(method, self.url + path, content=content, headers=headers)
            except httpx.HTTPError as exc:
                self.record(path, "transport", f"{method} {path}: {exc!r}")
                continue
            ok = answer.status_code < 500 and answer.headers.get("content-type") == "application/json"
            if path == "/v1/chat/completions":
                ok = ok and answer.status_code == 413
            self.record(path, answer.status_code, None if ok else f"{method} {path}: {answer.status_code} "
                                                                  f"{answer.headers.get('content-type')} "
                                                                  f"{answer.content[:200]!r}")


def greedy(client: httpx.Client, url: str) -> str:
    answer = client.post(url + "/v1/chat/completions", json=GREEDY)
    answer.raise_for_status()
    return answer.json()["choices"][0]["message"]["content"]


def probe(client: httpx.Client, url: str, expected: str, campaign: Campaign) -> bool:
    """Whether the greedy request still answers `expected` (a failure is recorded as a finding)."""
    try:
        got = greedy(client, url)
    except httpx.HTTPError as exc:
        campaign.record("greedy probe", "transport", repr(exc))
        return False
    if got != expected:
        campaign.record("greedy probe", 200, f"greedy answer changed: {got!r} (was {expected!r})")
    return got == expected


def rss_kb(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def run(requests: int, time_s: float, workers: int, workdir: Path, model: str, plausible: float,
        max_model_len: int = 1024) -> dict:
    workdir.mkdir(parents=True, exist_ok=True)
    findings = workdir / "findings.jsonl"
    findings.unlink(missing_ok=True)
    # A 1,024-token context: a long prompt that fits is real prefill work, and hostile strings of up to
    # 300,000 characters would otherwise make most of the campaign's time prefill.
    server = LiveServer({"METRALE_MODEL": model, "METRALE_KV_CACHE_BYTES": str(256 << 20),
                         "METRALE_MAX_MODEL_LEN": str(max_model_len)}, workdir)
    try:
        server.wait_ready()
        with httpx.Client(timeout=TIMEOUT_S) as client:
            first = greedy(client, server.url)
            conversation = client.post(server.url + "/v1/conversations", json={}).json()["id"]
        campaign = Campaign(server.url, conversation, findings)
        rss_start = rss_kb(server.proc.pid)
        bodies: queue.Queue = queue.Queue(maxsize=256)
        stop = threading.Event()
        errors: list[str] = []
        producer = threading.Thread(target=generate, args=(bodies, stop, errors, plausible), daemon=True)
        producer.start()
        started = time.monotonic()
        probes: list[bool] = []

        def client_loop(index: int) -> None:
            with httpx.Client(timeout=TIMEOUT_S) as client:
                while not stop.is_set():
                    with campaign.lock:
                        if campaign.sent >= requests or time.monotonic() - started > time_s:
                            stop.set()
                            return
                        n = campaign.sent
                    if index == 0 and n and n % TRANSPORT_EVERY < workers:
                        campaign.transport_cases(client)
                    if index == 0 and n and n % PROBE_EVERY < workers:
                        probes.append(probe(client, server.url, first, campaign))
                    try:
                        route, body = bodies.get(timeout=5)
                    except queue.Empty:
                        continue
                    campaign.send(client, route, body)

        threads = [threading.Thread(target=client_loop, args=(i,)) for i in range(workers)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        stop.set()
        wall_s = time.monotonic() - started
        with httpx.Client(timeout=TIMEOUT_S) as client:
            probes.append(probe(client, server.url, first, campaign))
        return {
            "requests": campaign.sent, "wall_s": round(wall_s, 1),
            "requests_per_s": round(campaign.sent / wall_s, 1),
            "by_status": {str(k): v for k, v in sorted(campaign.by_status.items(), key=str)},
            "status_5xx": sum(v for k, v in campaign.by_status.items() if isinstance(k, int) and k >= 500),
            "findings": len(campaign.findings), "by_route": dict(campaign.by_route),
            "greedy_probes": len(probes), "greedy_unchanged": all(probes), "greedy_answer": first,
            "server_rss_mb": {"start": rss_start // 1024, "end": rss_kb(server.proc.pid) // 1024},
            "findings_file": str(findings), "generator_errors": errors,
        }
    finally:
        server.stop()


def main(argv=None) -> int:
    from django.conf import settings as django_settings

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=20_000)
    parser.add_argument("--time-s", type=float, default=3600.0)
    parser.add_argument("--workers", type=int, default=16)
    parser.add_argument("--plausible", type=float, default=0.1,
                        help="the fraction of bodies that are plausible (most reach the engine)")
    parser.add_argument("--workdir", type=Path, default=Path("var/fuzz"))
    parser.add_argument("--model", default=str(Path(django_settings.METRALE_HOME) / "models" /
                                               "smollm2-135m-instruct"))
    args = parser.parse_args(argv)
    logging.getLogger("httpx").setLevel(logging.WARNING)
    figures = run(args.requests, args.time_s, args.workers, args.workdir, args.model, args.plausible)
    print(json.dumps(figures, indent=2))
    clean = not figures["findings"] and not figures["status_5xx"] and not figures["generator_errors"]
    return 0 if clean and figures["greedy_unchanged"] else 1


if __name__ == "__main__":
    sys.exit(main())
