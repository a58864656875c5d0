// The live engine dashboard: renders the snapshots of the websocket /ws/admin/dashboard/ (schema in
// ARCHITECTURE.md, "The live dashboard's websocket") and sends cancel / select. No prompt text ever arrives.

const $ = (id) => document.getElementById(id);
const root = $("dashboard");
const SVG = "http://www.w3.org/2000/svg";
const THROUGHPUT = [["prompt_tokens_per_s", "prompt", "#79aec8"], ["generation_tokens_per_s", "generation", "#417690"]];
const LATENCY = [["ttft_p50_s", "TTFT p50", "#2e7d32"], ["ttft_p99_s", "TTFT p99", "#9ccc65"],
                 ["itl_p50_s", "ITL p50", "#ba2121"], ["itl_p99_s", "ITL p99", "#f0a0a0"]];
let socket = null;
let retryMs = 500;
let watched = null; // the replica selected, sent again after a reconnect

function cell(row, text, title) {
  const td = row.insertCell();
  td.textContent = text;
  if (title) td.title = title;
  return td;
}

const fixed = (v, digits = 1) => (v === null || v === undefined ? "–" : Number(v).toFixed(digits));
const ms = (s) => (s === null || s === undefined ? "–" : `${(s * 1000).toFixed(1)}`);

function send(message) {
  if (socket && socket.readyState === WebSocket.OPEN) socket.send(JSON.stringify(message));
}

function cancelButton(row, request) {
  const td = row.insertCell();
  const button = document.createElement("button");
  button.type = "button";
  button.className = "cancel";
  button.textContent = "Cancel";
  // The HTTP request id ends every choice of that request; a background response has only its engine id.
  const target = request.http_request_id || request.request_id;
  button.addEventListener("click", () => {
    button.disabled = true;
    send({ type: "cancel", request_id: target });
  });
  td.append(button);
}

function requestCells(row, r) {
  row.dataset.requestId = r.request_id;
  row.dataset.httpRequestId = r.http_request_id || "";
  cell(row, r.http_request_id || r.request_id, r.request_id);
  cell(row, r.tenant ?? "–");
  cell(row, r.route ?? "–");
}

function renderRequests(id, requests, running) {
  const body = $(id).tBodies[0];
  body.replaceChildren();
  for (const r of requests) {
    const row = body.insertRow();
    requestCells(row, r);
    if (running) {
      cell(row, r.state);
      cell(row, r.prompt_tokens, r.cached_tokens ? `${r.cached_tokens} from the prefix cache` : "");
      const progress = cell(row, "");
      progress.title = `${r.prefill_tokens_done} / ${r.prompt_tokens}`;
      const bar = document.createElement("span");
      bar.className = "progress";
      bar.append(document.createElement("b"));
      bar.firstChild.style.width = `${Math.round(r.prefill_progress * 100)}%`;
      progress.append(bar);
      cell(row, r.max_tokens ? `${r.generated_tokens} / ${r.max_tokens}` : r.generated_tokens);
      cell(row, fixed(r.tokens_per_s));
    } else {
      cell(row, r.prompt_tokens);
    }
    cell(row, `${fixed(r.age_s)} s`);
    cancelButton(row, r);
  }
  $(`${id}-empty`).hidden = requests.length > 0;
}

function renderTable(id, entries) {
  const body = $(id).tBodies[0];
  body.replaceChildren();
  for (const [name, value] of entries) {
    const row = body.insertRow();
    const th = document.createElement("th");
    th.textContent = name;
    row.append(th);
    cell(row, value === null || value === undefined ? "–" : String(value));
  }
}

/** Every configured model's state and, for each resident chat engine, its KV blocks and requests. */
function renderModels(models, engines) {
  const body = $("models").tBodies[0];
  body.replaceChildren();
  const byId = Object.fromEntries(engines.map((e) => [e.id, e]));
  const mb = (bytes) => (bytes === null || bytes === undefined ? "–" : (bytes / 1e6).toFixed(1));
  for (const m of models) {
    const row = body.insertRow();
    row.dataset.model = m.id;
    row.dataset.state = m.state;
    const engine = byId[m.id];
    cell(row, m.id, m.source);
    cell(row, m.kind);
    cell(row, m.state, m.error || "");
    cell(row, mb(m.resident_bytes));
    cell(row, mb(m.kv_cache_bytes));
    cell(row, engine ? `${engine.kv.blocks_used} / ${engine.kv.blocks_total}` : "–");
    cell(row, engine ? engine.running.length : m.requests_running);
    cell(row, engine ? engine.waiting.length : "–");
    cell(row, m.keep_alive);
    cell(row, m.pinned ? "yes" : "no");
    cell(row, m.idle_s === null || m.idle_s === undefined ? "–" : `${fixed(m.idle_s)} s`);
  }
}

function renderKv(kv) {
  for (const part of ["used", "cached", "free", "total"]) $(`kv-${part}`).textContent = kv[`blocks_${part}`];
  const bar = $("kv-bar");
  for (const part of ["used", "cached", "free"]) {
    bar.querySelector(`.${part}`).style.width = `${(100 * kv[`blocks_${part}`]) / (kv.blocks_total || 1)}%`;
  }
  bar.title = `${(100 * kv.usage).toFixed(1)}% used, ${kv.block_size} tokens per block`;
}

/** Lines of `points[key] * scale` over time on `svg` (nulls break a line), with a legend. */
function renderChart(svg, legend, points, lines, scale) {
  svg.replaceChildren();
  legend.replaceChildren();
  const values = points.flatMap((p) => lines.map(([key]) => p[key])).filter((v) => v !== null && v !== undefined);
  const top = Math.max(...values.map((v) => v * scale), 1e-9);
  const t0 = points.length ? points[0].t : 0;
  const span = points.length > 1 ? points[points.length - 1].t - t0 : 1;
  for (const [key, label, colour] of lines) {
    let run = [];
    const flush = () => {
      if (run.length) {
        const line = document.createElementNS(SVG, "polyline");
        line.setAttribute("points", run.join(" "));
        line.setAttribute("stroke", colour);
        line.dataset.series = key;
        svg.append(line);
      }
      run = [];
    };
    for (const p of points) {
      const v = p[key];
      if (v === null || v === undefined) { flush(); continue; }
      run.push(`${(400 * (p.t - t0)) / (span || 1)},${160 - (150 * v * scale) / top}`);
    }
    if (run.length === 1) run.push(run[0].replace(/^[^,]+/, (x) => String(Number(x) + 2)));
    flush();
    const item = document.createElement("span");
    const swatch = document.createElement("i");
    swatch.style.background = colour;
    item.append(swatch, label);
    legend.append(item);
  }
  const max = document.createElement("span");
  max.textContent = `max ${top.toFixed(top < 10 ? 2 : 0)}`;
  legend.append(max);
}

function renderReplicas(current, replicas) {
  const select = $("replica");
  const ids = [...select.options].map((o) => o.value);
  if (ids.join() !== replicas.join()) {
    select.replaceChildren(...replicas.map((id) => new Option(id, id)));
  }
  select.value = current;
}

function render(snapshot) {
  root.dataset.replica = snapshot.replica;
  renderReplicas(snapshot.replica, snapshot.replicas || [snapshot.replica]);
  renderModels(snapshot.models || [], snapshot.engines || []);
  renderRequests("running", snapshot.running || [], true);
  renderRequests("waiting", snapshot.waiting || [], false);
  if (snapshot.kv) renderKv(snapshot.kv);
  const model = snapshot.model || {};
  renderTable("model", Object.entries(model));
  renderTable("engine", Object.entries(snapshot.engine || {}));
  const series = snapshot.series || { points: [] };
  renderChart($("chart-throughput"), $("legend-throughput"), series.points || [], THROUGHPUT, 1);
  renderChart($("chart-latency"), $("legend-latency"), series.points || [], LATENCY, 1000);
  const w = series.window || {};
  renderTable("window", [
    [`last ${series.window_s ?? "–"} s: prompt tok/s`, fixed(w.prompt_tokens_per_s)],
    ["generation tok/s", fixed(w.generation_tokens_per_s)], ["requests finished", w.requests_finished],
    ["TTFT p50 / p99 (ms)", `${ms(w.ttft_p50_s)} / ${ms(w.ttft_p99_s)}`],
    ["ITL p50 / p99 (ms)", `${ms(w.itl_p50_s)} / ${ms(w.itl_p99_s)}`],
  ]);
  $("updated").textContent = `updated ${new Date((snapshot.time || Date.now() / 1000) * 1000).toLocaleTimeString()}`;
}

function notice(text) { $("notice").textContent = text; }

function connect() {
  const scheme = location.protocol === "https:" ? "wss" : "ws";
  socket = new WebSocket(`${scheme}://${location.host}${root.dataset.websocketPath}`);
  $("connection").dataset.state = "connecting";
  socket.addEventListener("open", () => {
    retryMs = 500;
    $("connection").dataset.state = "open";
    $("connection").textContent = "live";
    if (watched) send({ type: "select", replica: watched });
  });
  socket.addEventListener("message", (event) => {
    const message = JSON.parse(event.data);
    if (message.type === "snapshot") render(message);
    else if (message.type === "cancel_result") {
      notice(message.cancelled ? `cancelled ${message.request_id}` : `${message.request_id} was not running`);
    } else if (message.type === "error") notice(message.message);
  });
  socket.addEventListener("close", (event) => {
    $("connection").dataset.state = "closed";
    if (event.code === 4403) { $("connection").textContent = "refused: staff only"; return; }
    $("connection").textContent = "disconnected, reconnecting…";
    setTimeout(connect, retryMs);
    retryMs = Math.min(retryMs * 2, 10_000);
  });
}

$("replica").addEventListener("change", (event) => {
  watched = event.target.value;
  send({ type: "select", replica: watched });
});
connect();
