"""Requests through the HTTP stack as metrale_site/asgi.py serves it (ObservedRequests outermost), and
/metrics read back as samples."""
from __future__ import annotations

import json

from prometheus_client.parser import text_string_to_metric_families

from inference.http.middleware import ApiAsgiGuard
from inference.http.observe import ObservedRequests

from .asgi_client import AsgiRequest, serve, site_handler
from .fake_engine import Answer


def app():
    """A fresh HTTP application: ObservedRequests(ApiAsgiGuard(the site's Django handler, asgi_client.site_handler))."""
    return ObservedRequests(ApiAsgiGuard(site_handler()))


def request(method: str, path: str, body=None, headers: dict | None = None) -> AsgiRequest:
    """An AsgiRequest through app() (not started)."""
    data = json.dumps(body).encode() if body is not None else b""
    hdrs = {"content-type": "application/json", "content-length": str(len(data)), **(headers or {})}
    return AsgiRequest(method, path, hdrs, data, app=app())


def call(method: str, path: str, body=None, headers: dict | None = None) -> Answer:
    """One request through app(), read to the end."""
    async def run():
        req = await request(method, path, body, headers).start()
        return Answer(req.status, req.headers, await req.read_all())
    return serve(run)


def samples(text: str) -> dict[tuple, float]:
    """(sample name, sorted label pairs) -> value, of a Prometheus text exposition."""
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def value(table: dict, name: str, **labels) -> float:
    """One sample's value (0 when absent)."""
    return table.get((name, tuple(sorted(labels.items()))), 0.0)


def scrape(headers: dict | None = None) -> dict:
    """GET /metrics -> samples (asserting a 200)."""
    answer = call("GET", "/metrics", headers=headers)
    assert answer.status == 200, answer.body
    assert answer.headers["content-type"].startswith("text/plain")
    return samples(answer.body.decode())
