"""CORS in a real browser: a page on another origin (http://localhost:PORT calling http://127.0.0.1:PORT) reads
the API's answers with a bearer key after Chromium's own preflight, and cannot read the pages."""
from __future__ import annotations

CALL = """async ([url, key]) => {
  try {
    const r = await fetch(url, {method: "POST", headers: {"Authorization": `Bearer ${key}`,
      "Content-Type": "application/json", "X-Stainless-OS": "Linux"},
      body: JSON.stringify({messages: [{role: "user", content: "Say hi"}], max_tokens: 3})});
    return {status: r.status, requestId: r.headers.get("x-request-id"), body: await r.json()};
  } catch (e) { return {blocked: String(e)}; }
}"""

READ_PAGE = """async (url) => {
  try { const r = await fetch(url); return {status: r.status, text: await r.text()}; }
  catch (e) { return {blocked: String(e)}; }
}"""


def test_another_origin_calls_the_api_but_not_the_pages(page, auth_server):
    other_origin = auth_server.url.replace("127.0.0.1", "localhost")
    page.goto(other_origin + "/health/live")
    # Authorization and a JSON body make Chromium send its preflight first; only its 200 lets the POST go.
    answer = page.evaluate(CALL, [auth_server.url + "/v1/chat/completions", auth_server.keys["owner"]])
    assert answer.get("status") == 200, answer
    assert answer["body"]["object"] == "chat.completion"
    assert answer["requestId"].startswith("req_")  # an exposed header

    for path in ("/admin/login/", "/playground", "/"):
        blocked = page.evaluate(READ_PAGE, auth_server.url + path)
        assert "blocked" in blocked, (path, blocked)
