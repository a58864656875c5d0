"""The request log: one record per API request, as a JSON line (METRALE_REQUEST_LOG) and a database row.

Each API request gets a RequestRecord when it arrives (observe.ObservedRequests); the view
fills in its tenant (api.openai_endpoint) and its generation (serving.choices.Choices calls
`attach` and `on_delta`); when the response ends the record becomes one line:

    {"request_id", "ts" (ISO 8601, UTC, arrival), "route", "method", "tenant", "model", "status",
     "prompt_tokens", "completion_tokens", "cached_tokens", "ttft_ms", "e2e_ms", "finish_reason",
     "replica"}

plus, only with METRALE_REQUEST_LOG_BODIES, "request_body" (the JSON body as sent, or its text)
and "response_body" (a blocking JSON answer as sent; a generation summarised as each choice's
final text, reasoning, tool calls and finish reason, with the usage). Fields follow the contract
of reference/contracts-next.md section 6 (ttft_ms: arrival to the first generated token).

`submit` never waits: records go through a bounded queue to one writer thread, which appends
the lines to the file and writes the same records, without bodies, to RequestLogEntry in
batches, deleting rows older than METRALE_REQUEST_LOG_DB_TTL; when the queue is full a record
is dropped and counted in metrale:request_log_dropped_total.
"""
from __future__ import annotations

import json
import logging
import queue
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone as dt_timezone

from django.conf import settings
from django.db import DatabaseError, close_old_connections, models
from django.utils import timezone

from .metrics import REQUEST_LOG_DROPPED

log = logging.getLogger("metrale")

# Bytes of a request or response body kept for the log (bodies on); the rest is cut.
BODY_LIMIT_BYTES = 1 << 20
QUEUE_SIZE = 10000
BATCH_SIZE = 200
BATCH_INTERVAL_S = 1.0
PRUNE_INTERVAL_S = 300.0


class RequestLogEntry(models.Model):
    """One API request (no bodies), written in batches by the request log's writer thread."""

    request_id = models.CharField(max_length=200, db_index=True)
    ts = models.DateTimeField(db_index=True, help_text="When the request arrived.")
    replica = models.CharField(max_length=200, blank=True, help_text="The server process that served it.")
    route = models.CharField(max_length=200, db_index=True)
    method = models.CharField(max_length=10)
    tenant = models.CharField(max_length=100, blank=True, db_index=True)
    model = models.CharField(max_length=200, blank=True)
    status = models.PositiveSmallIntegerField(db_index=True)
    prompt_tokens = models.PositiveIntegerField(null=True, blank=True)
    completion_tokens = models.PositiveIntegerField(null=True, blank=True)
    cached_tokens = models.PositiveIntegerField(null=True, blank=True)
    ttft_ms = models.FloatField(null=True, blank=True)
    e2e_ms = models.FloatField()
    finish_reason = models.CharField(max_length=40, blank=True)

    class Meta:
        app_label = "inference"
        ordering = ["-ts"]
        verbose_name = "request log entry"
        verbose_name_plural = "request log"

    def __str__(self):
        return f"{self.request_id} {self.route} {self.status}"


# The API requests in flight in this process, by x-request-id and by the id of each engine request
# they submitted (the dashboard reads their tenant and route; a cancel finds their engine requests).
live_records: dict[str, "RequestRecord"] = {}


@dataclass(eq=False)
class RequestRecord:
    """What one request did, filled in while it runs (see the module docstring)."""

    request_id: str
    method: str
    path: str
    arrived_unix: float
    started: float = field(default_factory=time.perf_counter)  # perf_counter seconds
    bodies: bool = False
    route: str | None = None
    tenant: str | None = None
    status: int | None = None
    run: object = None  # serving.choices.Choices
    first_token_at: float | None = None
    error: bool = False
    request_body: bytearray = field(default_factory=bytearray)
    response_body: bytearray = field(default_factory=bytearray)
    response_is_json: bool = False
    choices: dict = field(default_factory=dict)  # index -> summary (bodies on)
    engine_ids: list = field(default_factory=list)  # the engine requests it submitted
    embedding: tuple | None = None  # (model, prompt tokens) of an embeddings request

    # --- filled by serving (Choices) ---

    def attach(self, run) -> None:
        """The request's generation (serving.choices.Choices) starts; while it is in flight the
        record is also found by its engine requests' ids (`live_records`)."""
        self.run = run
        self.engine_ids = [gen.request.request_id for gen in run.prepared.inputs if gen.request.request_id]
        if live_records.get(self.request_id) is self:
            for engine_id in self.engine_ids:
                live_records[engine_id] = self

    def embedded(self, model: str, prompt_tokens: int) -> None:
        """An embeddings request was admitted: its model and the tokens of its inputs."""
        self.embedding = (model, prompt_tokens)

    def retire(self) -> None:
        """The request ended: it leaves `live_records`."""
        for key in (self.request_id, *self.engine_ids):
            if live_records.get(key) is self:
                del live_records[key]

    def on_delta(self, index: int, delta) -> None:
        """One StreamDelta of choice `index` (serving.deltas): notes the first token's time, an
        error, and (bodies on) the choice's text, reasoning and tool calls."""
        kind = type(delta).__name__
        if self.first_token_at is None and getattr(delta, "token_ids", None):
            self.first_token_at = time.perf_counter()
        if kind == "Error":
            self.error = True
        if not self.bodies:
            return
        choice = self.choices.setdefault(index, {"index": index, "text": "", "reasoning": "", "tool_calls": []})
        if kind == "Content":
            choice["text"] += delta.text
        elif kind == "Reasoning":
            choice["reasoning"] += delta.text
        elif kind == "ToolCallStart":
            choice["tool_calls"].append({"id": delta.id, "name": delta.name, "arguments": ""})
        elif kind == "ToolCallArgs" and choice["tool_calls"]:
            choice["tool_calls"][-1]["arguments"] += delta.fragment
        elif kind == "Finish":
            choice["finish_reason"] = delta.reason
        elif kind == "Error":
            choice["error"] = delta.message

    # --- filled by observe.ObservedRequests ---

    def add_body(self, buffer: bytearray, chunk: bytes) -> None:
        """Keep up to BODY_LIMIT_BYTES of a body (bodies on)."""
        room = BODY_LIMIT_BYTES - len(buffer)
        if room > 0:
            buffer += chunk[:room]

    def finish_reason(self) -> str | None:
        run = self.run
        if run is None:
            return None
        reasons = sorted({f.reason for f in run.finishes.values()})
        if reasons:
            return ",".join(reasons)
        return "error" if self.error else "abort"

    def line(self, replica: str) -> dict:
        """The record's JSON object (module docstring), bodies included when they were kept."""
        run = self.run
        usage = run.usage if run is not None else None
        model = run.prepared.model if run is not None else (self.embedding[0] if self.embedding else None)
        prompt_tokens = usage.prompt_tokens if usage else (self.embedding[1] if self.embedding else None)
        out = {
            "request_id": self.request_id,
            "ts": datetime.fromtimestamp(self.arrived_unix, dt_timezone.utc).isoformat(timespec="milliseconds"),
            "route": self.route or self.path, "method": self.method, "tenant": self.tenant,
            "model": model, "status": self.status,
            "prompt_tokens": prompt_tokens,
            "completion_tokens": usage.completion_tokens if usage else None,
            "cached_tokens": usage.cached_prompt_tokens if usage else None,
            "ttft_ms": round((self.first_token_at - self.started) * 1000, 3) if self.first_token_at else None,
            "e2e_ms": round((time.perf_counter() - self.started) * 1000, 3),
            "finish_reason": self.finish_reason(), "replica": replica,
        }
        if self.bodies:
            out["request_body"] = _body(self.request_body, True)
            if run is not None:
                out["response_body"] = {"choices": [self.choices[i] for i in sorted(self.choices)],
                                        "usage": usage.to_openai()}
            else:
                out["response_body"] = _body(self.response_body, self.response_is_json)
        return out


def _body(buffer: bytearray, is_json: bool):
    if not buffer:
        return None
    text = bytes(buffer).decode("utf-8", "replace")
    if is_json and len(buffer) < BODY_LIMIT_BYTES:
        try:
            return json.loads(text)
        except ValueError:
            pass
    return text


def enabled() -> bool:
    """Whether requests are recorded at all (a file, or the database table)."""
    m = settings.METRALE
    return bool(m["REQUEST_LOG"] or m["REQUEST_LOG_DB"])


class RequestLogWriter:
    """The writer thread: lines to `path` (None: no file), rows to RequestLogEntry (when
    `to_db`), pruned after `db_ttl_s` seconds."""

    def __init__(self, path: str | None, to_db: bool, db_ttl_s: float, queue_size: int = QUEUE_SIZE):
        self.path = path
        self.to_db = to_db
        self.db_ttl_s = db_ttl_s
        self.queue: queue.Queue = queue.Queue(maxsize=queue_size)
        self._thread: threading.Thread | None = None
        self._last_prune = 0.0

    def submit(self, line: dict) -> bool:
        """Queue one record without waiting; False (and counted as dropped) when the queue is full."""
        try:
            self.queue.put_nowait(line)
        except queue.Full:
            REQUEST_LOG_DROPPED.inc()
            return False
        return True

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="metrale-request-log", daemon=True)
            self._thread.start()

    def _run(self) -> None:
        while True:
            batch = [self.queue.get()]
            deadline = time.monotonic() + BATCH_INTERVAL_S
            while len(batch) < BATCH_SIZE:
                try:
                    batch.append(self.queue.get(timeout=max(0.0, deadline - time.monotonic())))
                except queue.Empty:
                    break
            close_old_connections()  # this thread's own connection: dropped when it went bad or stale
            self.write(batch)

    def write(self, batch: list[dict]) -> None:
        """Write one batch: the lines to the file, the rows to the database, then prune old rows.
        A failing disk or database is logged and the batch is lost (the server goes on)."""
        if self.path:
            try:
                with open(self.path, "a", encoding="utf-8") as f:
                    f.writelines(json.dumps(line, ensure_ascii=False) + "\n" for line in batch)
            except OSError:
                log.exception("writing the request log to %s failed; %d records lost", self.path, len(batch))
        if self.to_db:
            try:
                RequestLogEntry.objects.bulk_create([_entry(line) for line in batch])
                self._prune()
            except DatabaseError:
                log.exception("writing %d request log rows failed", len(batch))

    def _prune(self) -> None:
        now = time.monotonic()
        if now - self._last_prune < PRUNE_INTERVAL_S:
            return
        self._last_prune = now
        RequestLogEntry.objects.filter(ts__lt=timezone.now() - timedelta(seconds=self.db_ttl_s)).delete()


def _entry(line: dict) -> RequestLogEntry:
    return RequestLogEntry(
        request_id=line["request_id"][:200], ts=datetime.fromisoformat(line["ts"]), replica=line["replica"][:200],
        route=(line["route"] or "")[:200], method=line["method"][:10], tenant=(line["tenant"] or "")[:100],
        model=(line["model"] or "")[:200], status=line["status"] or 0, prompt_tokens=line["prompt_tokens"],
        completion_tokens=line["completion_tokens"], cached_tokens=line["cached_tokens"],
        ttft_ms=line["ttft_ms"], e2e_ms=line["e2e_ms"], finish_reason=(line["finish_reason"] or "")[:40])


_writer: RequestLogWriter | None = None
_writer_lock = threading.Lock()


def writer() -> RequestLogWriter:
    """The process's writer (started on first use) for the current settings."""
    global _writer
    with _writer_lock:
        if _writer is None:
            m = settings.METRALE
            _writer = RequestLogWriter(m["REQUEST_LOG"], m["REQUEST_LOG_DB"], m["REQUEST_LOG_DB_TTL_S"])
            _writer.start()
        return _writer
