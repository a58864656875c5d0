"""DashboardConsumer: the live engine dashboard's websocket (`/ws/admin/dashboard/`, staff only).

Message schema: ARCHITECTURE.md, "The live dashboard's websocket". The consumer watches one
replica at a time (its own process first): it joins that replica's snapshot group and tells
the replica's agent (inference/operations/replica.py) it is watched every WATCH_RENEW_S, forwards the
snapshots at most MAX_SNAPSHOTS_PER_S per second, and sends an operator's `cancel` to the
watched replica's agent through the channel layer, which answers with `cancel_result`.
"""
from __future__ import annotations

import asyncio
import json
import logging
import time

from channels.generic.websocket import AsyncJsonWebsocketConsumer

from . import replica

log = logging.getLogger("metrale")

MAX_SNAPSHOTS_PER_S = 2.5
WATCH_RENEW_S = replica.WATCH_TTL_S / 3
# Close code for a caller that is not a staff user (4000-4999: the application's own).
CLOSE_NOT_STAFF = 4403
MAX_ID_CHARS = 200


class DashboardConsumer(AsyncJsonWebsocketConsumer):
    """One operator's dashboard connection (see the module docstring)."""

    watching: str | None = None
    _renew: asyncio.Task | None = None
    _last_sent = 0.0

    async def connect(self):
        user = self.scope.get("user")
        if user is None or not (user.is_active and user.is_staff):
            await self.close(code=CLOSE_NOT_STAFF)
            return
        self.operator = user.get_username()
        await self.accept()
        await self._watch(replica.replica_id())
        self._renew = asyncio.create_task(self._keep_watching())

    async def disconnect(self, code):
        if self._renew is not None:
            self._renew.cancel()
        if self.watching is not None:
            await self.channel_layer.group_discard(replica.snapshot_group(self.watching), self.channel_name)

    async def _watch(self, target: str) -> None:
        if self.watching is not None:
            await self.channel_layer.group_discard(replica.snapshot_group(self.watching), self.channel_name)
        self.watching = target
        self._last_sent = 0.0
        await self.channel_layer.group_add(replica.snapshot_group(target), self.channel_name)
        await self.channel_layer.group_send(replica.commands_group(target),
                                            {"type": "replica.watch", "reply_to": self.channel_name})

    async def _keep_watching(self) -> None:
        while True:
            await asyncio.sleep(WATCH_RENEW_S)
            await self.channel_layer.group_send(replica.commands_group(self.watching), {"type": "replica.watch"})

    async def receive(self, text_data=None, bytes_data=None, **kwargs):
        try:
            content = json.loads(text_data or "")
        except ValueError:
            return await self._error("Messages are JSON objects with a \"type\".")
        if not isinstance(content, dict):
            return await self._error("Messages are JSON objects with a \"type\".")
        await self.receive_json(content)

    async def receive_json(self, content, **kwargs):
        kind = content.get("type")
        if kind == "cancel":
            request_id = content.get("request_id")
            if not isinstance(request_id, str) or not 0 < len(request_id) <= MAX_ID_CHARS:
                return await self._error(f"cancel needs a request_id (a string of 1 to {MAX_ID_CHARS} characters).")
            await self.channel_layer.group_send(replica.commands_group(self.watching), {
                "type": "replica.cancel", "request_id": request_id, "reply_to": self.channel_name,
                "operator": f"user:{self.operator}"})
        elif kind == "select":
            target = content.get("replica")
            if not isinstance(target, str) or target not in await replica.replicas():
                return await self._error(f"select needs one of the live replicas: {await replica.replicas()}.")
            await self._watch(target)
        else:
            await self._error(f"Unknown message type {str(kind)[:40]!r}; use \"cancel\" or \"select\".")

    async def _error(self, message: str) -> None:
        await self.send_json({"type": "error", "message": message})

    # --- from the channel layer ---

    async def dashboard_snapshot(self, event):
        snap = event["snapshot"]
        now = time.monotonic()
        if snap.get("replica") != self.watching or now - self._last_sent < 1 / MAX_SNAPSHOTS_PER_S:
            return
        self._last_sent = now
        await self.send_json(snap)

    async def dashboard_cancel_result(self, event):
        await self.send_json({"type": "cancel_result", "request_id": event["request_id"],
                              "replica": event["replica"], "cancelled": event["cancelled"]})
