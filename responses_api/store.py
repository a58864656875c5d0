"""Read and write stored responses and conversations (synchronous ORM; views call it through
sync_to_async). Every lookup starts from the tenant's own objects (`owned_by(tenant)`, see
inference.stored.objects), so another tenant's id is a 404. `tenant` is an inference.models.Tenant.

Source: OpenAI API reference ("Retrieve/Delete a model response", "List input items",
"Conversations"); ../shared/reference/metrale-behaviour.md section 2.6 (error codes
response_not_found, conversation_not_found, item_not_found).
"""

from __future__ import annotations

import logging
from datetime import timedelta

from django.conf import settings
from django.db import IntegrityError, transaction
from django.db.models import Max, Q
from django.utils import timezone

from inference.operations import heartbeat
from inference.models import Tenant
from inference.serving.errors import bad_request, not_found
from inference.stored.completions import purge_expired as purge_expired_chat_completions
from inference.stored.objects import cursor_page

from .encoder import ResponsesEventEncoder, terminal_events
from .models import (
    UNFINISHED,
    Conversation,
    ConversationItem,
    ResponseEvent,
    ResponseItem,
    Status,
    StoredResponse,
    new_id,
)

log = logging.getLogger("metrale.responses")

# A response still unfinished this long after its deadline can have no process generating it.
ORPHAN_GRACE_S = 60.0

RESTART_MESSAGE = ("The server process generating this response stopped (it restarted or "
                   "died) before the response finished.")


# --- responses -------------------------------------------------------------------------------


def response_not_found(response_id: str, param: str | None = None):
    return not_found(f"Response with id '{response_id}' not found.", code="response_not_found",
                     param=param)


def get_response(tenant: Tenant, response_id: str, param: str | None = None) -> StoredResponse:
    """The tenant's stored response. Raises ApiError 404 response_not_found."""
    row = StoredResponse.objects.owned_by(tenant).filter(pk=response_id).first()
    if row is None:
        raise response_not_found(response_id, param)
    return row


def create_response(*, tenant: Tenant, response_id: str, model: str, body: dict, request: dict,
                    input_items: list[dict], previous_response_id: str | None,
                    conversation_id: str | None, background: bool, streamed: bool) -> None:
    """Store a response as it starts (status from `body`), with its input items."""
    now = timezone.now()
    with transaction.atomic():
        StoredResponse.objects.create(
            id=response_id, tenant=tenant, model=model, status=body["status"],
            background=background, streamed=streamed, previous_response_id=previous_response_id,
            conversation_id=conversation_id, request=request, body=body,
            metadata=body.get("metadata") or {}, worker=heartbeat.process_id(), created_at=now)
        ResponseItem.objects.bulk_create(
            ResponseItem(response_id=response_id, position=i, direction=ResponseItem.INPUT,
                         item_id=item["id"], type=item["type"], data=item)
            for i, item in enumerate(input_items))


def mark_in_progress(response_id: str) -> None:
    """A queued background response started generating (unless it was cancelled meanwhile)."""
    StoredResponse.objects.filter(pk=response_id, status=Status.QUEUED).update(
        status=Status.IN_PROGRESS, updated_at=timezone.now())


def append_events(response_id: str, events: list[dict]) -> None:
    """Keep streamed events (dicts with `type` and `sequence_number`) for replay."""
    ResponseEvent.objects.bulk_create(
        ResponseEvent(response_id=response_id, sequence_number=e["sequence_number"],
                      type=e["type"], data=e)
        for e in events)


def finish_response(response_id: str, body: dict, output_items: list[dict]) -> str:
    """Record a response's end: its final body, status, usage and output items.

    A response cancelled meanwhile (through the API, by another process) stays cancelled; one
    deleted meanwhile stays deleted; one another process has failed meanwhile (it took this one
    for gone, see fail_unfinished) keeps that outcome and the events that recorded it. Returns
    the status it now has (the body's when deleted).
    """
    usage = body.get("usage") or {}
    with transaction.atomic():
        row = StoredResponse.objects.select_for_update().filter(pk=response_id).first()
        if row is None:
            return body["status"]
        if row.status == Status.CANCELLED:
            body = {**body, "status": Status.CANCELLED}
        elif row.finished:
            return row.status
        row.status = body["status"]
        row.body = body
        row.error = body.get("error")
        row.input_tokens = usage.get("input_tokens")
        row.output_tokens = usage.get("output_tokens")
        row.completed_at = timezone.now()
        row.save(update_fields=["status", "body", "error", "input_tokens", "output_tokens",
                                "completed_at", "updated_at"])
        start = row.items.count()
        ResponseItem.objects.bulk_create(
            ResponseItem(response_id=response_id, position=start + i,
                         direction=ResponseItem.OUTPUT, item_id=item["id"], type=item["type"],
                         data=item)
            for i, item in enumerate(output_items))
    return row.status


def fail_response(response_id: str, message: str, now=None) -> bool:
    """Mark an unfinished response failed with a server_error (its run broke down, or the
    process running it is gone), in agreement with its recorded events: the item they left
    open is closed as incomplete, `error` and `response.failed` are recorded after them (with
    `response.created` first when none was recorded yet), and the stored output holds the items
    the events built. A response not created streamed or in the background records no events.
    Returns False when it had already finished (or is gone).
    """
    now = now or timezone.now()
    with transaction.atomic():
        row = StoredResponse.objects.select_for_update().filter(
            pk=response_id, status__in=UNFINISHED).first()
        if row is None:
            return False
        events = list(row.events.order_by("sequence_number").values_list("data", flat=True))
        encoder = ResponsesEventEncoder.resume(events)
        closing = encoder.close("incomplete")
        error = {"code": "server_error", "message": message}
        final = {**row.body, "status": Status.FAILED, "output": encoder.output, "error": error,
                 "usage": None, "completed_at": None}
        if row.streamed:
            opening = [] if events else [{"type": "response.created", "response": row.body}]
            start = events[-1]["sequence_number"] + 1 if events else 0
            append_events(response_id, [
                {"type": e["type"], "sequence_number": start + i,
                 **{k: v for k, v in e.items() if k != "type"}}
                for i, e in enumerate(opening + closing + terminal_events(final))])
        row.status, row.error, row.body, row.completed_at = Status.FAILED, error, final, now
        row.save(update_fields=["status", "error", "body", "completed_at", "updated_at"])
        start = row.items.count()
        ResponseItem.objects.bulk_create(
            ResponseItem(response_id=response_id, position=start + i,
                         direction=ResponseItem.OUTPUT, item_id=item["id"], type=item["type"],
                         data=item)
            for i, item in enumerate(encoder.output))
    return True


def delete_response(tenant: Tenant, response_id: str) -> dict:
    """Delete a stored response (its items and events go with it)."""
    deleted, _ = StoredResponse.objects.owned_by(tenant).filter(pk=response_id).delete()
    if not deleted:
        raise response_not_found(response_id)
    return {"id": response_id, "object": "response", "deleted": True}


def cancel_response(tenant: Tenant, response_id: str) -> StoredResponse:
    """Mark a background response cancelled (idempotent for one already cancelled).

    Raises ApiError 404 for an unknown id and 400 for a response that was not created with
    background: true or that has already finished (OpenAI: "Only responses created with the
    background parameter set to true can be cancelled").
    """
    with transaction.atomic():
        row = StoredResponse.objects.select_for_update().owned_by(tenant).filter(
            pk=response_id).first()
        if row is None:
            raise response_not_found(response_id)
        if not row.background:
            raise bad_request("Only responses created with 'background': true can be cancelled.",
                              code="response_not_cancellable")
        if row.status == Status.CANCELLED:
            return row
        if row.finished:
            raise bad_request(f"This response has already finished (status {row.status}); "
                              "it cannot be cancelled.", code="response_not_cancellable")
        row.status = Status.CANCELLED
        row.completed_at = timezone.now()
        row.save(update_fields=["status", "completed_at", "updated_at"])
    return row


def chain_items(tenant: Tenant, previous_response_id: str) -> list[dict]:
    """The context a response continuing `previous_response_id` starts from: the input and
    output items of every response in the chain, oldest first (instructions are not items, so
    earlier instructions are not carried over, as OpenAI specifies).

    Raises ApiError 404 response_not_found for an id that is unknown, another tenant's or was
    stored with store: false, and 400 for one still generating. A chain whose older link has
    expired or been deleted starts from the oldest response still stored.
    """
    head = get_response(tenant, previous_response_id, param="previous_response_id")
    if not head.finished:
        raise bad_request(f"Response '{previous_response_id}' is still {head.status}; continue "
                          "from it once it has finished.", "previous_response_id",
                          code="previous_response_not_finished")
    chain = [head.pk]
    link = head.previous_response_id
    while link is not None and link not in chain:
        found = list(StoredResponse.objects.owned_by(tenant).filter(pk=link)
                     .values_list("previous_response_id", flat=True)[:1])
        if not found:
            break
        chain.append(link)
        link = found[0]
    order = {rid: i for i, rid in enumerate(reversed(chain))}
    rows = ResponseItem.objects.filter(response_id__in=chain).values_list(
        "response_id", "position", "data")
    return [data for _, _, data in sorted(rows, key=lambda r: (order[r[0]], r[1]))]


def list_input_items(tenant: Tenant, response_id: str, limit: int, order: str,
                     after: str | None) -> dict:
    """A page of a stored response's input items (OpenAI's ResponseItemList)."""
    row = get_response(tenant, response_id)
    return _page(row.items.filter(direction=ResponseItem.INPUT), limit, order, after)


def events_after(response_id: str, starting_after: int) -> list[dict]:
    """Stored events with sequence_number > starting_after, in order."""
    return list(ResponseEvent.objects.filter(response_id=response_id,
                                             sequence_number__gt=starting_after)
                .order_by("sequence_number").values_list("data", flat=True))


def response_state(response_id: str) -> tuple[str, int]:
    """(status, number of stored events) of a response, for a replay that tails another process."""
    status = StoredResponse.objects.filter(pk=response_id).values_list("status", flat=True).first()
    return status or Status.FAILED, ResponseEvent.objects.filter(response_id=response_id).count()


# --- conversations ---------------------------------------------------------------------------


def conversation_not_found(conversation_id: str, param: str | None = None):
    return not_found(f"Conversation with id '{conversation_id}' not found.",
                     code="conversation_not_found", param=param)


def get_conversation(tenant: Tenant, conversation_id: str,
                     param: str | None = None) -> Conversation:
    """The tenant's conversation. Raises ApiError 404 conversation_not_found."""
    row = Conversation.objects.owned_by(tenant).filter(pk=conversation_id).first()
    if row is None:
        raise conversation_not_found(conversation_id, param)
    return row


def create_conversation(tenant: Tenant, items: list[dict], metadata: dict) -> Conversation:
    """A new conversation holding `items` (normalized, at most 20)."""
    with transaction.atomic():
        conv = Conversation.objects.create(id=new_id("conv"), tenant=tenant,
                                           metadata=metadata)
        _append_items(conv, items)
    return conv


def update_conversation(tenant: Tenant, conversation_id: str, metadata: dict) -> Conversation:
    """Replace a conversation's metadata (OpenAI: "Update a conversation")."""
    conv = get_conversation(tenant, conversation_id)
    conv.metadata = metadata
    conv.save()
    return conv


def delete_conversation(tenant: Tenant, conversation_id: str) -> dict:
    """Delete a conversation and its items; responses that used it keep their own items."""
    deleted, _ = Conversation.objects.owned_by(tenant).filter(pk=conversation_id).delete()
    if not deleted:
        raise conversation_not_found(conversation_id)
    return {"id": conversation_id, "object": "conversation.deleted", "deleted": True}


def add_conversation_items(tenant: Tenant, conversation_id: str, items: list[dict],
                           param: str | None = None) -> list[dict]:
    """Append items to the tenant's conversation, in order; returns them.

    Raises ApiError 404 conversation_not_found, and 400 when an item's id is already in it.
    """
    with transaction.atomic():
        conv = Conversation.objects.select_for_update().owned_by(tenant).filter(
            pk=conversation_id).first()
        if conv is None:
            raise conversation_not_found(conversation_id, param)
        _append_items(conv, items)
        conv.save()
    return items


def _append_items(conv: Conversation, items: list[dict]) -> None:
    ids = [item["id"] for item in items]
    duplicate = (len(set(ids)) != len(ids)
                 or conv.items.filter(item_id__in=ids).exists())
    if duplicate:
        raise bad_request("An item with this id is already in the conversation.", "items",
                          code="duplicate_item_id")
    last = conv.items.aggregate(m=Max("position"))["m"]
    start = 0 if last is None else last + 1
    try:
        ConversationItem.objects.bulk_create(
            ConversationItem(conversation=conv, position=start + i, item_id=item["id"],
                             type=item["type"], data=item)
            for i, item in enumerate(items))
    except IntegrityError as exc:
        raise bad_request(f"These items could not be added: {exc}", "items") from exc


def conversation_items(tenant: Tenant, conversation_id: str) -> list[dict]:
    """All of a conversation's items in order (the context a response with it starts from)."""
    conv = get_conversation(tenant, conversation_id, param="conversation")
    return list(conv.items.order_by("position").values_list("data", flat=True))


def list_conversation_items(tenant: Tenant, conversation_id: str, limit: int, order: str,
                            after: str | None) -> dict:
    """A page of a conversation's items (OpenAI's ConversationItemList)."""
    conv = get_conversation(tenant, conversation_id)
    return _page(conv.items.all(), limit, order, after)


def _item(tenant: Tenant, conversation_id: str, item_id: str) -> ConversationItem:
    conv = get_conversation(tenant, conversation_id)
    item = conv.items.filter(item_id=item_id).first()
    if item is None:
        raise not_found(f"Item with id '{item_id}' not found in this conversation.",
                        code="item_not_found")
    return item


def get_conversation_item(tenant: Tenant, conversation_id: str, item_id: str) -> dict:
    """One conversation item. Raises ApiError 404 conversation_not_found or item_not_found."""
    return _item(tenant, conversation_id, item_id).data


def delete_conversation_item(tenant: Tenant, conversation_id: str, item_id: str) -> dict:
    """Delete one item; returns the Conversation (as OpenAI does)."""
    item = _item(tenant, conversation_id, item_id)
    conv = item.conversation
    item.delete()
    conv.save()
    return conv.to_dict()


def _page(qs, limit: int, order: str, after: str | None) -> dict:
    """One page of items ordered by position: {object: list, data, first_id, last_id, has_more}.

    `after` is the id of the item the page starts after (in the list's order); an id not in the
    list is a 400 naming `after`.
    """
    if after is not None:
        anchor = qs.filter(item_id=after).values_list("position", flat=True).first()
        if anchor is None:
            raise bad_request(f"No item with id '{after}' in this list.", "after")
        qs = qs.filter(position__gt=anchor) if order == "asc" else qs.filter(position__lt=anchor)
    rows = list(qs.order_by("position" if order == "asc" else "-position")
                .values_list("data", flat=True)[:limit + 1])
    return cursor_page(rows, limit)


# --- housekeeping ----------------------------------------------------------------------------


def fail_unfinished(now=None) -> int:
    """Mark failed (fail_response) every unfinished response that no process can still be
    generating: those whose process is gone (inference.operations.heartbeat.live_process_ids: it stopped,
    stopped beating, or died on this machine), and any whose request deadline
    (METRALE["REQUEST_TIMEOUT_S"]) passed more than ORPHAN_GRACE_S ago. Returns how many.

    Runs when the server starts, after every heartbeat and with every purge, in every process:
    the responses of a live replica are left alone, a dead one's are failed by the survivors.
    """
    now = now or timezone.now()
    too_old = now - timedelta(seconds=settings.METRALE["REQUEST_TIMEOUT_S"] + ORPHAN_GRACE_S)
    orphans = (StoredResponse.objects.filter(status__in=UNFINISHED)
               .filter(~Q(worker__in=heartbeat.live_process_ids()) | Q(created_at__lt=too_old))
               .values_list("pk", flat=True))
    count = 0
    for response_id in list(orphans):
        try:
            count += fail_response(response_id, RESTART_MESSAGE, now=now)
        except IntegrityError:  # another process failed it at the same moment
            pass
    if count:
        log.warning("marked %d unfinished response(s) failed: their process is gone", count)
    return count


def purge_expired(now=None) -> dict:
    """Delete every stored object past its expires_at: responses (with their items and events;
    not while unfinished), conversations (with their items) and stored chat completions.
    Returns {"responses": n, "conversations": m, "chat_completions": k}."""
    now = now or timezone.now()
    responses = StoredResponse.objects.expired(now).exclude(status__in=UNFINISHED)
    n_responses = responses.count()
    responses.delete()
    conversations = Conversation.objects.expired(now)
    n_conversations = conversations.count()
    conversations.delete()
    return {"responses": n_responses, "conversations": n_conversations,
            "chat_completions": purge_expired_chat_completions(now)}
