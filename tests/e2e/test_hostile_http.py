"""The hostile kinds against a live daphne (what the in-process suite cannot see: daphne's and twisted's own
HTTP layer): over-size bodies refused without being buffered, form bodies reaching the application, every
answer JSON (in Ollama's shape on its routes), and the request that used to hang answered at once."""
import json
import socket
import threading
import time
from pathlib import Path

import httpx
import pytest

pytestmark = pytest.mark.e2e

LIMIT = 32 << 20


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


def assert_openai_error(answer: httpx.Response, status: int) -> dict:
    assert answer.status_code == status, (answer.status_code, answer.content[:300])
    assert answer.headers["content-type"] == "application/json", answer.content[:300]
    err = answer.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    return err


def test_a_chunked_body_over_the_limit_is_a_413_without_being_buffered(metrale_server):
    def chunks(total_mb: int):
        piece = b" " * (1 << 20)
        for _ in range(total_mb):
            yield piece

    pid, peak, done = metrale_server.proc.pid, [0.0], threading.Event()

    def sample():  # the peak while the body arrives (daphne used to queue all of it: +247 MB for 256 MiB)
        while not done.is_set():
            peak[0] = max(peak[0], rss_mb(pid))
            time.sleep(0.005)

    with httpx.Client(timeout=60) as client:
        client.get(metrale_server.url + "/health")
        before = rss_mb(pid)
        sampler = threading.Thread(target=sample)
        sampler.start()
        try:
            answer = client.post(metrale_server.url + "/v1/chat/completions", content=chunks(96),
                                 headers={"content-type": "application/json"})
        finally:
            done.set()
            sampler.join()
    assert assert_openai_error(answer, 413)["code"] == "request_too_large"
    assert peak[0] - before < 24, f"the server grew {peak[0] - before:.0f} MB for a 96 MiB body"


@pytest.mark.parametrize("size", [100, 300_000])  # twisted keeps the first in memory and spools the second to a file
def test_a_compressed_body_is_a_415_and_leaves_no_error_behind(metrale_server, size):
    import gzip

    start = len(metrale_server.log())
    body = json.dumps({"messages": [{"role": "user", "content": "x" * size}], "max_tokens": 1}).encode()
    answer = httpx.post(metrale_server.url + "/v1/chat/completions", content=gzip.compress(body),
                        headers={"content-type": "application/json", "content-encoding": "gzip"}, timeout=60)
    assert assert_openai_error(answer, 415)["code"] == "unsupported_content_encoding"
    served = httpx.post(metrale_server.url + "/v1/chat/completions", content=body,
                        headers={"content-type": "application/json"}, timeout=60)
    assert served.status_code in (200, 400), served.content[:300]  # the next request is read as ever
    time.sleep(0.2)  # the feeder of a spooled body runs on the loop after the answer
    # The spool's feeder found the file closed by the early answer: "Task exception was never retrieved".
    assert "Traceback" not in metrale_server.log()[start:], metrale_server.log()[start:]


def test_a_declared_length_over_the_limit_is_a_413(metrale_server):
    answer = httpx.post(metrale_server.url + "/v1/completions", content=b" " * (LIMIT + 1),
                        headers={"content-type": "application/json"}, timeout=60)
    assert assert_openai_error(answer, 413)["code"] == "request_too_large"


def test_a_client_expecting_100_continue_is_refused_before_it_sends_the_body(metrale_server):
    host, port = metrale_server.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as conn:
        conn.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Origin: https://app.example.com\r\n"
                     b"Content-Length: %d\r\nExpect: 100-continue\r\n\r\n" % (LIMIT * 8))
        answer = b""
        while chunk := conn.recv(65536):  # the server closes once it has answered
            answer += chunk
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 413") and b"100 Continue" not in head, answer[:300]
    assert json.loads(body)["error"]["code"] == "request_too_large"
    # daphne's layer answers before Django: the CORS headers of every /v1 answer all the same
    assert b"\r\naccess-control-allow-origin: *\r\n" in head and b"\r\nvary: origin" in head, head


@pytest.mark.parametrize("content_type, body", [
    ("multipart/form-data; boundary=x", b'--x\r\nContent-Disposition: form-data; name="a"\r\n\r\nb\r\n--x--\r\n'),
    ("multipart/form-data", b"--x--"), ("application/x-www-form-urlencoded", b"a=%ff&b"),
])
def test_form_bodies_reach_the_application_and_get_a_json_400(metrale_server, content_type, body):
    answer = httpx.post(metrale_server.url + "/v1/chat/completions", content=body,
                        headers={"content-type": content_type}, timeout=30)
    assert assert_openai_error(answer, 400)["code"] == "invalid_json"


@pytest.mark.parametrize("method, path, status", [("GET", "/v1/", 404), ("GET", "/v1", 404),
                                                  ("POST", "/health", 405), ("GET", "/tokenize/", 404)])
def test_answers_off_the_routes_are_json(metrale_server, method, path, status):
    assert_openai_error(httpx.request(method, metrale_server.url + path, timeout=30), status)


def test_the_stream_that_used_to_hang_is_answered_at_once(metrale_server):
    raw = b'{"input": "hi", "stream": true, "max_output_tokens": 4, "metadata": {"a": "\\ud800"}}'
    answer = httpx.post(metrale_server.url + "/v1/responses", content=raw,
                        headers={"content-type": "application/json"}, timeout=10)
    assert assert_openai_error(answer, 400)["param"] == "metadata.a"


def test_deep_nesting_and_huge_integers_are_400s(metrale_server):
    for raw, param in ((b"[" * 100_000 + b"]" * 100_000, None),
                       (b'{"prompt": "x", "seed": ' + b"1" * 5000 + b"}", "seed")):
        answer = httpx.post(metrale_server.url + "/v1/completions", content=raw,
                            headers={"content-type": "application/json"}, timeout=30)
        assert assert_openai_error(answer, 400)["param"] == param


def assert_ollama_error(answer: httpx.Response, status: int) -> str:
    assert answer.status_code == status, (answer.status_code, answer.content[:300])
    assert answer.headers["content-type"] == "application/json", answer.content[:300]
    assert set(answer.json()) == {"error"} and answer.json()["error"]
    return answer.json()["error"]


@pytest.mark.parametrize("raw", [b"[" * 100_000 + b"]" * 100_000,
                                 b'{"model": "m", "options": {"seed": ' + b"1" * 5000 + b"}}",
                                 b'{"model": "\xff"}', b'{"model": "x", "options": {"temperature": "hot"}}'])
def test_ollama_s_routes_answer_hostile_bodies_with_400s_in_their_shape(metrale_server, raw):
    answer = httpx.post(metrale_server.url + "/api/chat", content=raw, headers={"content-type": "application/json"},
                        timeout=30)
    assert_ollama_error(answer, 400)


def test_a_declared_length_over_the_limit_on_ollama_s_routes_is_a_413_in_their_shape(metrale_server):
    answer = httpx.post(metrale_server.url + "/api/generate", content=b" " * (LIMIT + 1),
                        headers={"content-type": "application/json"}, timeout=60)
    assert "bytes" in assert_ollama_error(answer, 413)
