"""The admin's live dashboard in Chromium against a live daphne serving SmolLM2: its Models table, a streamed chat
request shows up while it runs and goes when it ends; its Cancel button ends the client's stream in-band (an error frame
with code `cancelled`, then [DONE])."""
from __future__ import annotations

import json
import threading
import uuid

import httpx


class Stream(threading.Thread):
    """A streamed chat completion with its own X-Request-Id, read in a thread: `frames` (the data lines)."""

    def __init__(self, server, key: str, max_tokens: int):
        super().__init__(daemon=True)
        self.url = server.url + "/v1/chat/completions"
        self.request_id = f"req_dash_{uuid.uuid4().hex[:12]}"
        self.headers = {"Authorization": f"Bearer {key}", "X-Request-Id": self.request_id}
        self.body = {"messages": [{"role": "user", "content": "Count from one to a thousand in words."}],
                     "stream": True, "max_tokens": max_tokens, "ignore_eos": True, "temperature": 0}
        self.frames: list[str] = []
        self.status = None

    def run(self):
        with httpx.stream("POST", self.url, json=self.body, headers=self.headers, timeout=300) as r:
            self.status = r.status_code
            for line in r.iter_lines():
                if line.startswith("data: "):
                    self.frames.append(line[6:])

    def content_tokens(self) -> int:
        return sum(1 for f in self.frames if f != "[DONE]" and "error" not in json.loads(f)
                   for c in json.loads(f)["choices"] if c["delta"].get("content"))


def open_dashboard(page, server):
    page.goto(server.url + "/admin/dashboard/")
    page.wait_for_selector("#connection[data-state=open]")
    page.wait_for_selector("#dashboard[data-replica]")  # the first snapshot arrived
    return page


def row(page, stream: Stream) -> str:
    return f'#running tr[data-http-request-id="{stream.request_id}"]'


def test_it_shows_a_running_request_and_removes_it_after(operator_page, auth_server, tmp_path):
    page = open_dashboard(operator_page, auth_server)
    assert page.inner_text("#running-empty") == "No request is running."
    # Long enough to be seen by snapshots sent at most twice a second, on a fast machine too.
    stream = Stream(auth_server, auth_server.keys["owner"], max_tokens=400)
    stream.start()
    page.wait_for_selector(row(page, stream), timeout=60_000)
    cells = page.locator(row(page, stream) + " td").all_inner_texts()
    page.screenshot(path=str(tmp_path / "dashboard_running.png"), full_page=True)
    assert cells[0] == stream.request_id and cells[1] == "owner" and "chat/completions" in cells[2]
    assert cells[3] in ("prefill", "decode")
    assert int(cells[4]) > 10  # prompt tokens; the prompt's text is never shown
    assert "Count from one" not in page.content()
    assert int(page.inner_text("#kv-used")) > 0
    # The Models table: every configured model, the resident engine's KV blocks and running requests beside it.
    model = page.locator('#models tr[data-model="smollm2-135m-instruct"]')
    assert model.get_attribute("data-state") == "loaded"
    model_cells = model.locator("td").all_inner_texts()
    assert model_cells[1] == "chat" and model_cells[2] == "loaded" and " / " in model_cells[5]

    stream.join(timeout=240)
    assert stream.status == 200 and stream.frames[-1] == "[DONE]"
    assert stream.content_tokens() > 0
    page.wait_for_selector(row(page, stream), state="detached", timeout=10_000)
    page.wait_for_selector("#running-empty:not([hidden])")
    # The finished request is in the throughput chart's series now.
    # (attached, not "visible": a series whose samples are all equal is a flat line, which has no height)
    line = page.wait_for_selector('#chart-throughput polyline[data-series="generation_tokens_per_s"]',
                                  state="attached", timeout=20_000)
    assert len(line.get_attribute("points").split()) >= 2


def test_cancelling_from_the_dashboard_ends_the_stream(operator_page, auth_server):
    page = open_dashboard(operator_page, auth_server)
    stream = Stream(auth_server, auth_server.keys["owner"], max_tokens=1000)
    stream.start()
    page.wait_for_selector(row(page, stream), timeout=60_000)
    page.wait_for_function("n => document.querySelector(n)?.cells[6]?.textContent.split(' / ')[0] > 2",
                           arg=row(page, stream), timeout=60_000)  # it is decoding
    page.click(row(page, stream) + " button.cancel")
    stream.join(timeout=60)
    assert not stream.is_alive(), "the stream did not end after the cancel"
    assert stream.frames[-1] == "[DONE]"
    error = json.loads(stream.frames[-2])["error"]
    assert error["code"] == "cancelled"
    assert stream.content_tokens() < 1000
    page.wait_for_selector(row(page, stream), state="detached", timeout=10_000)
    assert page.inner_text("#notice") == f"cancelled {stream.request_id}"
