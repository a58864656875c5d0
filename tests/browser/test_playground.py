"""The playground in Chromium against a live daphne serving SmolLM2: a streamed answer appears token by token
(the real /v1/chat/completions over SSE), as the operators' tenant from an admin session, or with a key."""
from __future__ import annotations

# Every change of the last answer's text, recorded in the page as it happens (with the time, in ms).
RECORD_ANSWERS = """() => {
  window.answerSnapshots = [];
  new MutationObserver(() => {
    const answers = document.querySelectorAll("#log .turn.assistant .answer");
    const last = answers[answers.length - 1];
    const text = last ? last.textContent : "";
    const seen = window.answerSnapshots;
    if (text && (!seen.length || seen[seen.length - 1].text !== text)) seen.push({text, t: performance.now()});
  }).observe(document.getElementById("log"), {subtree: true, childList: true, characterData: true});
}"""


def ask(page, question: str, **params) -> None:
    for field, value in params.items():
        page.fill(f"#p-{field.replace('_', '-')}", str(value))
    page.fill("#prompt", question)
    page.click("#send")


def wait_for_turn(page, timeout_ms: int = 120_000):
    page.wait_for_selector("#log .turn.assistant[data-state=done], #log .turn.assistant[data-state=error]",
                           timeout=timeout_ms)
    return page.locator("#log .turn.assistant").last


def test_it_streams_an_answer_token_by_token_from_a_staff_session(operator_page, auth_server, tmp_path):
    page = operator_page
    page.goto(auth_server.url + "/playground")
    assert page.locator("#api-key").count() == 0  # the session is the credential
    page.evaluate(RECORD_ANSWERS)
    with page.expect_response(lambda r: r.url.endswith("/v1/chat/completions")) as answer:
        ask(page, "What is the capital of France?", temperature=0, max_tokens=40)
    assert answer.value.status == 200
    assert answer.value.headers["content-type"].startswith("text/event-stream")
    turn = wait_for_turn(page)
    page.screenshot(path=str(tmp_path / "playground.png"), full_page=True)
    assert turn.get_attribute("data-state") == "done", turn.inner_text()
    final = turn.locator(".answer").inner_text()
    assert "Paris" in final

    snapshots = page.evaluate("window.answerSnapshots")
    texts = [s["text"] for s in snapshots]
    assert len(texts) >= 5, texts  # many partial answers, not one at the end
    assert all(b.startswith(a) for a, b in zip(texts, texts[1:])), texts  # each one grows the last
    assert texts[-1] == final
    assert snapshots[-1]["t"] > snapshots[0]["t"]

    stats = turn.locator(".stats").inner_text()
    assert "TTFT" in stats and "completion" in stats and "prompt" in stats, stats
    assert turn.locator(".reasoning").is_hidden() and turn.locator(".tool-call").count() == 0


def test_it_carries_the_conversation_into_the_next_turn(operator_page, auth_server):
    page = operator_page
    page.goto(auth_server.url + "/playground")
    ask(page, "What is the capital of France?", temperature=0, max_tokens=20)
    wait_for_turn(page)
    with page.expect_request(lambda r: r.url.endswith("/v1/chat/completions")) as sent:
        ask(page, "And of Italy?")
    body = sent.value.post_data_json
    assert [m["role"] for m in body["messages"]] == ["user", "assistant", "user"]
    assert "Paris" in body["messages"][1]["content"]
    assert body["temperature"] == 0 and body["max_tokens"] == 20 and body["stream"] is True
    page.wait_for_function("document.querySelectorAll('#log .turn.assistant[data-state=done]').length == 2",
                           timeout=120_000)


def test_a_visitor_enters_a_key(page, auth_server):
    page.goto(auth_server.url + "/playground")
    ask(page, "What is the capital of France?", temperature=0, max_tokens=20)
    turn = wait_for_turn(page)
    assert turn.get_attribute("data-state") == "error"
    assert "401" in turn.locator(".error").inner_text()

    page.fill("#api-key", auth_server.keys["owner"])
    page.dispatch_event("#api-key", "change")
    ask(page, "What is the capital of France?")
    page.wait_for_function("document.querySelectorAll('#log .turn.assistant[data-state=done]').length == 1",
                           timeout=120_000)
    assert "Paris" in page.locator("#log .turn.assistant .answer").last.inner_text()


def test_it_sends_the_side_panel_parameters(page, auth_server):
    page.goto(auth_server.url + "/playground")
    page.fill("#api-key", auth_server.keys["owner"])
    page.fill("#p-tools", '[{"type": "function", "function": {"name": "get_weather", "parameters": '
                          '{"type": "object", "properties": {"city": {"type": "string"}}}}}]')
    page.select_option("#p-response-format", "json_object")
    with page.expect_request(lambda r: r.url.endswith("/v1/chat/completions")) as sent:
        ask(page, "Weather in Paris?", temperature=0.5, top_p=0.9, max_tokens=8, seed=7)
    body = sent.value.post_data_json
    assert body["tools"][0]["function"]["name"] == "get_weather"
    assert body["response_format"] == {"type": "json_object"}
    assert (body["temperature"], body["top_p"], body["max_tokens"], body["seed"]) == (0.5, 0.9, 8, 7)
    assert body["stream_options"] == {"include_usage": True}
    wait_for_turn(page)


def test_it_refuses_tools_that_are_not_json_before_sending(page, auth_server):
    page.goto(auth_server.url + "/playground")
    page.fill("#p-tools", "[{not json")
    sent = []
    page.on("request", lambda r: sent.append(r.url) if "/v1/" in r.url else None)
    ask(page, "hi")
    page.wait_for_selector("#form-error:not([hidden])")
    assert "tools is not JSON" in page.inner_text("#form-error")
    assert sent == []
