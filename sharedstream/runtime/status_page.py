"""The status page the operations endpoint serves at ``/``: HTML, CSS and script, no assets.

The page is static; its script asks ``/status`` (the same JSON as
``sharedstream status --json``) every :data:`REFRESH_SECONDS` seconds and
redraws streams, lanes and lag, watchers with their counts and last error,
recent dead letters, where DAG runs wait per target (dispatch) and recent
DAG runs. Nothing is fetched from anywhere else
(the endpoint's Content-Security-Policy allows only itself), and every
value is written as text (``textContent``), never as markup, so a reject
reason or an error message cannot inject anything.

Laid out for a laptop screen (about 1280 px wide): the header and the
totals on top, then one table per part, numbers right-aligned, long texts
cut with an ellipsis and shown whole on hover.

Times are written as the CLI writes them
(:func:`~sharedstream.runtime.cli_output.time_text`:
``2026-11-28 12:42:44 UTC``), the moment of the last refresh included:
never in the browser's zone or 12-hour clock. The script's ``when`` is
that format in JavaScript (the page runs in the browser, so it cannot call
the Python one); ``tests/ops/test_status_page.py`` checks the two agree.
"""

from __future__ import annotations

__all__ = ["CSP", "PAGE", "REFRESH_SECONDS", "SCRIPT", "STYLE"]

REFRESH_SECONDS = 2
"""How often the page asks for a new status."""

CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; "
       "img-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'")
"""The page's Content-Security-Policy: its own script, style and ``/status``, nothing else."""

PAGE = """<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>sharedstream triggerer</title>
<link rel="stylesheet" href="/status.css">
<script src="/status.js" defer></script>
</head>
<body>
<header>
  <h1>sharedstream triggerer <span id="triggerer"></span></h1>
  <div id="state"><span id="ready" class="badge">loading</span>
    <span id="intake"></span> <span id="updated"></span></div>
</header>
<section id="totals" class="cards"></section>
<p id="problem" hidden></p>
<h2>Streams</h2>
<table id="streams"><thead><tr><th>stream</th><th>poll</th><th>broker</th>
<th class="n">outstanding</th><th class="n">oldest unresolved (s)</th><th>lanes (outstanding)</th>
<th title="what the broker itself holds for the stream (Kafka lag, queue depths), polled every
[api] backlog_interval">broker backlog</th></tr></thead><tbody></tbody></table>
<h2>Watchers</h2>
<table id="watchers"><thead><tr><th>watchers</th><th>trigger</th><th>state</th>
<th class="n">lag</th><th class="n">seen</th><th class="n" title="declined by the watcher's
prefilter: never given to its filter">skipped</th><th class="n">emitted</th>
<th class="n">rejected</th><th class="n">failed</th><th class="n">stored</th>
<th class="n">errors</th>
<th>last reject / last error</th></tr></thead><tbody></tbody></table>
<h2>Recent dead letters</h2>
<table id="dead_letters"><thead><tr><th>id</th><th>at</th><th>stream</th><th>source</th>
<th>reason</th><th class="n">bytes</th></tr></thead><tbody></tbody></table>
<h2>Dispatch</h2>
<table id="dispatch"><thead><tr><th>target</th><th class="n">delivering</th>
<th class="n" title="runs waiting for the target">queued</th>
<th class="n" title="deliveries under way, or to recover">dispatching</th>
<th class="n" title="dispatched or running at the target">at target</th>
<th class="n">dispatched</th><th class="n">succeeded</th><th class="n">failed</th>
<th class="n">retried</th><th class="n">undeliverable</th><th>last error</th>
</tr></thead><tbody></tbody></table>
<h2>Replays</h2>
<table id="replays"><thead><tr><th>id</th><th>watcher</th><th>state</th>
<th class="n">done</th><th class="n">of</th><th class="n">%</th>
<th class="n" title="new trigger events it stored">new events</th>
<th class="n" title="events the watcher had stored already">already stored</th>
<th class="n">per s</th><th>error</th></tr></thead><tbody></tbody></table>
<h2>Recent DAG runs</h2>
<table id="dag_runs"><thead><tr><th>DAG</th><th>run id</th><th>state</th><th>type</th>
<th>at</th><th>target</th><th class="n">attempts</th><th>assets</th><th>last error</th>
</tr></thead><tbody></tbody></table>
<footer>Refreshes every {refresh} s from <a href="/status">/status</a> ·
<a href="/metrics">/metrics</a> · <a href="/readyz">/readyz</a></footer>
</body>
</html>
""".replace("{refresh}", str(REFRESH_SECONDS))

STYLE = """
:root { --fg: #1d232a; --muted: #5b6670; --line: #d9dee3; --ok: #1f7a3a; --bad: #b3261e;
        --warn: #9a6700; --bg: #ffffff; --head: #f3f5f7; }
* { box-sizing: border-box; }
body { margin: 0 auto; max-width: 1400px; padding: 16px 24px 32px; color: var(--fg);
       background: var(--bg); font: 14px/1.4 system-ui, -apple-system, "Segoe UI", sans-serif; }
header { display: flex; justify-content: space-between; align-items: baseline; gap: 16px;
         flex-wrap: wrap; border-bottom: 1px solid var(--line); padding-bottom: 8px; }
h1 { font-size: 20px; margin: 0; } h1 span { color: var(--muted); font-weight: normal;
     font-size: 14px; }
h2 { font-size: 15px; margin: 20px 0 6px; }
.badge { display: inline-block; padding: 2px 10px; border-radius: 10px; font-weight: 600;
         background: var(--head); }
.badge.ok { background: #dcf1e2; color: var(--ok); } .badge.bad { background: #fbe0de;
  color: var(--bad); }
#intake, #updated { color: var(--muted); margin-left: 8px; }
.cards { display: grid; grid-template-columns: repeat(auto-fill, minmax(150px, 1fr)); gap: 8px;
         margin-top: 12px; }
.card { border: 1px solid var(--line); border-radius: 6px; padding: 6px 10px; }
.card b { display: block; font-size: 20px; font-variant-numeric: tabular-nums; }
.card span { color: var(--muted); font-size: 12px; }
.card.bad b { color: var(--bad); }
table { width: 100%; border-collapse: collapse; table-layout: auto; }
th, td { text-align: left; padding: 4px 8px; border-bottom: 1px solid var(--line);
         white-space: nowrap; max-width: 420px; overflow: hidden; text-overflow: ellipsis; }
th { background: var(--head); font-weight: 600; font-size: 12px; color: var(--muted); }
.n { text-align: right; font-variant-numeric: tabular-nums; }
td.bad { color: var(--bad); font-weight: 600; } td.warn { color: var(--warn); }
td.empty { color: var(--muted); font-style: italic; }
#problem { color: var(--bad); font-weight: 600; }
footer { margin-top: 24px; color: var(--muted); font-size: 12px; }
a { color: inherit; }
"""

SCRIPT = """
"use strict";
const REFRESH_MS = {refresh} * 1000;
const TOTALS = [["events_stored", "events stored"], ["dag_runs_queued", "DAG runs queued"],
  ["duplicates", "duplicates"], ["rejected", "raw events rejected"],
  ["dead_lettered", "dead-lettered"], ["dead_letter_fallbacks", "kept in store DLQ"],
  ["failed", "raw events failed"], ["restarts", "trigger restarts"],
  ["store_queue", "store queue"], ["store_write_retries", "store write retries"]];
const BAD_WHEN_POSITIVE = new Set(["rejected", "dead_lettered", "dead_letter_fallbacks",
  "failed", "restarts", "store_write_retries"]);

// The one time format (sharedstream.runtime.cli_output.time_text): "2026-11-28 12:42:44 UTC",
// in UTC, to the second (cut, not rounded). ISO text keeps at most milliseconds for Date.
function when(value) {
  if (value === null || value === undefined || value === "") return value;
  const date = value instanceof Date ? value
    : new Date(String(value).replace(/(\\.\\d{3})\\d+/, "$1"));
  if (isNaN(date.getTime())) return value;
  return date.toISOString().slice(0, 19).replace("T", " ") + " UTC";
}

function text(value) {
  if (value === null || value === undefined || value === "") return "-";
  if (Array.isArray(value)) return value.length ? value.join(", ") : "-";
  return String(value);
}

function cell(row, value, cls) {
  const td = document.createElement("td");
  td.textContent = text(value);
  td.title = td.textContent;
  if (cls) td.className = cls;
  row.appendChild(td);
  return td;
}

function fill(id, rows, columns, empty) {
  const body = document.querySelector("#" + id + " tbody");
  const fresh = document.createElement("tbody");
  if (!rows.length) {
    const tr = document.createElement("tr");
    const td = cell(tr, empty, "empty");
    td.colSpan = document.querySelectorAll("#" + id + " th").length;
    fresh.appendChild(tr);
  }
  for (const item of rows) {
    const tr = document.createElement("tr");
    for (const [key, cls] of columns) {
      const value = typeof key === "function" ? key(item) : item[key];
      const extra = typeof cls === "function" ? cls(item) : cls;
      cell(tr, value, extra);
    }
    fresh.appendChild(tr);
  }
  body.replaceWith(fresh);
}

function watchers(status) {
  const stored = new Map(status.watchers.map((w) => [w.trigger, w]));
  const rows = [];
  const seen = new Set();
  for (const stream of status.streams) {
    for (const live of stream.watchers) {
      const row = Object.assign({}, stored.get(live.trigger) || {}, live);
      row.stream = stream.stream;
      rows.push(row);
      seen.add(live.trigger);
    }
  }
  for (const w of status.watchers) if (!seen.has(w.trigger)) rows.push(w);
  return rows;
}

function backlog(stream) {
  const b = stream.broker_backlog;
  if (!b) return "-";
  if (b.state !== "ok") return b.state + (b.detail ? " (" + b.detail + ")" : "");
  return b.lanes.map((l) => l.lane + ": " + Object.entries(l)
    .filter(([kind]) => kind !== "lane").map(([kind, n]) => kind + " " + n).join(" "));
}

function backlogClass(b) {
  return b && b.state === "unknown" ? "warn" : "";
}

function render(status) {
  document.getElementById("triggerer").textContent =
    status.triggerer.id + " · " + status.triggerer.store;
  const failed = Object.entries(status.ready || {}).filter(([, c]) => !c.ok);
  const ready = document.getElementById("ready");
  ready.textContent = failed.length ? "not ready" : "ready";
  ready.className = "badge " + (failed.length ? "bad" : "ok");
  ready.title = failed.map(([name, c]) => name + ": " + c.detail).join("; ");
  const intake = status.triggerer.intake;
  document.getElementById("intake").textContent =
    "intake " + (Array.isArray(intake) ? "held: " + intake.join(", ") : intake) +
    " · " + status.triggerer.triggers_running + " triggers running";
  const problem = document.getElementById("problem");
  const notes = failed.map(([name, c]) => name + ": " + c.detail).concat(
    Object.entries(status.errors || {}).map(([part, e]) => part + " not read: " + e));
  problem.hidden = !notes.length;
  problem.textContent = notes.join(" · ");
  const cards = document.getElementById("totals");
  cards.replaceChildren(...TOTALS.map(([key, label]) => {
    const card = document.createElement("div");
    const value = status.totals[key];
    card.className = "card" + (BAD_WHEN_POSITIVE.has(key) && value > 0 ? " bad" : "");
    card.id = "total-" + key;
    const b = document.createElement("b");
    b.textContent = text(value);
    const span = document.createElement("span");
    span.textContent = label;
    card.append(b, span);
    return card;
  }));
  fill("streams", status.streams, [
    ["stream"],
    [(s) => !s.live ? "restarting" : s.connected === false ? "disconnected" : "polling",
     (s) => !s.live || s.connected === false ? "bad" : ""],
    ["broker"], ["outstanding", "n"],
    [(s) => s.oldest_unresolved_age.toFixed(1), "n"],
    [(s) => s.lanes.map((l) => l.lane + ": " + l.outstanding)],
    [backlog, (s) => backlogClass(s.broker_backlog)],
  ], "no stream is running");
  fill("watchers", watchers(status), [
    [(w) => w.names], ["trigger"], ["state"],
    ["queued", (w) => "n" + (w.queued > 0 ? " warn" : "")],
    ["seen", "n"], ["skipped", "n"], ["emitted", "n"],
    ["rejected", (w) => "n" + (w.rejected > 0 ? " warn" : "")],
    ["failed", (w) => "n" + (w.failed > 0 ? " bad" : "")],
    ["events_stored", "n"], ["errors", (w) => "n" + (w.errors > 0 ? " bad" : "")],
    [(w) => w.last_error || w.last_reject],
  ], "no watcher");
  fill("dead_letters", status.dead_letters, [["id", "n"], [(d) => when(d.at)], ["stream"],
    ["source"], ["reason"], ["size", "n"]], "no dead letter kept in the store");
  fill("dispatch", status.dispatch || [], [
    [(t) => t.target || "(no target)"],
    [(t) => t.capacity ? t.delivering + "/" + t.capacity : "-", "n"],
    ["queued", (t) => "n" + (t.queued > 0 && t.failing ? " bad" : "")],
    ["dispatching", "n"], ["at_target", "n"], ["dispatched", "n"], ["succeeded", "n"],
    ["failed", (t) => "n" + (t.failed > 0 ? " warn" : "")], ["retried", "n"],
    ["undeliverable", (t) => "n" + (t.undeliverable > 0 ? " bad" : "")],
    ["last_error", (t) => t.failing ? "bad" : ""],
  ], "this triggerer dispatches no run");
  fill("replays", status.replays || [], [["id", "n"], ["watcher"],
    ["state", (r) => r.state === "failed" ? "bad" : ""], ["done", "n"], ["total", "n"],
    ["percent", "n"], ["new_events", "n"], ["already_stored", "n"],
    [(r) => r.rate === undefined ? "-" : r.rate, "n"], ["error"]],
    "no replay (sharedstream watchers replay)");
  fill("dag_runs", status.dag_runs, [["dag"], ["run_id"],
    ["state", (r) => r.state === "failed" || r.state === "undeliverable" ? "bad" : ""],
    ["type"], [(r) => when(r.at)], ["target"], ["attempts", "n"], ["assets"], ["last_error"]],
    "no DAG run yet");
  document.getElementById("updated").textContent =
    "updated " + when(new Date());
  document.body.dataset.loaded = "yes";
}

async function refresh() {
  try {
    const answer = await fetch("/status", {cache: "no-store"});
    if (!answer.ok) throw new Error("HTTP " + answer.status);
    render(await answer.json());
  } catch (error) {
    const problem = document.getElementById("problem");
    problem.hidden = false;
    problem.textContent = "cannot read /status: " + error.message;
    const ready = document.getElementById("ready");
    ready.textContent = "unreachable";
    ready.className = "badge bad";
  }
  setTimeout(refresh, REFRESH_MS);
}

refresh();
""".replace("{refresh}", str(REFRESH_SECONDS))
