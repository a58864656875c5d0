"""METRALE_KV_EVENTS: the default chat model's KV cache events published over ZMQ as vLLM publishes them.

Configuration: vLLM's KVEventsConfig fields (vllm/config/kv_events.py; `--kv-events-config`) as a
JSON object, or a bare PUB endpoint as shorthand for {"endpoint": ...}: enable_kv_cache_events
(default true here: naming the setting asks for events), publisher ("zmq"; "null" turns them off),
endpoint (tcp://*:5557; it binds when it holds `*` or `::` or is ipc:// or inproc://, else connects;
tcp://*:0 picks a free port), replay_endpoint (a ROUTER that binds; none by default), buffer_steps
(batches kept for replay, 10000), hwm (the PUB socket's send high-water mark, 100000),
max_queue_size (batches waiting for the publisher's thread, 100000), topic ("").

Transport (contracts-wave4 sections 2.2-2.3): each batch is one multipart message [topic, seq as 8
bytes big-endian, payload (operations/kv_wire.py)]; seq starts at 0 with the process and grows by one
a batch, so a subscriber sees a restart as seq going back. A replay request on the ROUTER, [identity,
b"", start seq (8 bytes big-endian)], is answered with every kept batch from `start` on as [identity,
b"", topic, seq, payload], then [identity, b"", b"", -1 (8 bytes, signed), b""]: how a router that
joins late, or missed batches, catches up.

One thread owns both sockets (ZMQ sockets are not thread-safe): engines hand it their steps' events
through a bounded queue and never wait. If that queue is full, the batch is dropped and the next one
published is preceded by AllBlocksCleared, so subscribers forget this replica's blocks instead of
keeping a view that misses some.
"""
from __future__ import annotations

import json
import logging
import queue
import struct
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, fields

from inference.engine.kv_events import AllBlocksCleared, KVCacheEvent

from .kv_wire import encode_batch, wire_event

log = logging.getLogger("metrale.kv_events")

END_SEQ = struct.pack(">q", -1)
WILDCARD_HOSTS = ("*", "0.0.0.0", "::", "[::]")


@dataclass(frozen=True, slots=True)
class KVEventsConfig:
    """vLLM's KVEventsConfig fields (module doc), checked."""

    enable_kv_cache_events: bool = True
    publisher: str = "zmq"
    endpoint: str = "tcp://*:5557"
    replay_endpoint: str | None = None
    buffer_steps: int = 10_000
    hwm: int = 100_000
    max_queue_size: int = 100_000
    topic: str = ""

    def __post_init__(self):
        if not isinstance(self.enable_kv_cache_events, bool):
            raise ValueError(f"enable_kv_cache_events must be true or false, not {self.enable_kv_cache_events!r}")
        if not isinstance(self.topic, str):
            raise ValueError(f"topic must be a string, not {self.topic!r}")
        if self.publisher not in ("zmq", "null"):
            raise ValueError(f"publisher must be 'zmq' or 'null', not {self.publisher!r}")
        for name in ("buffer_steps", "hwm", "max_queue_size"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name} must be a positive integer, not {value!r}")
        for name in ("endpoint", "replay_endpoint"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, str) or "://" not in value):
                raise ValueError(f"{name} must be a ZMQ address such as tcp://*:5557, not {value!r}")

    @property
    def enabled(self) -> bool:
        return self.enable_kv_cache_events and self.publisher == "zmq"

    @classmethod
    def parse(cls, text: str | None) -> KVEventsConfig | None:
        """METRALE_KV_EVENTS's value: None when unset or empty; a JSON object of the fields; or a bare
        endpoint. Raises ValueError naming what is wrong."""
        if not text or not text.strip():
            return None
        text = text.strip()
        if not text.startswith("{"):
            return cls(endpoint=text)
        try:
            values = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ValueError(f"not JSON: {exc}") from None
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ValueError(f"unknown field(s) {', '.join(unknown)}; vLLM's are {', '.join(sorted(known))}")
        return cls(**values)


def binds(endpoint: str) -> bool:
    """Whether vLLM binds `endpoint` (a wildcard host, or ipc:// / inproc://) rather than connecting to it."""
    return "*" in endpoint or "::" in endpoint or endpoint.startswith(("ipc://", "inproc://"))


def reachable(endpoint: str, host: str) -> str:
    """`endpoint` as a subscriber elsewhere connects to it: a wildcard tcp host replaced by `host` (the
    host name this replica was reached at)."""
    if not endpoint.startswith("tcp://"):
        return endpoint
    where, _, port = endpoint[len("tcp://"):].rpartition(":")
    if where in WILDCARD_HOSTS:
        where = f"[{host}]" if ":" in host and not host.startswith("[") else host
    return f"tcp://{where}:{port}"


class KVEventPublisher:
    """The process's ZMQ publisher (module doc). One engine publishes at a time: `attach` hands out its
    sink and tells subscribers to forget what came before (AllBlocksCleared); a detached engine's events
    are dropped. Sockets bind at construction (zmq.ZMQError when an address is taken). clock: epoch
    seconds of each batch's timestamp."""

    def __init__(self, config: KVEventsConfig, *, clock: Callable[[], float] = time.time):
        import zmq

        self.config = config
        self.clock = clock
        self._zmq = zmq
        self._context = zmq.Context()
        self._pub = self._context.socket(zmq.PUB)
        self._pub.setsockopt(zmq.SNDHWM, config.hwm)
        self._pub.setsockopt(zmq.LINGER, 0)
        self._replay = None
        try:
            if binds(config.endpoint):
                self._pub.bind(config.endpoint)
            else:
                self._pub.connect(config.endpoint)
            self.endpoint = self._resolved(self._pub, config.endpoint)
            self.replay_endpoint = None
            if config.replay_endpoint:
                self._replay = self._context.socket(zmq.ROUTER)
                self._replay.setsockopt(zmq.LINGER, 0)
                self._replay.bind(config.replay_endpoint)
                self.replay_endpoint = self._resolved(self._replay, config.replay_endpoint)
        except zmq.ZMQError:
            self._context.destroy(linger=0)
            raise
        self._topic = config.topic.encode()
        self._queue: queue.Queue = queue.Queue(maxsize=config.max_queue_size)
        self._buffer: deque[tuple[bytes, bytes]] = deque(maxlen=config.buffer_steps)  # (seq frame, payload)
        self._seq = 0
        self._lock = threading.Lock()
        self._generation = 0  # the attached engine's; 0: none
        self._overflowed = threading.Event()
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name="metrale-kv-events", daemon=True)
        self._thread.start()
        log.info("KV cache events published on %s%s", self.endpoint,
                 f", replayed on {self.replay_endpoint}" if self.replay_endpoint else "")

    def _resolved(self, socket, endpoint: str) -> str:
        """The address a socket bound (tcp://*:0 resolved to its port), or `endpoint` as given."""
        if not binds(endpoint) or not endpoint.startswith("tcp://"):
            return endpoint
        port = socket.getsockopt_string(self._zmq.LAST_ENDPOINT).rpartition(":")[2]
        return f"{endpoint.rpartition(':')[0]}:{port}"

    # --- engines ---

    def attach(self, vocab_size: int) -> Callable[[list[KVCacheEvent]], None]:
        """Make a new engine the publishing one (its tokenizer's `vocab_size`: the namespace blocks' ids
        stay in it): subscribers are told AllBlocksCleared first. Returns its sink (LLMEngine's kv_events),
        which drops events once another engine attached or this one detached."""
        with self._lock:
            self._generation += 1
            generation = self._generation
        self._enqueue([AllBlocksCleared()], vocab_size)

        def sink(events: list[KVCacheEvent]) -> None:
            if self._generation == generation:
                self._enqueue(events, vocab_size)

        sink.generation = generation
        return sink

    def detach(self, sink) -> None:
        """The engine of `sink` stopped: if it was the publishing one, subscribers forget its blocks."""
        with self._lock:
            if self._generation != sink.generation:
                return
            self._generation += 1
        self._enqueue([AllBlocksCleared()], 1)

    def _enqueue(self, events: list[KVCacheEvent], vocab_size: int) -> None:
        try:
            self._queue.put_nowait((events, vocab_size))
        except queue.Full:
            self._overflowed.set()

    # --- the publisher's thread ---

    def _run(self) -> None:
        while not self._stopped.is_set():
            try:
                item = self._queue.get(timeout=0.05)
            except queue.Empty:
                item = None
            try:
                if item is not None:
                    if self._overflowed.is_set():
                        self._overflowed.clear()
                        log.warning("the KV event queue was full: batches were dropped; subscribers are told to "
                                    "forget this replica's blocks")
                        self._send([wire_event(AllBlocksCleared(), 1)])
                    events, vocab_size = item
                    self._send([wire_event(e, vocab_size) for e in events])
                self._serve_replays()
            except Exception:  # the thread serves on; a broken batch is logged
                log.exception("publishing KV cache events failed")

    def _send(self, events: list[dict]) -> None:
        payload = encode_batch(self.clock(), events)
        seq = struct.pack(">Q", self._seq)
        self._seq += 1
        self._buffer.append((seq, payload))
        try:
            self._pub.send_multipart([self._topic, seq, payload], flags=self._zmq.NOBLOCK)
        except self._zmq.Again:  # a subscriber past the high-water mark: it finds the gap by seq and replays
            pass

    def _serve_replays(self) -> None:
        if self._replay is None:
            return
        zmq = self._zmq
        while self._replay.poll(0):
            frames = self._replay.recv_multipart()
            if len(frames) != 3 or len(frames[2]) != 8:
                continue
            identity, start = frames[0], struct.unpack(">Q", frames[2])[0]
            for seq, payload in list(self._buffer):
                if struct.unpack(">Q", seq)[0] >= start:
                    self._replay.send_multipart([identity, b"", self._topic, seq, payload], flags=zmq.NOBLOCK)
            self._replay.send_multipart([identity, b"", b"", END_SEQ, b""], flags=zmq.NOBLOCK)

    # --- the process ---

    def sources(self, host: str) -> dict:
        """GET /kv_event_sources's body: vLLM's map of data-parallel rank -> source, with the endpoints a
        router reaches (a wildcard host replaced by `host`)."""
        source = {"endpoint": reachable(self.endpoint, host), "topic": self.config.topic, "hwm": self.config.hwm,
                  "buffer_steps": self.config.buffer_steps, "publisher": self.config.publisher,
                  "encoding": "msgpack", "schema_version": 1, "enable_kv_cache_events": True}
        if self.replay_endpoint:
            source["replay_endpoint"] = reachable(self.replay_endpoint, host)
        return {"0": source}

    def close(self, timeout_s: float = 2.0) -> None:
        """Publish what is queued (up to `timeout_s`), stop the thread, close the sockets."""
        deadline = time.monotonic() + timeout_s
        while not self._queue.empty() and time.monotonic() < deadline:
            time.sleep(0.01)
        self._stopped.set()
        self._thread.join(timeout_s)
        self._context.destroy(linger=0)


def publisher_from_settings(metrale: dict) -> KVEventPublisher | None:
    """The publisher METRALE["KV_EVENTS"] asks for, bound; None when events are off. Raises ValueError for
    a value KVEventsConfig refuses and zmq.ZMQError for an address that cannot be bound."""
    config = KVEventsConfig.parse(metrale.get("KV_EVENTS"))
    if config is None or not config.enabled:
        return None
    return KVEventPublisher(config)
