"""The request log: one JSON line per API request with the contract's fields, bodies only when asked,
a bounded queue that drops (and counts) instead of waiting, the database table pruned by age and its
admin, and every log line of a request naming its request id."""
import json
import logging
from datetime import timedelta

import pytest
from django.utils import timezone

from inference.operations import request_log
from inference.http.request_context import RequestIdFilter
from inference.operations.request_log import RequestLogEntry, RequestLogWriter

from .fake_engine import reply
from .observed import call, scrape, value

FIELDS = {"request_id", "ts", "route", "method", "tenant", "model", "status", "prompt_tokens",
          "completion_tokens", "cached_tokens", "ttft_ms", "e2e_ms", "finish_reason", "replica"}
USER = [{"role": "user", "content": "Say hello to the lighthouse keeper"}]


@pytest.fixture
def log_file(tmp_path, settings, monkeypatch):
    """The request log on (file + table) with a writer that is not started: `flush()` writes what
    was queued, so tests read the lines at once."""
    path = tmp_path / "requests.jsonl"

    def configure(bodies=False, queue_size=100):
        settings.METRALE = {**settings.METRALE, "REQUEST_LOG": str(path), "REQUEST_LOG_DB": True,
                            "REQUEST_LOG_BODIES": bodies}
        writer = RequestLogWriter(str(path), True, 3600, queue_size=queue_size)
        monkeypatch.setattr(request_log, "_writer", writer)
        return writer
    return path, configure


def flush(writer) -> None:
    batch = []
    while not writer.queue.empty():
        batch.append(writer.queue.get_nowait())
    if batch:
        writer.write(batch)


def lines(path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_each_api_request_is_one_line_with_the_contracts_fields_and_no_bodies(fake_rt, log_file):
    path, configure = log_file
    writer = configure()
    fake_rt.engine.script = reply(fake_rt.tokenizer, "Hello there")
    answer = call("POST", "/v1/chat/completions", {"model": "smollm2-135m-instruct", "messages": USER, "stream": True},
                  headers={"x-request-id": "req_logged"})
    call("POST", "/v1/chat/completions", {"model": "smollm2-135m-instruct"})  # a 400
    call("GET", "/health")  # not an API request for the log
    flush(writer)
    streamed, refused = lines(path)
    assert set(streamed) == FIELDS and answer.headers["x-request-id"] == "req_logged"
    assert streamed["request_id"] == "req_logged" and streamed["route"] == "v1/chat/completions"
    assert streamed["status"] == 200 and streamed["tenant"] == "default" and streamed["method"] == "POST"
    assert streamed["model"] == "smollm2-135m-instruct" and streamed["finish_reason"] == "stop"
    assert streamed["prompt_tokens"] > 0 and streamed["completion_tokens"] == len(fake_rt.tokenizer.encode("Hello there"))
    assert streamed["cached_tokens"] == 0 and 0 < streamed["ttft_ms"] <= streamed["e2e_ms"]
    assert streamed["ts"].endswith("+00:00")
    assert "lighthouse" not in path.read_text()
    assert refused["status"] == 400 and refused["model"] is None and refused["finish_reason"] is None
    rows = list(RequestLogEntry.objects.order_by("ts").values("request_id", "status", "route", "tenant"))
    assert rows[0] == {"request_id": "req_logged", "status": 200, "route": "v1/chat/completions", "tenant": "default"}
    assert [r["status"] for r in rows] == [200, 400]


def test_bodies_are_logged_only_when_asked_and_a_stream_is_summarised(fake_rt, log_file):
    path, configure = log_file
    writer = configure(bodies=True)
    fake_rt.engine.script = reply(fake_rt.tokenizer, "Hello keeper")
    call("POST", "/v1/chat/completions", {"model": "smollm2-135m-instruct", "messages": USER, "stream": True})
    call("GET", "/v1/models")
    flush(writer)
    streamed, models = lines(path)
    assert streamed["request_body"]["messages"] == USER
    [choice] = streamed["response_body"]["choices"]
    assert choice["text"] == "Hello keeper" and choice["finish_reason"] == "stop" and choice["tool_calls"] == []
    assert streamed["response_body"]["usage"]["completion_tokens"] == streamed["completion_tokens"]
    assert models["response_body"]["object"] == "list" and models["request_body"] is None
    assert not {"request_body", "response_body"} & {f.name for f in RequestLogEntry._meta.get_fields()}
    assert "lighthouse" in path.read_text()


def test_a_full_queue_drops_and_counts_instead_of_waiting(fake_rt, log_file):
    path, configure = log_file
    writer = configure(queue_size=1)
    before = value(scrape(), "metrale:request_log_dropped_total")
    for _ in range(3):
        call("GET", "/v1/models")
    flush(writer)
    assert len(lines(path)) == 1
    # The scrape itself is no API request: nothing more was dropped for it.
    assert value(scrape(), "metrale:request_log_dropped_total") == before + 2


def test_old_rows_are_pruned(db):
    old = RequestLogEntry.objects.create(request_id="req_old", ts=timezone.now() - timedelta(days=2), route="r",
                                         method="GET", status=200, e2e_ms=1)
    writer = RequestLogWriter(None, True, db_ttl_s=86400)
    writer.write([{"request_id": "req_new", "ts": timezone.now().isoformat(), "replica": "x", "route": "r",
                   "method": "GET", "tenant": None, "model": None, "status": 200, "prompt_tokens": None,
                   "completion_tokens": None, "cached_tokens": None, "ttft_ms": None, "e2e_ms": 2.0,
                   "finish_reason": None}])
    assert list(RequestLogEntry.objects.values_list("request_id", flat=True)) == ["req_new"]
    assert not RequestLogEntry.objects.filter(pk=old.pk).exists()


def test_a_disk_that_fails_loses_the_batch_and_the_server_goes_on(tmp_path, caplog):
    writer = RequestLogWriter(str(tmp_path / "missing" / "dir" / "log.jsonl"), False, 60)
    writer.write([{"request_id": "x"}])
    assert "writing the request log" in caplog.text


def test_the_admin_lists_filters_and_never_edits_the_log(admin_client, db):
    for i, (tenant, status) in enumerate((("acme", 200), ("globex", 429), ("acme", 400))):
        RequestLogEntry.objects.create(request_id=f"req_{i}", ts=timezone.now(), route="v1/chat/completions",
                                       method="POST", tenant=tenant, status=status, e2e_ms=3)
    url = "/admin/inference/requestlogentry/"
    page = admin_client.get(url).content.decode()
    assert "req_0" in page and "req_2" in page
    page = admin_client.get(url, {"tenant": "globex"}).content.decode()
    assert "req_1" in page and "req_0" not in page
    page = admin_client.get(url, {"status": "400"}).content.decode()
    assert "req_2" in page and "req_1" not in page
    assert admin_client.get(url + "add/").status_code == 403


def test_every_log_line_of_a_request_names_its_request_id(fake_rt, monkeypatch):
    seen: list[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, record):
            seen.append(record)

    handler = Keep()
    handler.addFilter(RequestIdFilter())
    logger = logging.getLogger("metrale")
    logger.addHandler(handler)
    from inference.serving import chat

    parse = chat.parse

    def parse_and_log(body):  # runs on the prepare pool's thread
        logging.getLogger("metrale.api").warning("parsing on the pool")
        return parse(body)

    monkeypatch.setattr(chat, "parse", parse_and_log)
    try:
        call("POST", "/v1/chat/completions", {"model": "smollm2-135m-instruct", "messages": USER}, headers={"x-request-id": "req_ctx"})
        logging.getLogger("metrale").warning("outside any request")
    finally:
        logger.removeHandler(handler)
    by_message = {r.getMessage(): r.request_id for r in seen}
    assert by_message["parsing on the pool"] == "req_ctx"
    assert by_message["outside any request"] == "-"


def test_django_security_records_keep_to_one_line_and_others_keep_their_traceback():
    import logging
    import sys

    from inference.http.request_context import ClientFaultFilter

    try:
        raise ValueError("bad host")
    except ValueError:
        exc_info = sys.exc_info()
    refused = logging.LogRecord("django.security.DisallowedHost", logging.ERROR, __file__, 1, "Invalid HTTP_HOST",
                                None, exc_info)
    failed = logging.LogRecord("django.request", logging.ERROR, __file__, 1, "Internal Server Error", None, exc_info)
    assert ClientFaultFilter().filter(refused) and ClientFaultFilter().filter(failed)
    assert refused.exc_info is None and failed.exc_info is exc_info
    assert "Traceback" not in logging.Formatter().format(refused)
    assert "Traceback" in logging.Formatter().format(failed)
