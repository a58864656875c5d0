"""This process as one replica of the server: its id, its channel-layer groups, and its agent.

The agent (one asyncio task per serving process, started on the server's event loop by
metrale_site/asgi.py) joins the group `commands_group(replica_id())` and answers what
operators send there from any replica's dashboard: `replica.cancel` (end a request by id,
AsyncEngine.cancel; the result goes back to the asking websocket) and `replica.watch` (someone
watches this replica). While watched (WATCH_TTL_S since the last `replica.watch`) it publishes
its snapshot to `snapshot_group(replica_id())` every PUBLISH_INTERVAL_S. The message schema is
in ARCHITECTURE.md ("The live dashboard's websocket").
"""
from __future__ import annotations

import asyncio
import logging
import re
import time

from asgiref.sync import sync_to_async
from channels.layers import get_channel_layer

from . import heartbeat, runtime
from .model_specs import CHAT
from .registry import process_registry
from .request_log import live_records

log = logging.getLogger("metrale")

PUBLISH_INTERVAL_S = 0.5
WATCH_TTL_S = 6.0
REPLICAS_CACHE_S = 5.0
SNAPSHOT_TIMEOUT_S = 5.0
RETRY_S = 10.0


def replica_id() -> str:
    """This process's replica id (heartbeat.process_id: host:pid:random)."""
    return heartbeat.process_id()


def _group(kind: str, replica: str) -> str:
    # Channel-layer group names: ASCII letters, digits, hyphens, underscores and periods, < 100.
    return f"metrale.{kind}.{re.sub(r'[^A-Za-z0-9_.-]', '_', replica)}"[:99]


def commands_group(replica: str) -> str:
    """The group whose only member is `replica`'s agent (cancels, watchers' presence)."""
    return _group("replica", replica)


def snapshot_group(replica: str) -> str:
    """The group of the websockets that watch `replica` (its agent publishes there)."""
    return _group("dashboard", replica)


_replicas: tuple[float, list[str]] = (0.0, [])


async def replicas() -> list[str]:
    """The live replicas' ids, this one first (heartbeat.live_process_ids, read at most every
    REPLICAS_CACHE_S seconds)."""
    global _replicas
    own = replica_id()
    read_at, known = _replicas
    if time.monotonic() - read_at > REPLICAS_CACHE_S:
        try:
            known = sorted(await sync_to_async(heartbeat.live_process_ids)())
        except Exception:  # the database is away: this replica alone
            log.warning("could not list the live replicas", exc_info=True)
            known = []
        _replicas = (time.monotonic(), known)
    return [own, *(r for r in known if r != own)]


def _with_requests(views: list[dict]) -> list[dict]:
    """Each engine request's HTTP request (its id, tenant and route) from the requests in flight."""
    for view in views:
        record = live_records.get(view["request_id"])
        view["http_request_id"] = record.request_id if record is not None else None
        view["tenant"] = record.tenant if record is not None else None
        view["route"] = record.route if record is not None else None
    return views


async def engine_view(rt) -> dict | None:
    """One chat engine's part of a snapshot (model, engine, kv, running, waiting, series), None when it
    gives none in SNAPSHOT_TIMEOUT_S or its loop died."""
    take = getattr(rt.engine, "snapshot", None)
    if take is None:
        return None
    try:
        engine = await asyncio.wait_for(asyncio.wrap_future(take()), SNAPSHOT_TIMEOUT_S)
    except (asyncio.TimeoutError, RuntimeError):
        return None
    return {"id": rt.model_id, "max_model_len": engine["max_model_len"], "engine": engine["engine"],
            "kv": engine["kv"], "running": _with_requests(engine["running"]),
            "waiting": _with_requests(engine["waiting"]), "series": engine["series"]}


async def snapshot(replica: str | None = None) -> dict:
    """This replica's dashboard snapshot (type "snapshot"; schema in ARCHITECTURE.md), named
    `replica` (default replica_id()): the default chat model's engine at the top level (as before the
    registry), every configured model's state in `models`, and each resident chat engine in `engines`.
    Raises nothing: a model still loading, or an engine that does not answer, gives empty lists."""
    registry = process_registry()
    state, error = runtime.status()
    default = registry.default()
    out = {"type": "snapshot", "replica": replica or replica_id(), "replicas": await replicas(), "time": time.time(),
           "model": {"id": runtime.served_model_name(), "state": state, "error": error,
                     "path": default.spec.source if default is not None else None, "max_model_len": None},
           "engine": {}, "kv": {}, "running": [], "waiting": [], "series": {},
           "models": registry.states(), "engines": []}
    for entry, rt in registry.loaded_models(CHAT):
        view = await engine_view(rt)
        if view is None:
            if entry is default:
                out["model"]["error"] = "the engine gave no snapshot"
            continue
        out["engines"].append(view)
        if entry is default:
            out["model"]["max_model_len"] = view["max_model_len"]
            out.update({k: view[k] for k in ("engine", "kv", "running", "waiting", "series")})
    return out


async def cancel(request_id: str) -> int:
    """End the request(s) named `request_id` in this process's engines: an engine request id, or
    the x-request-id of an API request in flight here (all its engine requests, whatever their ids,
    e.g. a Response's `resp_...-0`). How many engine requests ended."""
    record = live_records.get(request_id)
    names = record.engine_ids if record is not None and record.request_id == request_id and record.engine_ids \
        else [request_id]
    ended = 0
    for _, rt in process_registry().loaded_models(CHAT):
        if not hasattr(rt.engine, "cancel"):
            continue
        for name in names:
            ended += await asyncio.wrap_future(rt.engine.cancel(name))
    return ended


class ReplicaAgent:
    """This replica's member of the channel layer (see the module docstring)."""

    def __init__(self, layer=None):
        self.layer = layer or get_channel_layer()
        self.replica = replica_id()
        self.watched_until = 0.0

    async def run_forever(self) -> None:
        """`run`, started again RETRY_S after a failure (the channel layer's Redis away), until cancelled."""
        while True:
            try:
                await self.run()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("the replica agent stopped; starting it again in %.0f s", RETRY_S)
                await asyncio.sleep(RETRY_S)

    async def run(self) -> None:
        """Serve commands and publish snapshots until cancelled (raises what the layer raises)."""
        channel = await self.layer.new_channel("metrale.agent.")
        group = commands_group(self.replica)
        await self.layer.group_add(group, channel)
        publisher = asyncio.create_task(self._publish())
        try:
            while True:
                message = await self.layer.receive(channel)
                try:
                    await self.handle(message)
                except Exception:  # one bad command must not end the agent
                    log.exception("the replica agent could not handle %r", message.get("type"))
        finally:
            publisher.cancel()
            await self.layer.group_discard(group, channel)

    async def handle(self, message: dict) -> None:
        """One command: replica.cancel {request_id, reply_to} or replica.watch."""
        kind = message.get("type")
        if kind == "replica.watch":
            self.watched_until = time.monotonic() + WATCH_TTL_S
            if message.get("reply_to"):  # a new watcher gets a snapshot at once
                await self.layer.send(message["reply_to"], {"type": "dashboard.snapshot",
                                                             "snapshot": await snapshot(self.replica)})
        elif kind == "replica.cancel":
            request_id = str(message.get("request_id", ""))
            count = await cancel(request_id)
            log.info("operator %s cancelled %s: %d engine request(s) ended", message.get("operator", "?"),
                     request_id, count)
            if message.get("reply_to"):
                await self.layer.send(message["reply_to"], {
                    "type": "dashboard.cancel_result", "request_id": request_id, "replica": self.replica,
                    "cancelled": count})

    async def _publish(self) -> None:
        while True:
            await asyncio.sleep(PUBLISH_INTERVAL_S)
            if time.monotonic() < self.watched_until:
                try:
                    await self.layer.group_send(snapshot_group(self.replica),
                                                {"type": "dashboard.snapshot", "snapshot": await snapshot(self.replica)})
                except Exception:
                    log.exception("publishing the dashboard snapshot failed")


_agent_task: asyncio.Task | None = None


def ensure_started() -> None:
    """Start this process's agent on the running event loop, once (again if its loop is gone)."""
    global _agent_task
    loop = asyncio.get_running_loop()
    if _agent_task is not None and not _agent_task.done() and _agent_task.get_loop() is loop:
        return
    if get_channel_layer() is None:
        return
    _agent_task = loop.create_task(ReplicaAgent().run_forever(), name="metrale-replica-agent")


def started(app):
    """ASGI wrapper: the first request (any kind) on the server's loop starts the agent."""

    async def with_agent(scope, receive, send):
        if scope["type"] in ("http", "websocket"):
            ensure_started()
        return await app(scope, receive, send)

    return with_agent
