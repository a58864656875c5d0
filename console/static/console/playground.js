// The playground: chat with the served model over /v1/chat/completions, streamed (SSE), the request's
// parameters from the side panel; reasoning and tool calls are shown apart from the answer, then usage
// and TTFT. Credentials: the admin session (with the CSRF token) or the key typed into the panel.
import { sseData } from "./sse.js";

const $ = (id) => document.getElementById(id);
const csrfToken = document.querySelector("meta[name=csrf-token]").content;
const history = []; // the conversation sent with every turn (chat messages)
let running = null; // the AbortController of the turn in flight

function element(tag, className, text) {
  const node = document.createElement(tag);
  if (className) node.className = className;
  if (text !== undefined) node.textContent = text;
  return node;
}

function number(id, parse) {
  const raw = $(id).value.trim();
  return raw === "" ? undefined : parse(raw);
}

/** The request body from the history and the side panel; throws Error with a readable message. */
function requestBody() {
  const body = { model: $("p-model").value.trim(), stream: true, stream_options: { include_usage: true } };
  const system = $("p-system").value.trim();
  body.messages = system ? [{ role: "system", content: system }, ...history] : [...history];
  const fields = { temperature: ["p-temperature", parseFloat], top_p: ["p-top-p", parseFloat],
                   max_tokens: ["p-max-tokens", (v) => parseInt(v, 10)], seed: ["p-seed", (v) => parseInt(v, 10)] };
  for (const [name, [id, parse]] of Object.entries(fields)) {
    const value = number(id, parse);
    if (value !== undefined) body[name] = value;
  }
  const tools = $("p-tools").value.trim();
  if (tools) {
    try { body.tools = JSON.parse(tools); } catch (e) { throw new Error(`tools is not JSON: ${e.message}`); }
  }
  const format = $("p-response-format").value;
  if (format === "json_object") body.response_format = { type: "json_object" };
  if (format === "json_schema") {
    let schema;
    try { schema = JSON.parse($("p-json-schema").value); } catch (e) { throw new Error(`the JSON schema is not JSON: ${e.message}`); }
    body.response_format = { type: "json_schema", json_schema: { name: "playground", schema } };
  }
  return body;
}

function headers() {
  const h = { "Content-Type": "application/json", "X-CSRFToken": csrfToken };
  const key = $("api-key") && $("api-key").value.trim();
  if (key) h.Authorization = `Bearer ${key}`;
  return h;
}

/** One assistant turn's view: reasoning, tool calls and answer apart, then the stats line. */
class Turn {
  constructor() {
    this.node = element("div", "turn assistant");
    this.node.dataset.state = "waiting";
    this.node.append(element("div", "role", "assistant"));
    this.reasoning = element("details", "reasoning");
    this.reasoning.open = true;
    this.reasoning.hidden = true;
    this.reasoning.append(element("summary", "", "reasoning"));
    this.reasoningText = element("pre", "reasoning-text");
    this.reasoning.append(this.reasoningText);
    this.toolCalls = element("div", "tool-calls");
    this.answer = element("div", "answer");
    this.stats = element("div", "stats");
    this.error = element("div", "error");
    this.error.hidden = true;
    this.node.append(this.reasoning, this.toolCalls, this.answer, this.error, this.stats);
    this.calls = []; // {id, name, arguments, node}
    this.content = "";
  }

  reason(text) { this.reasoning.hidden = false; this.reasoningText.textContent += text; }

  say(text) { this.content += text; this.answer.textContent = this.content; }

  call(delta) {
    let call = this.calls[delta.index];
    if (!call) {
      call = { id: delta.id, name: "", arguments: "", node: element("div", "tool-call") };
      call.nameNode = element("code", "name");
      call.argsNode = element("pre", "arguments");
      call.node.append(element("span", "", "tool call "), call.nameNode, call.argsNode);
      this.toolCalls.append(call.node);
      this.calls[delta.index] = call;
    }
    if (delta.id) call.id = delta.id;
    if (delta.function?.name) { call.name += delta.function.name; call.nameNode.textContent = call.name; }
    if (delta.function?.arguments) { call.arguments += delta.function.arguments; call.argsNode.textContent = call.arguments; }
  }

  fail(message) { this.error.hidden = false; this.error.textContent = message; this.node.dataset.state = "error"; }

  finish(summary) {
    this.stats.textContent = summary;
    if (this.node.dataset.state !== "error") this.node.dataset.state = "done";
  }

  message() {
    const msg = { role: "assistant", content: this.content };
    const calls = this.calls.filter(Boolean);
    if (calls.length) {
      msg.tool_calls = calls.map((c) => ({ id: c.id, type: "function", function: { name: c.name, arguments: c.arguments } }));
    }
    return msg;
  }
}

function summary({ usage, ttftMs, totalMs, finishReason }) {
  const parts = [];
  if (finishReason) parts.push(`finish_reason ${finishReason}`);
  if (usage) {
    parts.push(`prompt ${usage.prompt_tokens} tokens`);
    const cached = usage.prompt_tokens_details?.cached_tokens;
    if (cached) parts.push(`${cached} cached`);
    parts.push(`completion ${usage.completion_tokens} tokens`);
    const reasoning = usage.completion_tokens_details?.reasoning_tokens;
    if (reasoning) parts.push(`${reasoning} reasoning`);
  }
  if (ttftMs !== null) parts.push(`TTFT ${Math.round(ttftMs)} ms`);
  parts.push(`total ${(totalMs / 1000).toFixed(2)} s`);
  if (usage && ttftMs !== null && usage.completion_tokens > 1 && totalMs > ttftMs) {
    parts.push(`${((usage.completion_tokens - 1) / ((totalMs - ttftMs) / 1000)).toFixed(1)} tok/s`);
  }
  return parts.join(" · ");
}

async function errorMessage(response) {
  try {
    const body = await response.json();
    return `${response.status}: ${body.error?.message ?? JSON.stringify(body)}`;
  } catch {
    return `${response.status} ${response.statusText}`;
  }
}

async function runTurn(body, turn) {
  const started = performance.now();
  let ttftMs = null, usage = null, finishReason = null;
  running = new AbortController();
  try {
    const response = await fetch("/v1/chat/completions", {
      method: "POST", headers: headers(), body: JSON.stringify(body), signal: running.signal,
      credentials: "same-origin",
    });
    if (!response.ok) { turn.fail(await errorMessage(response)); return; }
    turn.node.dataset.state = "streaming";
    turn.node.dataset.requestId = response.headers.get("x-request-id") || "";
    for await (const data of sseData(response)) {
      if (data === "[DONE]") break;
      const chunk = JSON.parse(data);
      if (chunk.error) { turn.fail(`${chunk.error.code || chunk.error.type}: ${chunk.error.message}`); continue; }
      if (chunk.usage) usage = chunk.usage;
      for (const choice of chunk.choices || []) {
        const delta = choice.delta || {};
        const reasoning = delta.reasoning_content ?? delta.reasoning;
        if (ttftMs === null && (reasoning || delta.content || delta.tool_calls)) ttftMs = performance.now() - started;
        if (reasoning) turn.reason(reasoning);
        if (delta.content) turn.say(delta.content);
        for (const call of delta.tool_calls || []) turn.call(call);
        if (choice.finish_reason) finishReason = choice.finish_reason;
      }
    }
  } catch (e) {
    turn.fail(e.name === "AbortError" ? "stopped" : String(e));
  } finally {
    running = null;
    turn.finish(summary({ usage, ttftMs, totalMs: performance.now() - started, finishReason }));
  }
}

function showUser(role, text) {
  const node = element("div", `turn ${role === "tool" ? "tool" : "user"}`);
  node.append(element("div", "role", role === "tool" ? "tool result" : "user"), element("div", "text", text));
  $("log").append(node);
}

async function send(event) {
  event.preventDefault();
  const text = $("prompt").value;
  if (!text.trim() || running) return;
  $("form-error").hidden = true;
  const role = $("role").value;
  const message = { role, content: text };
  if (role === "tool") {
    const last = [...history].reverse().find((m) => m.tool_calls);
    if (!last) { $("form-error").hidden = false; $("form-error").textContent = "No tool call to answer yet."; return; }
    message.tool_call_id = last.tool_calls[last.tool_calls.length - 1].id;
  }
  history.push(message);
  let body;
  try { body = requestBody(); } catch (e) {
    history.pop();
    $("form-error").hidden = false;
    $("form-error").textContent = e.message;
    return;
  }
  showUser(role, text);
  $("prompt").value = "";
  const turn = new Turn();
  $("log").append(turn.node);
  $("send").disabled = true;
  $("stop").disabled = false;
  await runTurn(body, turn);
  history.push(turn.message());
  $("send").disabled = false;
  $("stop").disabled = true;
}

$("composer").addEventListener("submit", send);
$("prompt").addEventListener("keydown", (e) => {
  if (e.key === "Enter" && (e.ctrlKey || e.metaKey)) $("composer").requestSubmit();
});
$("stop").addEventListener("click", () => running && running.abort());
$("clear").addEventListener("click", () => { if (!running) { history.length = 0; $("log").replaceChildren(); } });
$("p-response-format").addEventListener("change", () => {
  $("p-json-schema").hidden = $("p-response-format").value !== "json_schema";
});
const key = $("api-key");
if (key) {
  key.value = sessionStorage.getItem("metrale.apiKey") || "";
  key.addEventListener("change", () => sessionStorage.setItem("metrale.apiKey", key.value.trim()));
}
