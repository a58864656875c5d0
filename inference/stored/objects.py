"""What every stored object a client creates shares: one owning tenant, and an expiry.

The rule (issue 14, "Tenancy"; OpenAI answers an id it will not show with 404): a stored response, conversation
or chat completion belongs to the tenant of the key that created it (with auth off, the
built-in "default" tenant); deleting the tenant deletes it; every read, list, update, delete
and use of it (as `previous_response_id`, as `conversation`) filters on that tenant, so another
tenant's id answers 404, never 403 (OpenAI does not reveal that an id exists elsewhere).
It expires METRALE["STORE_TTL_S"] seconds after it was written (responses_api.store.purge_expired
deletes it). Models get both by subclassing StoredObject; views get the tenant with tenant_of.
tests/api/test_tenancy.py discovers every stored-object route and proves the rule on each.
"""
from __future__ import annotations

from datetime import datetime, timedelta
from typing import TYPE_CHECKING

from django.conf import settings
from django.db import models
from django.utils import timezone

if TYPE_CHECKING:
    from ..models import Tenant


def tenant_of(request) -> Tenant:
    """The Tenant (inference.models.Tenant) that owns what `request` reads and writes.

    `request.principal` is set by inference.http.api.openai_endpoint for every /v1 request: the
    key's tenant, or the built-in "default" tenant when METRALE["REQUIRE_AUTH"] is off. Raises
    AttributeError for a request that did not go through openai_endpoint (a programming error:
    no stored object may be reached without an owner).
    """
    return request.principal.tenant


def expiry_from(now: datetime) -> datetime:
    """When something written at `now` expires: now + METRALE["STORE_TTL_S"] seconds."""
    return now + timedelta(seconds=settings.METRALE["STORE_TTL_S"])


class StoredObjectQuerySet(models.QuerySet):
    def owned_by(self, tenant: Tenant) -> StoredObjectQuerySet:
        """Only `tenant`'s objects: the filter every lookup of a stored object starts from."""
        return self.filter(tenant=tenant)

    def expired(self, now: datetime) -> StoredObjectQuerySet:
        """Objects whose expires_at is at or before `now`."""
        return self.filter(expires_at__lte=now)


class StoredObject(models.Model):
    """Abstract base of every stored object a client creates: its tenant (deleted with it), when
    it was created, and when it expires (indexed for the purge; set from created_at on the first
    save unless given)."""

    tenant = models.ForeignKey("inference.Tenant", on_delete=models.CASCADE,
                               help_text="The tenant whose key created it; only that tenant "
                                         "can reach it.")
    created_at = models.DateTimeField(default=timezone.now, db_index=True)
    expires_at = models.DateTimeField(db_index=True)

    objects = StoredObjectQuerySet.as_manager()

    class Meta:
        abstract = True

    def save(self, *args, **kwargs):
        if self.expires_at is None:
            self.expires_at = expiry_from(self.created_at)
        super().save(*args, **kwargs)


def cursor_page(rows: list[dict], limit: int) -> dict:
    """OpenAI's cursor-paginated list from up to limit + 1 objects with an `id`, in the list's
    order (the one past `limit` only tells has_more): {object: "list", data, first_id, last_id,
    has_more}."""
    data = rows[:limit]
    return {"object": "list", "data": data, "first_id": data[0]["id"] if data else None,
            "last_id": data[-1]["id"] if data else None, "has_more": len(rows) > limit}
