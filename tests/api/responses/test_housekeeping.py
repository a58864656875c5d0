"""Expiry (purge task and command), the restart rule for unfinished responses, and the admin."""

import os
from datetime import timedelta
from io import StringIO

import pytest
from django.contrib.admin.utils import quote
from django.core.management import call_command
from django.utils import timezone

from inference.operations import heartbeat
from inference.operations.heartbeat import ServerProcess
from inference.models import StoredChatCompletion, Tenant
from responses_api import store, tasks
from responses_api.models import (
    Conversation,
    ConversationItem,
    ResponseEvent,
    ResponseItem,
    StoredResponse,
    expiry_from,
)

pytestmark = pytest.mark.django_db


def tenant(name: str = "default") -> Tenant:
    return Tenant.objects.get_or_create(name=name)[0]


def make_response(rid, *, status="completed", owner="default", worker=None,
                  created_at=None, metadata=None, background=False):
    body = {"id": rid, "object": "response", "status": "in_progress", "output": [],
            "metadata": metadata or {}}
    store.create_response(tenant=tenant(owner), response_id=rid, model="smollm2", body=body,
                          request={}, input_items=[{"id": f"msg_in_{rid}", "type": "message",
                                                    "role": "user", "status": "completed",
                                                    "content": [{"type": "input_text",
                                                                 "text": f"question {rid}"}]}],
                          previous_response_id=None, conversation_id=None, background=background,
                          streamed=True)
    store.append_events(rid, [{"type": "response.created", "sequence_number": 0}])
    if status != "in_progress":
        store.finish_response(rid, {**body, "status": status, "usage": {"input_tokens": 3,
                                                                         "output_tokens": 2}},
                              [{"id": f"msg_out_{rid}", "type": "message", "role": "assistant",
                                "status": "completed",
                                "content": [{"type": "output_text", "text": f"answer {rid}"}]}])
    updates = {"worker": worker or heartbeat.process_id()}
    if created_at is not None:
        updates.update(created_at=created_at, expires_at=expiry_from(created_at))
    StoredResponse.objects.filter(pk=rid).update(**updates)


def make_chat_completion(cid, *, created_at=None) -> StoredChatCompletion:
    return StoredChatCompletion.objects.create(
        id=cid, tenant=tenant(), model="smollm2", created_at=created_at or timezone.now(),
        messages=[{"role": "user", "content": "hi"}], response={"id": cid, "object": "chat.completion"})


def test_expired_responses_and_conversations_are_purged_with_their_items(settings):
    old = timezone.now() - timedelta(seconds=settings.METRALE["STORE_TTL_S"] + 10)
    make_response("resp_old", created_at=old)
    make_response("resp_new")
    stale = store.create_conversation(tenant(), [{"id": "msg_c", "type": "message",
                                                  "role": "user", "content": []}], {})
    Conversation.objects.filter(pk=stale.pk).update(expires_at=timezone.now() - timedelta(1))
    store.create_conversation(tenant(), [], {})
    make_chat_completion("chatcmpl-old", created_at=old)
    make_chat_completion("chatcmpl-new")

    assert tasks.purge_expired() == {"responses": 1, "conversations": 1, "chat_completions": 1,
                                     "failed_unfinished": 0}
    assert list(StoredResponse.objects.values_list("pk", flat=True)) == ["resp_new"]
    assert not ResponseItem.objects.filter(response_id="resp_old").exists()
    assert not ResponseEvent.objects.filter(response_id="resp_old").exists()
    assert Conversation.objects.count() == 1 and not ConversationItem.objects.exists()
    assert list(StoredChatCompletion.objects.values_list("pk", flat=True)) == ["chatcmpl-new"]


def test_the_purge_command_reports_what_it_deleted(settings):
    make_response("resp_old", created_at=timezone.now() - timedelta(days=31))
    make_chat_completion("chatcmpl-old", created_at=timezone.now() - timedelta(days=31))
    out = StringIO()
    call_command("purge_expired", stdout=out)
    assert out.getvalue().strip() == \
        "deleted 1 response(s), 0 conversation(s) and 1 chat completion(s)"
    assert not StoredResponse.objects.exists() and not StoredChatCompletion.objects.exists()


def test_the_ttl_comes_from_settings(settings):
    settings.METRALE = {**settings.METRALE, "STORE_TTL_S": 60}
    make_response("resp_a")
    row = StoredResponse.objects.get()
    assert (row.expires_at - row.created_at).total_seconds() == pytest.approx(60)
    chat = make_chat_completion("chatcmpl-a")
    assert (chat.expires_at - chat.created_at).total_seconds() == pytest.approx(60)


def dead_pid() -> int:
    """The pid of a process that has exited (and been reaped)."""
    import subprocess
    import sys

    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def make_process(pk, *, host="otherhost", pid=7, namespace="elsewhere", beat_age_s=0.0,
                 stopped=False):
    now = timezone.now()
    ServerProcess.objects.create(
        id=pk, host=host, pid=pid, pid_namespace=namespace,
        started_at=now - timedelta(hours=1), last_beat_at=now - timedelta(seconds=beat_age_s),
        stopped_at=now if stopped else None)
    return pk


def test_a_restart_fails_what_an_earlier_process_left_unfinished(settings):
    here = heartbeat.pid_namespace()
    assert here, "these tests run on Linux"
    # An earlier server on this machine, killed: its beat is fresh but its pid runs no more.
    dead = make_process("thishost:1:dead", pid=dead_pid(), namespace=here)
    # The same after a container restart: the new server has the old one's pid.
    reborn = make_process("thishost:pid:old", pid=os.getpid(), namespace=here)
    make_response("resp_dead", status="in_progress", worker=dead, background=True)
    make_response("resp_reborn", status="in_progress", worker=reborn, background=True)
    make_response("resp_mine", status="in_progress", background=True)
    make_response("resp_elsewhere", status="in_progress", background=True,
                  worker=make_process("otherhost:7:live"))
    make_response("resp_lost", status="in_progress", worker=make_process("otherhost:8:live"),
                  created_at=timezone.now() - timedelta(
                      seconds=settings.METRALE["REQUEST_TIMEOUT_S"] + 120))
    make_response("resp_done", worker=dead)

    assert store.fail_unfinished() == 3
    status = dict(StoredResponse.objects.values_list("pk", "status"))
    assert status == {"resp_dead": "failed", "resp_reborn": "failed", "resp_mine": "in_progress",
                      "resp_elsewhere": "in_progress", "resp_lost": "failed",
                      "resp_done": "completed"}
    dead_body = StoredResponse.objects.get(pk="resp_dead").to_dict()
    assert dead_body["status"] == "failed" and "restarted" in dead_body["error"]["message"]


def test_a_replica_keeps_its_work_while_it_beats_and_loses_it_when_it_stops(settings):
    grace = settings.METRALE["HEARTBEAT_GRACE_S"]
    here = heartbeat.pid_namespace()
    # Replicas elsewhere are judged by their heartbeat alone, one here by its pid too.
    make_response("resp_beating", status="in_progress", background=True,
                  worker=make_process("otherhost:1:a", beat_age_s=grace / 2))
    make_response("resp_here", status="in_progress", background=True,
                  worker=make_process("thishost:2:b", pid=os.getppid(),
                                      namespace=here))
    make_response("resp_silent", status="in_progress", background=True,
                  worker=make_process("otherhost:3:c", beat_age_s=grace + 1))
    make_response("resp_stopped", status="in_progress", background=True,
                  worker=make_process("otherhost:4:d", stopped=True))
    make_response("resp_unknown", status="queued", background=True, worker="oldformat:5")

    assert store.fail_unfinished() == 3
    status = dict(StoredResponse.objects.values_list("pk", "status"))
    assert status == {"resp_beating": "in_progress", "resp_here": "in_progress",
                      "resp_silent": "failed", "resp_stopped": "failed", "resp_unknown": "failed"}
    assert store.fail_unfinished() == 0  # each is failed once


def test_the_heartbeat_records_this_process_and_the_admin_lists_it(settings, admin_client):
    heartbeat.beat()
    row = ServerProcess.objects.get(pk=heartbeat.process_id())
    assert (row.pid, row.pid_namespace) == (os.getpid(), heartbeat.pid_namespace())
    assert row.host in row.id and row.stopped_at is None
    first = row.last_beat_at
    heartbeat.beat()
    assert ServerProcess.objects.get(pk=row.pk).last_beat_at >= first
    assert heartbeat.process_id() in heartbeat.live_process_ids()
    old = make_process("otherhost:9:old", beat_age_s=2 * 86400)
    page = admin_client.get("/admin/inference/serverprocess/")
    assert page.status_code == 200 and row.pk.encode() in page.content and old.encode() in page.content
    assert heartbeat.prune() == 1 and not ServerProcess.objects.filter(pk=old).exists()


def test_the_runtime_start_signal_runs_the_restart_rule(settings, monkeypatch):
    from inference.operations.runtime import runtime_starting

    dead = make_process("thishost:1:dead", pid=dead_pid(), namespace=heartbeat.pid_namespace())
    make_response("resp_dead", status="in_progress", worker=dead, background=True)
    settings.CELERY_BROKER_URL = "memory://"  # no purge thread from a test
    started = []
    monkeypatch.setattr(heartbeat, "start", lambda: started.append(heartbeat.beat()))
    runtime_starting.send(sender=None)
    assert started, "the heartbeat starts before the restart rule runs"
    assert StoredResponse.objects.get(pk="resp_dead").status == "failed"
    assert ServerProcess.objects.filter(pk=heartbeat.process_id()).exists()


def test_a_cancel_recorded_elsewhere_survives_the_run_finishing():
    make_response("resp_bg", status="in_progress", background=True)
    assert store.cancel_response(tenant(), "resp_bg").status == "cancelled"
    assert store.cancel_response(tenant(), "resp_bg").status == "cancelled"  # idempotent
    status = store.finish_response("resp_bg", {"status": "completed", "usage": None}, [])
    assert status == "cancelled"
    make_response("resp_finished", background=True)
    with pytest.raises(Exception) as info:
        store.cancel_response(tenant(), "resp_finished")
    assert info.value.status == 400


# --- admin ---


def test_the_admin_lists_filters_searches_and_shows_the_transcript(admin_client):
    make_response("resp_a", metadata={"project": "apollo"})
    make_response("resp_b", status="failed", owner="t2")
    r = admin_client.get("/admin/responses_api/storedresponse/")
    assert r.status_code == 200 and b"resp_a" in r.content and b"resp_b" in r.content
    r = admin_client.get("/admin/responses_api/storedresponse/", {"q": "apollo"})
    assert b"resp_a" in r.content and b"resp_b" not in r.content
    r = admin_client.get("/admin/responses_api/storedresponse/", {"status__exact": "failed"})
    assert b"resp_b" in r.content and b"resp_a" not in r.content
    r = admin_client.get("/admin/responses_api/storedresponse/", {"tenant__id__exact": tenant("t2").pk})
    assert b"resp_b" in r.content and b"resp_a" not in r.content
    r = admin_client.get("/admin/responses_api/storedresponse/", {"q": "t2"})  # the tenant's name
    assert b"resp_b" in r.content and b"resp_a" not in r.content
    r = admin_client.get(f"/admin/responses_api/storedresponse/{quote('resp_a')}/change/")
    assert r.status_code == 200
    assert b"user: question resp_a" in r.content and b"assistant: answer resp_a" in r.content


def test_deleting_in_the_admin_cascades(admin_client):
    make_response("resp_a")
    r = admin_client.post(f"/admin/responses_api/storedresponse/{quote('resp_a')}/delete/",
                          {"post": "yes"})
    assert r.status_code == 302
    assert not StoredResponse.objects.exists()
    assert not ResponseItem.objects.exists() and not ResponseEvent.objects.exists()

    conv = store.create_conversation(tenant(), [{"id": "msg_1", "type": "message",
                                                  "role": "user",
                                                  "content": [{"type": "input_text",
                                                               "text": "hello"}]}], {"k": "v"})
    r = admin_client.get(f"/admin/responses_api/conversation/{quote(conv.pk)}/change/")
    assert r.status_code == 200 and b"user: hello" in r.content
    r = admin_client.post(f"/admin/responses_api/conversation/{quote(conv.pk)}/delete/",
                          {"post": "yes"})
    assert r.status_code == 302 and not ConversationItem.objects.exists()


@pytest.mark.parametrize("text, seconds", [("", 30 * 86400), ("3600", 3600), ("90s", 90),
                                           ("15m", 900), ("12h", 43200), ("30d", 2592000),
                                           ("1.5h", 5400)])
def test_store_ttl_reads_seconds_or_a_unit(monkeypatch, text, seconds):
    from metrale_site.env import envduration_s

    monkeypatch.setenv("METRALE_STORE_TTL", text)
    assert envduration_s("METRALE_STORE_TTL", 30 * 86400) == seconds


@pytest.mark.parametrize("text", ["soon", "-5", "10w", "d"])
def test_a_bad_store_ttl_is_a_configuration_error(monkeypatch, text):
    from django.core.exceptions import ImproperlyConfigured

    from metrale_site.env import envduration_s

    monkeypatch.setenv("METRALE_STORE_TTL", text)
    with pytest.raises(ImproperlyConfigured):
        envduration_s("METRALE_STORE_TTL", 1)


def test_the_loading_thread_closes_the_connections_its_receivers_opened():
    import threading

    from django.db import connections
    from django.dispatch import Signal

    from inference.operations import runtime

    used = []

    def receiver(**_kwargs):
        connections["default"].cursor().execute("select 1")
        used.append(connections["default"])

    signal = Signal()  # runtime_starting's own receivers would start this process's heartbeat for good
    signal.connect(receiver, weak=False)
    thread = threading.Thread(target=runtime._send_from_this_thread, args=(signal,))
    thread.start()
    thread.join(30)
    assert used and used[0] is not connections["default"]  # the loading thread's own connection ...
    # ... closed once the receivers returned (Django ignores a close of SQLite's in-memory test database)
    assert used[0].connection is None or used[0].is_in_memory_db()
