"""The Django test client calling as one tenant: every request carries that tenant's real API key."""
from __future__ import annotations

import json
from dataclasses import dataclass

from inference.models import Tenant


@dataclass
class TenantClient:
    """`client` (django.test.Client) with `Authorization: Bearer <key>` of `tenant` on every request."""

    client: object
    tenant: Tenant
    key: str

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.key}"}

    def post(self, path: str, body=None):
        """POST a JSON body (a dict or list), or raw bytes as they are."""
        data = body if isinstance(body, bytes) else json.dumps(body if body is not None else {})
        return self.client.post(path, data, content_type="application/json", headers=self.headers)

    def get(self, path: str, **query):
        return self.client.get(path, query, headers=self.headers)

    def delete(self, path: str):
        return self.client.delete(path, headers=self.headers)

    def send(self, method: str, path: str, body=None, query: dict | None = None):
        """Any of GET (with `query`), POST (with `body`), DELETE, PUT."""
        if method == "GET":
            return self.get(path, **(query or {}))
        if method == "DELETE":
            return self.delete(path)
        if method == "POST":
            return self.post(path, body)
        return self.client.generic(method, path, headers=self.headers)
