"""The Batch API in-process on the scripted engine: create, validate, run (each line as its endpoint), files, cancel, expiry, resume, quota."""
import json
from datetime import timedelta

import pytest
from django.contrib.admin.utils import quote
from django.utils import timezone

from batches.models import Batch, BatchResult, BatchUsage
from inference.engine.request import BATCH_PRIORITY

from .batch_support import batch_of, chat_line, jsonl, lines_of, run_batch, upload
from .fake_engine import reply

pytestmark = pytest.mark.django_db(transaction=True)

VOLATILE = ("id", "created")


def _same_but_ids(a: dict, b: dict) -> bool:
    return {k: v for k, v in a.items() if k not in VOLATILE} == {k: v for k, v in b.items() if k not in VOLATILE}


def test_two_good_lines_and_one_invalid_body_complete_with_output_and_error_files(fake_rt, as_tenant):
    tc = as_tenant()
    data = jsonl(chat_line("a", "Hi"), chat_line("b", "Hello", max_tokens=3),
                 chat_line("bad", "x", temperature=9))
    batch = batch_of(tc, data, metadata={"job": "nightly"})
    assert batch["status"] == "validating" and batch["id"].startswith("batch_")
    assert batch["metadata"] == {"job": "nightly"} and batch["expires_at"] - batch["created_at"] == 86400
    assert run_batch(fake_rt, batch["id"]) == "completed"
    done = tc.get(f"/v1/batches/{batch['id']}").json()
    assert done["status"] == "completed" and done["request_counts"] == {"total": 3, "completed": 2, "failed": 1}
    for key in ("in_progress_at", "finalizing_at", "completed_at"):
        assert done[key] is not None
    assert done["failed_at"] is None and done["cancelled_at"] is None and done["errors"] is None
    assert done["model"] == "smollm2-135m-instruct"
    out = {row["custom_id"]: row for row in lines_of(tc, done["output_file_id"])}
    errors = lines_of(tc, done["error_file_id"])
    assert set(out) == {"a", "b"} and [e["custom_id"] for e in errors] == ["bad"]
    for custom_id, line in zip(("a", "b"), (chat_line("a", "Hi"), chat_line("b", "Hello", max_tokens=3))):
        row = out[custom_id]
        assert row["id"].startswith("batch_req_") and row["error"] is None
        assert row["response"]["status_code"] == 200 and row["response"]["request_id"].startswith("req_")
        direct = tc.post("/v1/chat/completions", line["body"]).json()
        assert _same_but_ids(row["response"]["body"], direct)
        assert row["response"]["body"]["id"].startswith("chatcmpl-")
    bad = errors[0]
    assert bad["error"] is None and bad["response"]["status_code"] == 400
    assert set(bad["response"]["body"]["error"]) == {"message", "type", "param", "code"}
    assert bad["response"]["body"]["error"]["param"] == "temperature"
    usage = done["usage"]
    bodies = [out[c]["response"]["body"]["usage"] for c in ("a", "b")]
    assert usage["input_tokens"] == sum(u["prompt_tokens"] for u in bodies)
    assert usage["output_tokens"] == sum(u["completion_tokens"] for u in bodies)
    assert usage["total_tokens"] == usage["input_tokens"] + usage["output_tokens"]
    day = BatchUsage.objects.get(tenant=tc.tenant)
    assert day.requests == 2 and day.input_tokens == usage["input_tokens"]
    output_file = tc.get(f"/v1/files/{done['output_file_id']}").json()
    assert output_file["purpose"] == "batch_output"


def test_lines_run_at_batch_priority_and_interactive_requests_at_zero(fake_rt, as_tenant, monkeypatch):
    seen = []
    submit = fake_rt.engine.submit
    monkeypatch.setattr(fake_rt.engine, "submit", lambda request: seen.append(request.priority) or submit(request))
    tc = as_tenant()
    batch = batch_of(tc, jsonl(chat_line("a"), chat_line("b")))
    run_batch(fake_rt, batch["id"])
    tc.post("/v1/chat/completions", chat_line("c")["body"])
    assert seen == [BATCH_PRIORITY, BATCH_PRIORITY, 0]


def test_completions_lines_equal_the_endpoints_body(fake_rt, as_tenant):
    tc = as_tenant()
    body = {"model": "smollm2-135m-instruct", "prompt": "Once", "max_tokens": 4}
    batch = batch_of(tc, jsonl({"custom_id": "x", "method": "POST", "url": "/v1/completions", "body": body}),
                     endpoint="/v1/completions")
    assert run_batch(fake_rt, batch["id"]) == "completed"
    row = lines_of(tc, tc.get(f"/v1/batches/{batch['id']}").json()["output_file_id"])[0]
    assert _same_but_ids(row["response"]["body"], tc.post("/v1/completions", body).json())
    assert row["response"]["body"]["object"] == "text_completion"


def test_responses_lines_equal_the_endpoints_body_and_are_stored(fake_rt, as_tenant):
    tc = as_tenant()
    body = {"model": "smollm2-135m-instruct", "input": "Hi", "max_output_tokens": 8}
    rows = [{"custom_id": "r", "method": "POST", "url": "/v1/responses", "body": body},
            {"custom_id": "bg", "method": "POST", "url": "/v1/responses", "body": {**body, "background": True}}]
    batch = batch_of(tc, jsonl(*rows), endpoint="/v1/responses")
    assert run_batch(fake_rt, batch["id"]) == "completed"
    done = tc.get(f"/v1/batches/{batch['id']}").json()
    row = lines_of(tc, done["output_file_id"])[0]["response"]["body"]
    direct = tc.post("/v1/responses", body).json()
    assert row["object"] == "response" and row["status"] == "completed"
    assert row["output"][0]["content"][0]["text"] == direct["output"][0]["content"][0]["text"]
    assert row["usage"] == direct["usage"]
    assert tc.get(f"/v1/responses/{row['id']}").json()["id"] == row["id"]  # stored, as the endpoint stores it
    bad = lines_of(tc, done["error_file_id"])[0]["response"]
    assert bad["status_code"] == 400 and bad["body"]["error"]["param"] == "background"


def test_a_line_naming_an_unknown_model_gets_the_endpoint_s_404_model_not_found(fake_rt, as_tenant):
    tc = as_tenant()
    batch = batch_of(tc, jsonl(chat_line("a"), chat_line("b", model="no-such-model")))
    assert run_batch(fake_rt, batch["id"]) == "completed"
    done = tc.get(f"/v1/batches/{batch['id']}").json()
    assert done["request_counts"] == {"total": 2, "completed": 1, "failed": 1}
    [row] = lines_of(tc, done["error_file_id"])
    assert row["custom_id"] == "b" and row["response"]["status_code"] == 404
    error = row["response"]["body"]["error"]
    assert error["code"] == "model_not_found" and "no-such-model" in error["message"]


def test_all_lines_failing_still_completes_with_a_null_output_file(fake_rt, as_tenant):
    tc = as_tenant()
    batch = batch_of(tc, jsonl(chat_line("a", temperature=9), chat_line("b", n=0)))
    assert run_batch(fake_rt, batch["id"]) == "completed"
    done = tc.get(f"/v1/batches/{batch['id']}").json()
    assert done["output_file_id"] is None and done["error_file_id"] is not None
    assert done["request_counts"] == {"total": 2, "completed": 0, "failed": 2}


@pytest.mark.parametrize("row, code, line, param", [
    (b"{not json", "invalid_json_line", 2, None),
    # Nested past what json's decoder recurses through: a line error, not a run that fails on every heartbeat.
    (b'{"custom_id": "d", "method": "POST", "url": "/v1/chat/completions", "body": {"a": ' + b"[" * 100_000
     + b"]" * 100_000 + b"}}", "invalid_json_line", 2, None),
    ({"custom_id": "z", "method": "POST", "url": "/v1/chat/completions"}, "missing_required_parameter", 2, "body"),
    (chat_line("a"), "duplicate_custom_id", 2, "custom_id"),
    ({**chat_line("z"), "url": "/v1/completions"}, "mismatched_endpoint", 2, "url"),
    ({**chat_line("z"), "method": "GET"}, "invalid_method", 2, "method"),
    (chat_line("z", stream=True), "stream_not_supported", 2, "body.stream"),
])
def test_a_bad_line_fails_the_batch_with_its_error(fake_rt, as_tenant, row, code, line, param):
    tc = as_tenant()
    batch = batch_of(tc, jsonl(chat_line("a"), row))
    assert run_batch(fake_rt, batch["id"]) == "failed"
    failed = tc.get(f"/v1/batches/{batch['id']}").json()
    assert failed["failed_at"] is not None and failed["in_progress_at"] is None
    assert failed["errors"]["object"] == "list"
    assert failed["errors"]["data"] == [{"code": code, "line": line, "param": param,
                                         "message": failed["errors"]["data"][0]["message"]}]
    assert fake_rt.engine.submissions == []


@pytest.mark.parametrize("body, status, param", [
    ({"endpoint": "/v1/moderations"}, 400, "endpoint"),
    ({"endpoint": "/v1/nothing"}, 400, "endpoint"),
    ({"completion_window": "48h"}, 400, "completion_window"),
    ({"metadata": {"k": 5}}, 400, "metadata"),
    ({"input_file_id": "file-missing"}, 404, "input_file_id"),
    ({"input_file_id": None}, 400, "input_file_id"),
])
def test_bad_create_requests_are_4xx_naming_the_field(fake_rt, as_tenant, body, status, param):
    tc = as_tenant()
    file_id = upload(tc, jsonl(chat_line("a"))).json()["id"]
    req = {"input_file_id": file_id, "endpoint": "/v1/chat/completions", "completion_window": "24h", **body}
    answer = tc.post("/v1/batches", req)
    assert answer.status_code == status, answer.content
    assert answer.json()["error"]["param"] == param
    assert not Batch.objects.exists()


def test_an_output_file_is_not_a_batch_input(fake_rt, as_tenant):
    tc = as_tenant()
    batch = batch_of(tc, jsonl(chat_line("a")))
    run_batch(fake_rt, batch["id"])
    output = tc.get(f"/v1/batches/{batch['id']}").json()["output_file_id"]
    answer = tc.post("/v1/batches", {"input_file_id": output, "endpoint": "/v1/chat/completions",
                                     "completion_window": "24h"})
    assert answer.status_code == 400 and answer.json()["error"]["code"] == "invalid_input_file"


def test_list_is_newest_first_with_after(fake_rt, as_tenant):
    tc = as_tenant()
    ids = [batch_of(tc, jsonl(chat_line("a")))["id"] for _ in range(4)]
    page = tc.get("/v1/batches", limit=3).json()
    assert [b["id"] for b in page["data"]] == ids[::-1][:3] and page["has_more"]
    rest = tc.get("/v1/batches", after=page["last_id"]).json()
    assert [b["id"] for b in rest["data"]] == [ids[0]] and not rest["has_more"]
    assert tc.get("/v1/batches", limit=0).status_code == 400


def test_cancel_before_it_runs_ends_cancelled_with_nothing_run(fake_rt, as_tenant):
    tc = as_tenant()
    batch = batch_of(tc, jsonl(chat_line("a"), chat_line("b")))
    cancelling = tc.post(f"/v1/batches/{batch['id']}/cancel").json()
    assert cancelling["status"] == "cancelling" and cancelling["cancelling_at"] is not None
    assert tc.post(f"/v1/batches/{batch['id']}/cancel").json()["status"] == "cancelling"
    assert run_batch(fake_rt, batch["id"]) == "cancelled"
    done = tc.get(f"/v1/batches/{batch['id']}").json()
    assert done["cancelled_at"] is not None and done["output_file_id"] is None
    assert fake_rt.engine.submissions == []
    again = tc.post(f"/v1/batches/{batch['id']}/cancel")
    assert again.status_code == 400 and again.json()["error"]["code"] == "batch_not_cancellable"


def test_cancel_while_running_stops_the_lines_in_flight(fake_rt, as_tenant, settings):
    settings.METRALE = {**settings.METRALE, "BATCH_POLL_S": 0.05}
    fake_rt.engine.delay_s = 0.02  # 20 ms a token: a line of 200 tokens would take 4 s
    fake_rt.engine.script = reply(fake_rt.tokenizer, "word " * 200, "length")
    tc = as_tenant()
    batch = batch_of(tc, jsonl(*[chat_line(f"l{i}", max_tokens=200) for i in range(20)]))
    import threading
    import time

    def cancel_soon():
        time.sleep(0.5)
        tc.post(f"/v1/batches/{batch['id']}/cancel")

    threading.Thread(target=cancel_soon).start()
    assert run_batch(fake_rt, batch["id"]) == "cancelled"
    done = tc.get(f"/v1/batches/{batch['id']}").json()
    assert done["request_counts"]["completed"] < 20
    assert all(s.handle.aborted == "cancelled" or not s.handle.events for s in fake_rt.engine.submissions)
    assert any(s.handle.aborted for s in fake_rt.engine.submissions)


def test_past_its_deadline_a_batch_expires_and_unrun_lines_are_batch_expired(fake_rt, as_tenant):
    tc = as_tenant()
    batch = batch_of(tc, jsonl(chat_line("a"), chat_line("b")))
    Batch.objects.filter(pk=batch["id"]).update(deadline_at=timezone.now() - timedelta(seconds=1))
    assert run_batch(fake_rt, batch["id"]) == "expired"
    done = tc.get(f"/v1/batches/{batch['id']}").json()
    assert done["expired_at"] is not None
    errors = lines_of(tc, done["error_file_id"])
    assert {e["custom_id"] for e in errors} == {"a", "b"}
    assert all(e["error"]["code"] == "batch_expired" and e["response"] is None for e in errors)


def test_a_resumed_batch_runs_only_the_lines_not_yet_written(fake_rt, as_tenant):
    tc = as_tenant()
    batch = batch_of(tc, jsonl(chat_line("a"), chat_line("b"), chat_line("c")))
    Batch.objects.filter(pk=batch["id"]).update(status="in_progress", total=3, completed=1,
                                                in_progress_at=timezone.now(), worker="gone:1:dead")
    written = json.dumps({"id": "batch_req_x", "custom_id": "b", "response": {"status_code": 200,
                                                                              "request_id": "r", "body": {}},
                          "error": None})
    BatchResult.objects.create(batch_id=batch["id"], custom_id="b", line=2, data=written)
    assert run_batch(fake_rt, batch["id"]) == "completed"
    assert len(fake_rt.engine.submissions) == 2
    out = lines_of(tc, tc.get(f"/v1/batches/{batch['id']}").json()["output_file_id"])
    assert [row["custom_id"] for row in out] == ["a", "b", "c"]
    assert out[1]["id"] == "batch_req_x"
    assert tc.get(f"/v1/batches/{batch['id']}").json()["request_counts"] == {"total": 3, "completed": 3,
                                                                               "failed": 0}


def test_a_batch_owned_by_a_live_process_is_not_claimed(fake_rt, as_tenant):
    from batches import execution
    from inference.operations import heartbeat

    tc = as_tenant()
    batch = batch_of(tc, jsonl(chat_line("a")))
    heartbeat.beat()
    Batch.objects.filter(pk=batch["id"]).update(worker="elsewhere:1:abcd")
    from inference.operations.heartbeat import ServerProcess
    ServerProcess.objects.create(id="elsewhere:1:abcd", host="elsewhere", pid=1, started_at=timezone.now(),
                                 last_beat_at=timezone.now())
    assert not execution.claim(batch["id"])
    ServerProcess.objects.filter(pk="elsewhere:1:abcd").update(stopped_at=timezone.now())
    assert execution.claim(batch["id"])


def test_the_tenants_batch_token_quota_fails_the_lines_past_it(fake_rt, as_tenant, settings):
    # One line at a time, so the first line's tokens are counted before the next one starts.
    settings.METRALE = {**settings.METRALE, "BATCH_TOKENS_PER_DAY": 1, "BATCH_MAX_NUM_SEQS": 1}
    tc = as_tenant()
    batch = batch_of(tc, jsonl(chat_line("a"), chat_line("b"), chat_line("c")))
    assert run_batch(fake_rt, batch["id"]) == "completed"
    done = tc.get(f"/v1/batches/{batch['id']}").json()
    assert done["request_counts"] == {"total": 3, "completed": 1, "failed": 2}
    errors = lines_of(tc, done["error_file_id"])
    assert all(e["response"]["status_code"] == 429 for e in errors)
    assert errors[0]["response"]["body"]["error"]["code"] == "batch_token_quota_exceeded"
    assert len(fake_rt.engine.submissions) == 1


def test_on_shutdown_a_run_stops_unfinished_and_the_next_owner_finishes_it(fake_rt, as_tenant, settings):
    from batches import execution

    settings.METRALE = {**settings.METRALE, "BATCH_POLL_S": 0.05}
    fake_rt.engine.delay_s = 0.02
    fake_rt.engine.script = reply(fake_rt.tokenizer, "word " * 100, "length")
    tc = as_tenant()
    batch = batch_of(tc, jsonl(*[chat_line(f"l{i}", max_tokens=100) for i in range(8)]))
    import threading

    threading.Timer(0.3, execution.stop_runs).start()
    try:
        assert run_batch(fake_rt, batch["id"]) == "in_progress"
    finally:
        execution.stopping.clear()
    stopped = tc.get(f"/v1/batches/{batch['id']}").json()
    assert stopped["request_counts"]["completed"] < 8 and stopped["output_file_id"] is None
    assert any(s.handle.aborted for s in fake_rt.engine.submissions)  # lines in flight were not written
    fake_rt.engine.delay_s = 0.0
    assert run_batch(fake_rt, batch["id"]) == "completed"
    assert tc.get(f"/v1/batches/{batch['id']}").json()["request_counts"] == {"total": 8, "completed": 8,
                                                                               "failed": 0}


def test_batch_usage_is_in_the_admin_per_tenant_and_day(fake_rt, as_tenant, admin_client):
    tc = as_tenant("acme")
    batch = batch_of(tc, jsonl(chat_line("a"), chat_line("b")))
    run_batch(fake_rt, batch["id"])
    usage = BatchUsage.objects.get(tenant=tc.tenant)
    page = admin_client.get("/admin/batches/batchusage/")
    assert page.status_code == 200
    html = page.content.decode()
    assert "acme" in html and str(usage.total_tokens) in html
    # The admin escapes "_" in a key ("_5F"): an id's "_29…" read unescaped would be ")…" (quote, as its links do).
    assert admin_client.get(f"/admin/batches/batch/{quote(batch['id'])}/change/").status_code == 200


def test_the_purge_deletes_expired_files_with_their_content_and_ended_batches(fake_rt, as_tenant):
    import os

    from batches.housekeeping import purge_expired
    from batches.models import StoredFile

    tc = as_tenant()
    batch = batch_of(tc, jsonl(chat_line("a")))
    run_batch(fake_rt, batch["id"])
    live = batch_of(tc, jsonl(chat_line("b")))  # still validating: kept
    paths = [f.content.path for f in StoredFile.objects.all()]
    past = timezone.now() - timedelta(seconds=1)
    StoredFile.objects.update(expires_at=past)
    Batch.objects.update(expires_at=past)
    assert purge_expired() == {"files": len(paths), "batches": 1}
    assert not StoredFile.objects.exists() and not any(os.path.exists(p) for p in paths)
    assert list(Batch.objects.values_list("id", flat=True)) == [live["id"]]


def test_a_run_that_raises_releases_the_batch_to_be_handed_on(fake_rt, as_tenant, monkeypatch):
    from batches import execution, runner

    tc = as_tenant()
    batch = batch_of(tc, jsonl(chat_line("a")))
    monkeypatch.setattr(execution.heartbeat, "start", lambda: None)

    async def broken(batch_id, registry):
        raise RuntimeError("the database went away")

    monkeypatch.setattr(runner, "run_batch", broken)
    with pytest.raises(RuntimeError):
        execution.run_here(batch["id"])
    assert Batch.objects.get(pk=batch["id"]).worker is None
    handed = []
    monkeypatch.setattr(execution.embedded, "submit", handed.append)
    assert execution.hand_on_orphans() == 1 and handed == [batch["id"]]


def test_an_input_file_whose_reading_raises_fails_the_batch_once_not_on_every_hand_on(fake_rt, as_tenant, monkeypatch):
    from batches import runner

    tc = as_tenant()
    batch = batch_of(tc, jsonl(chat_line("a")))

    def unforeseen(data, endpoint):
        raise RecursionError("maximum recursion depth exceeded")

    monkeypatch.setattr(runner, "parse_input", unforeseen)
    assert run_batch(fake_rt, batch["id"]) == "failed"
    failed = tc.get(f"/v1/batches/{batch['id']}").json()
    assert failed["failed_at"] is not None
    assert failed["errors"]["data"] == [{"code": "invalid_input_file", "line": None, "param": "input_file_id",
                                         "message": f"The input file {batch['input_file_id']} could not be read "
                                                    "as batch lines."}]
    assert fake_rt.engine.submissions == []


RABBITMQ = "amqp://guest:guest@127.0.0.1:5672//"


@pytest.fixture
def celery_broker(settings, monkeypatch):
    """celery_broker(url, queue): batches go to the broker at `url` (a queue of the test's own), as
    with CELERY_BROKER_URL set; the Celery app's connections are made afresh for the test."""
    from metrale_site.celery import app

    def use(url: str, queue: str) -> None:
        settings.CELERY_BROKER_URL = url
        monkeypatch.setitem(app.conf, "broker_url", url)
        monkeypatch.setitem(app.conf, "task_always_eager", False)
        monkeypatch.setitem(app.conf, "task_routes", {"batches.tasks.*": {"queue": queue}})
        monkeypatch.setattr(app.amqp, "_rtable", None)
        monkeypatch.setattr(app.amqp, "router", app.amqp.Router())
        monkeypatch.setattr(app, "_pool", None)
        monkeypatch.setattr(app.amqp, "_producer_pool", None)
    return use


def closed_port() -> int:
    import socket

    with socket.socket() as s:  # a port just bound and released: nothing listens on it
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_batch_made_while_the_broker_is_unreachable_is_queued_once_it_is_back(fake_rt, as_tenant,
                                                                                 celery_broker, caplog):
    import secrets
    import socket

    from kombu import Connection, Queue

    from batches import execution

    try:
        socket.create_connection(("127.0.0.1", 5672), timeout=1).close()
    except OSError:
        pytest.skip("RabbitMQ is not running on 127.0.0.1:5672")
    queue = f"batches-test-{secrets.token_hex(4)}"
    celery_broker(f"amqp://guest:guest@127.0.0.1:{closed_port()}//", queue)
    tc = as_tenant()
    batch = batch_of(tc, jsonl(chat_line("a")))  # a 200, not a 500: the row is kept and sent later
    assert batch["status"] == "validating"
    assert Batch.objects.get(pk=batch["id"]).queued_at is None
    assert "broker is unreachable" in caplog.text
    assert execution.hand_on_orphans() == 0  # a heartbeat while the broker is still away
    assert Batch.objects.get(pk=batch["id"]).queued_at is None
    celery_broker(RABBITMQ, queue)
    try:
        assert execution.hand_on_orphans() == 1  # the next heartbeat reaches it
        assert Batch.objects.get(pk=batch["id"]).queued_at is not None
        assert execution.hand_on_orphans() == 0  # sent once
        with Connection(RABBITMQ) as con:
            sent = Queue(queue, channel=con.default_channel).get(no_ack=True)
            assert sent is not None and sent.headers["task"] == "batches.tasks.run_batch"
            assert sent.decode()[0] == [batch["id"]]
            assert Queue(queue, channel=con.default_channel).get(no_ack=True) is None
    finally:
        with Connection(RABBITMQ) as con:
            Queue(queue, channel=con.default_channel).delete()


def test_the_orphan_of_a_gone_worker_is_queued_again_and_a_queued_batch_is_left(fake_rt, as_tenant, celery_broker,
                                                                                 monkeypatch):
    from batches import execution, tasks

    sent = []
    celery_broker("memory://", "batches-test")
    monkeypatch.setattr(tasks.run_batch, "delay", sent.append)
    tc = as_tenant()
    batch = batch_of(tc, jsonl(chat_line("a")))
    assert sent == [batch["id"]] and Batch.objects.get(pk=batch["id"]).queued_at is not None
    assert execution.hand_on_orphans() == 0  # queued, nobody has taken it yet: left in the queue
    Batch.objects.filter(pk=batch["id"]).update(worker="gone:1:abcd")  # a worker that never beat
    assert execution.hand_on_orphans() == 1 and sent == [batch["id"]] * 2
    assert Batch.objects.get(pk=batch["id"]).worker is None
