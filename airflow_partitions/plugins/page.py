"""The Partitions page itself: one HTML document with its script, no build step, served by the plugin.

It reads and writes only through the plugin's JSON API (relative URLs, so it works under any base path)
with the browser's Airflow session; every value is inserted as text, never as HTML.
"""

from __future__ import annotations

PAGE_HTML = r"""<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>Partitions</title>
<style>
  :root { color-scheme: light; --fg: #1f2933; --bg: #ffffff; --muted: #616e7c; --line: #e4e7eb;
          --head: #f5f7fa; --accent: #0b69a3; --warn-bg: #fffaeb; --warn-fg: #93370d; --err: #b42318; }
  :root.dark { color-scheme: dark; --fg: #e4e7eb; --bg: #111827; --muted: #9aa5b1; --line: #323f4b;
               --head: #1f2933; --accent: #60a5fa; --warn-bg: #3b2a05; --warn-fg: #fcd34d; --err: #fca5a5; }
  html, body { background: var(--bg); color: var(--fg); }
  body { font-family: system-ui, -apple-system, "Segoe UI", sans-serif; margin: 0; padding: 12px 16px;
         font-size: 14px; box-sizing: border-box; }
  h1 { font-size: 20px; margin: 0 0 12px; }
  .bar { display: flex; gap: 8px; align-items: center; flex-wrap: wrap; margin-bottom: 10px; }
  select, input[type=search] { padding: 5px 8px; border: 1px solid var(--line); border-radius: 4px;
                               background: var(--bg); color: var(--fg); }
  input[type=search] { min-width: 260px; }
  button { padding: 6px 12px; border-radius: 4px; border: 1px solid var(--accent); background: var(--accent);
           color: white; cursor: pointer; }
  button.secondary { background: transparent; color: var(--accent); }
  button:disabled { opacity: .5; cursor: not-allowed; }
  .table-wrap { overflow-x: auto; }
  table { border-collapse: collapse; width: 100%; }
  th, td { text-align: left; padding: 5px 8px; border-bottom: 1px solid var(--line); vertical-align: top; }
  th { background: var(--head); font-weight: 600; }
  th.sortable { cursor: pointer; user-select: none; }
  th[aria-sort=ascending]::after { content: " \25B2"; }
  th[aria-sort=descending]::after { content: " \25BC"; }
  td.num { text-align: right; font-variant-numeric: tabular-nums; }
  .badge { display: inline-block; padding: 1px 8px; border-radius: 10px; font-size: 12px; font-weight: 600;
           border: 2px solid transparent; }
  button.badge { cursor: pointer; }
  .badge.active { border-color: var(--fg); }
  .state-fresh { background: #d1fadf; color: #05603a; }
  .state-stale { background: #fef0c7; color: #93370d; }
  .state-failed { background: #fee4e2; color: #912018; }
  .state-refreshing { background: #d1e9ff; color: #194185; }
  .state-waiting { background: #e0eaff; color: #2d31a6; }
  .state-missing { background: #f2f4f7; color: #344054; }
  .state-removed { background: #e4e7ec; color: #475467; text-decoration: line-through; }
  .state-unknown { background: #f2f4f7; color: #667085; }
  .summary span { margin-right: 6px; }
  .muted { color: var(--muted); }
  .error { color: var(--err); white-space: pre-wrap; overflow-wrap: anywhere; }
  .banner { background: var(--warn-bg); color: var(--warn-fg); border: 1px solid var(--warn-fg);
            border-radius: 4px; padding: 8px 10px; margin: 6px 0; }
  .banner:empty { display: none; }
  #message { min-height: 20px; margin: 6px 0; }
  td.key { font-family: ui-monospace, monospace; overflow-wrap: anywhere; min-width: 8em; }
  td.time { white-space: nowrap; }
  td.error details summary { cursor: pointer; }
  td.error pre { white-space: pre-wrap; overflow-wrap: anywhere; margin: 4px 0; font-size: 12px; }
  #pager { gap: 6px; }
  dialog { background: var(--bg); color: var(--fg); border: 1px solid var(--line); border-radius: 6px;
           max-width: min(640px, 90vw); }
  dialog ul { max-height: 40vh; overflow: auto; font-family: ui-monospace, monospace; }
  a { color: var(--accent); }
  #overview-box { margin: 4px 0 10px; }
  #overview { display: block; cursor: crosshair; max-width: 100%; user-select: none; }
  #overview-axes { font-size: 12px; }
  #detail-chart { display: block; margin: 4px 0 8px; }
  #detail-chart polyline { fill: none; stroke: var(--accent); stroke-width: 1.5; }
  #detail-chart circle { fill: var(--accent); }
  #detail-chart text { fill: var(--muted); font-size: 10px; }
</style>
</head>
<body>
<h1>Partitions</h1>
<div class="bar">
  <label for="dataset">Dataset</label> <select id="dataset"></select>
  <span id="version" class="muted"></span>
</div>
<div id="paused" class="banner"></div>
<div id="blocked" class="banner"></div>
<div id="sla"></div>
<div id="layout-warning" class="banner"></div>
<div class="bar summary" id="summary"></div>
<div id="overview-box">
  <canvas id="overview" role="img" aria-label="every partition, coloured by state"></canvas>
  <div id="overview-axes" class="muted"></div></div>
<div class="bar">
  <input type="search" id="filter"
         placeholder="Filter: region=EU/day=2026-01-01, region=EU, day=..., EU|2026-01-01">
  <button id="refresh-selected" disabled>Refresh selected</button>
  <button id="refresh-needed" class="secondary">Refresh everything failed, stale or missing</button>
  <button id="reload" class="secondary">Reload</button>
</div>
<div id="permission" class="muted"></div>
<div id="message"></div>
<div id="warning" class="error"></div>
<div class="table-wrap">
<table>
  <thead><tr>
    <th><input type="checkbox" id="select-all"
               title="Select every partition the filter shows (all pages)"></th>
    <th class="sortable" data-sort="state">State</th><th class="sortable" data-sort="key">Partition</th>
    <th class="sortable" data-sort="rows">Rows</th><th class="sortable" data-sort="bytes">Bytes</th>
    <th class="sortable" data-sort="refreshed_at">Last refresh</th>
    <th>Written by</th><th>Last error</th>
  </tr></thead>
  <tbody id="rows"></tbody>
</table>
</div>
<div class="bar" id="pager">
  <button id="page-prev" class="secondary">&larr; Previous</button>
  <span id="page-info" class="muted"></span>
  <button id="page-next" class="secondary">Next &rarr;</button>
</div>
<dialog id="detail">
  <form method="dialog">
    <h2 id="detail-title" style="font-size:16px;margin:0 0 8px;font-family:ui-monospace,monospace"></h2>
    <p id="detail-state"></p>
    <p id="detail-why" class="muted"></p>
    <svg id="detail-chart" role="img" aria-label="rows of each written version, oldest first" hidden></svg>
    <div class="table-wrap"><table>
      <thead><tr><th>Version</th><th>Committed</th><th>Change</th><th>Rows</th><th>Bytes</th>
        <th>Written by</th></tr></thead>
      <tbody id="detail-history"></tbody>
    </table></div>
    <div class="bar" style="margin-top:12px"><button id="detail-close" value="close">Close</button></div>
  </form>
</dialog>
<dialog id="preview">
  <form method="dialog">
    <h2 id="preview-title" style="font-size:16px;margin:0 0 8px"></h2>
    <ul id="preview-list"></ul>
    <p id="preview-more" class="muted"></p>
    <label id="preview-unpause-label" hidden><input type="checkbox" id="preview-unpause" checked>
      Unpause the DAG: it is paused, so the run would stay queued</label>
    <div class="bar" style="margin-top:12px">
      <button id="preview-confirm" value="confirm">Trigger</button>
      <button id="preview-cancel" value="cancel" class="secondary">Cancel</button>
    </div>
  </form>
</dialog>
<script>
"use strict";
const PAGE_SIZE = 100;
const STATE_LABELS = {waiting: "refreshed, waiting for commit"};
const STATE_ORDER = ["failed", "refreshing", "waiting", "stale", "missing", "unknown", "fresh", "removed"];
const query = new URLSearchParams(window.location.search);
let dagId = query.get("dag_id");
let documentData = null;
let pollTimer = null;
let runsTimer = null;
let lastRunsSignature = null;
const followed = new Map();  // run id -> last state seen, for runs the page follows to their end
let page = Number(query.get("page") || 0);
let sortKey = query.get("sort") || "key";
let sortDescending = query.get("desc") === "1";
const stateFilter = new Set((query.get("states") || "").split(",").filter(Boolean));
const selected = new Set();
const $ = (id) => document.getElementById(id);
const collator = new Intl.Collator(undefined, {numeric: true, sensitivity: "base"});
$("filter").value = query.get("filter") || "";

// Airflow's color mode (its <html> carries class "dark"), else the system's.
function followColorMode() {
  let dark = window.matchMedia && window.matchMedia("(prefers-color-scheme: dark)").matches;
  try {
    const root = window.parent !== window ? window.parent.document.documentElement : null;
    if (root) {
      dark = root.classList.contains("dark") || root.style.colorScheme === "dark";
      if (!followColorMode.observing) {
        new MutationObserver(followColorMode).observe(root, {attributes: true});
        followColorMode.observing = true;
      }
    }
  } catch (err) { /* not Airflow's frame: the system's preference decides */ }
  document.documentElement.classList.toggle("dark", dark);
}
followColorMode();
if (window.matchMedia) {
  window.matchMedia("(prefers-color-scheme: dark)").addEventListener("change", followColorMode);
}

async function api(path, options) {
  const response = await fetch(path, Object.assign(
    {credentials: "same-origin", headers: {"Content-Type": "application/json"}}, options || {}));
  let body = {};
  try { body = await response.json(); } catch (err) { body = {}; }
  if (!response.ok) {
    const detail = typeof body.detail === "string" ? body.detail : JSON.stringify(body.detail || "");
    if (response.status === 401) throw new Error("Sign in to Airflow first (" + detail + ")");
    if (response.status === 403) {
      throw new Error("You may not do this on " + (dagId || "this DAG") + ": triggering a refresh needs "
        + "permission to create its DAG runs (Airflow's User, Op or Admin role).");
    }
    throw new Error(detail || ("HTTP " + response.status));
  }
  return body;
}

function el(tag, attrs, text) {
  const node = document.createElement(tag);
  for (const [name, value] of Object.entries(attrs || {})) node.setAttribute(name, value);
  if (text !== undefined && text !== null) node.textContent = String(text);
  return node;
}

function formatBytes(size) {
  if (size === null || size === undefined) return "-";
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let value = size, unit = 0;
  while (value >= 1024 && unit < units.length - 1) { value /= 1024; unit += 1; }
  return unit === 0 ? value + " B" : value.toFixed(1) + " " + units[unit];
}

function formatTime(text) {
  if (!text) return "-";
  return text.replace("T", " ").replace(/\.\d+/, "").replace(/(\+00:00|Z)$/, " UTC");
}

// Inside Airflow the page is a sandboxed iframe (scripts and same origin, no top navigation): a link
// navigates Airflow's own router (history entry + popstate), which the sandbox allows; outside
// Airflow it is an ordinary link.
function openInAirflow(event) {
  let top = null;
  try { top = window.parent !== window ? window.parent : null; void (top && top.location.href); }
  catch (err) { top = null; }
  if (!top || event.button !== 0 || event.ctrlKey || event.metaKey || event.shiftKey) return;
  event.preventDefault();
  const href = event.currentTarget.getAttribute("href");
  top.history.pushState(null, "", href);
  top.dispatchEvent(new top.PopStateEvent("popstate", {state: null}));
}

function uiLink(path, text) {
  const link = el("a", {href: path, class: "airflow-link"}, text);
  link.addEventListener("click", openInAirflow);
  return link;
}

function writerCell(partition) {
  const cell = el("td");
  const writer = partition.written_by;
  if (!writer) { cell.textContent = "-"; return cell; }
  const base = "/dags/" + encodeURIComponent(writer.dag_id) + "/runs/" + encodeURIComponent(writer.run_id);
  cell.appendChild(uiLink(base, writer.run_id));
  cell.appendChild(document.createTextNode(" / "));
  let task = base + "/tasks/" + encodeURIComponent(writer.task_id);
  if (writer.map_index >= 0) task += "/mapped/" + writer.map_index;
  cell.appendChild(uiLink(task, "task"));
  return cell;
}

function errorCell(partition) {
  const cell = el("td", {class: "error"});
  const failure = partition.failure;
  if (!failure) return cell;
  // The whole error: its first line as the summary (never cut), the rest on demand.
  const lines = failure.error.split("\n");
  if (lines.length > 1) {
    const details = el("details");
    details.appendChild(el("summary", {}, lines[0]));
    details.appendChild(el("pre", {}, lines.slice(1).join("\n")));
    cell.appendChild(details);
  } else {
    cell.appendChild(el("span", {}, failure.error));
  }
  if (failure.dag_id && failure.run_id) {
    cell.appendChild(document.createElement("br"));
    const base = "/dags/" + encodeURIComponent(failure.dag_id)
      + "/runs/" + encodeURIComponent(failure.run_id);
    let task = base + "/tasks/" + encodeURIComponent(failure.task_id || "");
    if (failure.map_index !== null && failure.map_index >= 0) task += "/mapped/" + failure.map_index;
    cell.appendChild(uiLink(task, "failed task, " + formatTime(failure.failed_at)));
  }
  return cell;
}

// Every spelling of a key: the label (`region=EU/day=1`, what the page shows), the comma form of logs
// (`region=EU, day=1`) and Airflow's composite key (`EU|1`); the filter may use any of them.
function decode(text) { try { return decodeURIComponent(text); } catch (err) { return text; } }
function spellings(partition) {
  if (partition._spellings) return partition._spellings;
  const pairs = partition.key_path.split("/").map((part) => {
    const at = part.indexOf("=");
    return [decode(part.slice(0, at)), decode(part.slice(at + 1))];
  });
  const label = partition.key.toLowerCase();
  partition._spellings = [
    label, decode(label),
    pairs.map(([name, value]) => name + "=" + value).join(", ").toLowerCase(),
    pairs.map(([name, value]) => value).join("|").toLowerCase(),
  ];
  return partition._spellings;
}

function normalisedFilter() {
  return $("filter").value.trim().toLowerCase().replace(/,\s*(?=[^,=\s]+=)/g, "/");
}

function matchesFilter(partition) {
  if (stateFilter.size && !stateFilter.has(partition.state)) return false;
  const text = normalisedFilter();
  if (!text) return true;
  if (STATE_ORDER.includes(text)) return partition.state === text;
  const raw = $("filter").value.trim().toLowerCase();
  return spellings(partition).some((s) => s.includes(text) || s.includes(raw)
    || s.replace(/, /g, "/").includes(text));
}

function compare(a, b) {
  let order;
  if (sortKey === "state") order = STATE_ORDER.indexOf(a.state) - STATE_ORDER.indexOf(b.state);
  else if (sortKey === "rows" || sortKey === "bytes") order = (a[sortKey] ?? -1) - (b[sortKey] ?? -1);
  else if (sortKey === "refreshed_at") {
    order = String(a.refreshed_at || "").localeCompare(String(b.refreshed_at || ""));
  }
  else order = 0;
  if (order === 0) order = collator.compare(a.key, b.key);
  return sortDescending ? -order : order;
}

function shownPartitions() {
  if (!documentData) return [];
  return (documentData.datasets[0].partitions || []).filter(matchesFilter).sort(compare);
}

function keepInUrl() {
  const params = new URLSearchParams();
  if (dagId) params.set("dag_id", dagId);
  if ($("filter").value.trim()) params.set("filter", $("filter").value.trim());
  if (stateFilter.size) params.set("states", Array.from(stateFilter).join(","));
  if (sortKey !== "key") params.set("sort", sortKey);
  if (sortDescending) params.set("desc", "1");
  if (page) params.set("page", String(page));
  history.replaceState(null, "", "?" + params.toString());
}

function renderSummary(report) {
  const summary = $("summary");
  summary.replaceChildren();
  const states = Object.entries(report.states || {}).filter(([, count]) => count)
    .sort(([a], [b]) => STATE_ORDER.indexOf(a) - STATE_ORDER.indexOf(b));
  for (const [state, count] of states) {
    const badge = el("button", {class: "badge state-" + state + (stateFilter.has(state) ? " active" : ""),
      "data-state-count": state, "aria-pressed": String(stateFilter.has(state)),
      title: "Show only " + (STATE_LABELS[state] || state) + " partitions (click more to combine)"},
      count + " " + (STATE_LABELS[state] || state));
    badge.addEventListener("click", () => {
      if (stateFilter.has(state)) stateFilter.delete(state); else stateFilter.add(state);
      page = 0; render();
    });
    summary.appendChild(badge);
  }
  const verified = report.last_verify;
  if (verified) {
    summary.appendChild(el("span", {class: "badge", "data-last-verify": verified.result},
      "verified " + verified.result + " at " + formatTime(verified.verified_at)
      + " (version " + verified.version + ")"));
  }
  const moving = report.repartition;
  if (moving && moving.in_progress) {
    summary.appendChild(el("span", {class: "badge", "data-repartition-left": String(moving.partitions_left),
      title: "Partitions written under an older partition_by; `airflow-partitions repartition` moves them"},
      "re-partitioning: " + moving.partitions_left + " partition(s), " + moving.rows_left
      + " rows left"));
  }

  if (report.cdc) summary.appendChild(cdcBadge(report.cdc));
}

// Change data capture: the replication slot, its lag and the WAL the server keeps for it (`cdc status`).
function cdcBadge(cdc) {
  const slot = cdc.slot;
  const text = cdc.error ? "change capture: " + cdc.error
    : !slot ? "no replication slot " + cdc.slot_name + (cdc.committed_lsn ? " (lost: refresh --full)" : "")
    : "slot " + slot.slot + ": lag " + formatBytes(slot.lag_bytes) + ", retains "
      + formatBytes(slot.retained_wal_bytes) + " of WAL";
  return el("span", {class: "badge" + (cdc.error || !slot ? " state-failed" : ""), "data-cdc-slot":
    cdc.slot_name || "", title: "acceleration at WAL position " + (cdc.committed_lsn || "none")}, text);
}

function renderBlocked(report) {
  const counts = report.states || {};
  const failed = counts.failed || 0;
  const waiting = (counts.missing || 0) + (counts.stale || 0);
  $("blocked").textContent = failed && waiting
    ? failed + " partition(s) failed. A run publishes its partitions together in its commit, so "
      + waiting + " missing or stale partition(s) wait for them: fix the cause shown under Last error, "
      + "then refresh the failed ones (or everything failed, stale or missing)."
    : "";
}

// The dataset's freshness SLA (`freshness: 2h` in the spec), when it declares one.
function renderFreshness(report) {
  const sla = $("sla");
  const freshness = report.freshness;
  sla.className = freshness && !freshness.met ? "banner" : "muted";
  if (!freshness) { sla.textContent = ""; return; }
  const hours = freshness.sla_seconds / 3600;
  const duration = hours >= 1 ? hours + "h" : Math.round(freshness.sla_seconds / 60) + "m";
  sla.textContent = freshness.met ? "Freshness SLA " + duration + ": met by every partition."
    : freshness.overdue + " partition(s) miss the freshness SLA of " + duration + " (last refreshed longer "
      + "ago), oldest first: " + freshness.overdue_partitions.join(", ");
}

// The advisor's findings over the catalog: skewed partitions and tiny files (`airflow-partitions advise`).
function renderLayout(report) {
  const layout = report.layout;
  const parts = [];
  if (layout && layout.skewed_count) {
    parts.push(layout.skewed_count + " partition(s) hold over " + layout.skew_factor + "x the median rows ("
      + layout.median_rows + "): " + layout.skewed.map(s => s.key_path).join(", "));
  }
  // A few small files are normal; many, and most of them, cost every read an open per file.
  if (layout && layout.tiny_files >= 16 && layout.tiny_files * 2 > layout.files) {
    parts.push(layout.tiny_files + " of " + layout.files + " file(s) are tiny (under "
      + layout.tiny_file_bytes + " bytes)");
  }
  $("layout-warning").textContent = parts.length
    ? "Layout: " + parts.join("; ") + ". Run airflow-partitions advise for a better partition_by." : "";
}

function render() {
  const tbody = $("rows");
  tbody.replaceChildren();
  keepInUrl();
  for (const th of document.querySelectorAll("th.sortable")) {
    const direction = sortDescending ? "descending" : "ascending";
    th.setAttribute("aria-sort", th.dataset.sort === sortKey ? direction : "none");
  }
  if (!documentData) return;
  const report = documentData.datasets[0];
  $("version").textContent = report.latest_version === null ? "no version committed yet"
    : "version " + report.latest_version + " (" + report.operation + ", "
      + formatTime(report.committed_at) + ")";
  renderSummary(report);
  if (report !== renderedOverviewOf) { renderOverview(report); renderedOverviewOf = report; }
  renderBlocked(report);
  renderFreshness(report);
  renderLayout(report);
  renderPaused();
  $("warning").textContent = report.discovery_error ? "Source not surveyed: " + report.discovery_error : "";
  const shown = shownPartitions();
  const pages = Math.max(1, Math.ceil(shown.length / PAGE_SIZE));
  page = Math.min(Math.max(page, 0), pages - 1);
  const start = page * PAGE_SIZE;
  const fragment = document.createDocumentFragment();
  for (const partition of shown.slice(start, start + PAGE_SIZE)) {
    const row = el("tr", {"data-key-path": partition.key_path, "data-state": partition.state});
    const pick = el("input", {type: "checkbox", class: "pick", "aria-label": "select " + partition.key});
    pick.checked = selected.has(partition.key_path);
    pick.disabled = partition.state === "removed";
    pick.addEventListener("change", () => {
      if (pick.checked) selected.add(partition.key_path); else selected.delete(partition.key_path);
      updateButtons();
    });
    const pickCell = el("td"); pickCell.appendChild(pick); row.appendChild(pickCell);
    const stateCell = el("td", {class: "state"});
    stateCell.appendChild(el("span", {class: "badge state-" + partition.state},
      STATE_LABELS[partition.state] || partition.state));
    row.appendChild(stateCell);
    const keyCell = el("td", {class: "key", title: partition.key_path});
    const opener = el("a", {href: "#", class: "detail-link"}, partition.key);
    opener.addEventListener("click", (event) => { event.preventDefault(); showDetail(partition); });
    keyCell.appendChild(opener);
    row.appendChild(keyCell);
    const rows = partition.rows === null ? "-" : partition.rows.toLocaleString();
    row.appendChild(el("td", {class: "num"}, rows));
    row.appendChild(el("td", {class: "num"}, formatBytes(partition.bytes)));
    row.appendChild(el("td", {class: "time"}, formatTime(partition.refreshed_at)));
    row.appendChild(writerCell(partition));
    row.appendChild(errorCell(partition));
    fragment.appendChild(row);
  }
  tbody.appendChild(fragment);
  if (!render.painted) { render.painted = true; performance.mark("partitions-rendered"); }
  $("page-info").textContent = shown.length
    ? (start + 1) + "-" + Math.min(start + PAGE_SIZE, shown.length) + " of " + shown.length
      + " (page " + (page + 1) + " of " + pages + ")"
    : "no partition matches";
  $("page-prev").disabled = page === 0;
  $("page-next").disabled = page >= pages - 1;
  updateButtons();
}

// The overview: one cell per partition, coloured by state, in key order. Two-field keys are a grid
// (first field down, second across: region x day); others fill rows. A canvas, so 10,000 cells cost one
// paint; a click shows that partition (or, in a grid, its row's first field) in the table.
const STATE_COLOURS = {fresh: "#32d583", stale: "#fdb022", failed: "#f04438", refreshing: "#53b1fd",
  waiting: "#8098f9", missing: "#d0d5dd", removed: "#98a2b3", unknown: "#eaecf0"};
let overviewCells = null;
let renderedOverviewOf = null;

function renderOverview(report) {
  const canvas = $("overview");
  const partitions = (report.partitions || []).slice().sort((a, b) => collator.compare(a.key, b.key));
  const width = Math.max(200, Math.min(document.documentElement.clientWidth - 40, 1400));
  const fields = partitions.length ? partitions[0].key.split("/").length : 0;
  let rows, cols, place;
  const axes = $("overview-axes");
  if (fields === 2) {
    const values = (p, i) => decode(p.key_path.split("/")[i].split("=").slice(1).join("="));
    const down = Array.from(new Set(partitions.map((p) => values(p, 0)))).sort(collator.compare);
    const across = Array.from(new Set(partitions.map((p) => values(p, 1)))).sort(collator.compare);
    const downIndex = new Map(down.map((v, i) => [v, i]));
    const acrossIndex = new Map(across.map((v, i) => [v, i]));
    rows = down.length; cols = across.length;
    place = (p) => [downIndex.get(values(p, 0)), acrossIndex.get(values(p, 1))];
    const names = partitions[0].key.split("/").map((part) => part.split("=")[0]);
    axes.textContent = names[0] + " (" + rows + ") down, " + names[1] + " (" + cols + ") across";
  } else {
    const cell = partitions.length > 2000 ? 6 : 12;
    cols = Math.max(1, Math.floor(width / cell));
    rows = Math.ceil(partitions.length / cols);
    place = (p, i) => [Math.floor(i / cols), i % cols];
    axes.textContent = partitions.length ? partitions.length + " partitions in key order" : "";
  }
  const size = Math.max(2, Math.min(14, Math.floor(width / Math.max(cols, 1))));
  canvas.width = cols * size; canvas.height = Math.min(rows * size, 600);
  canvas.hidden = !partitions.length;
  const context = canvas.getContext("2d");
  context.clearRect(0, 0, canvas.width, canvas.height);
  overviewCells = {size, cols, grid: fields === 2, at: new Map(), order: partitions};
  const gap = size > 4 ? 1 : 0;
  partitions.forEach((p, i) => {
    const [row, col] = place(p, i);
    overviewCells.at.set(row * cols + col, p);
    p._cell = [row, col, i];
    context.fillStyle = STATE_COLOURS[p.state] || STATE_COLOURS.unknown;
    context.fillRect(col * size, row * size, size - gap, size - gap);
  });
}

function overviewCell(event) {
  const box = $("overview").getBoundingClientRect();
  const scale = $("overview").width / box.width;
  return [Math.floor((event.clientY - box.top) * scale / overviewCells.size),
    Math.floor((event.clientX - box.left) * scale / overviewCells.size)];
}

function overviewPartition(event) {
  if (!overviewCells) return null;
  const [row, col] = overviewCell(event);
  if (col < 0 || col >= overviewCells.cols) return null;
  return overviewCells.at.get(row * overviewCells.cols + col) || null;
}

// A range dragged on the overview: in a grid, every partition of the rectangle between the two cells
// (a range of regions x a range of days); otherwise every partition between them in key order.
function overviewRange(from, to) {
  if (overviewCells.grid) {
    const [top, bottom] = [Math.min(from._cell[0], to._cell[0]), Math.max(from._cell[0], to._cell[0])];
    const [left, right] = [Math.min(from._cell[1], to._cell[1]), Math.max(from._cell[1], to._cell[1])];
    return overviewCells.order.filter((p) => p._cell[0] >= top && p._cell[0] <= bottom
      && p._cell[1] >= left && p._cell[1] <= right);
  }
  const [first, last] = [Math.min(from._cell[2], to._cell[2]), Math.max(from._cell[2], to._cell[2])];
  return overviewCells.order.slice(first, last + 1);
}

// While dragging, the cells of the range are outlined over the painted overview.
let overviewDrag = null;
function outlineRange(partitions) {
  const context = $("overview").getContext("2d");
  context.putImageData(overviewDrag.painted, 0, 0);
  context.strokeStyle = getComputedStyle(document.documentElement).getPropertyValue("--fg") || "#000";
  context.lineWidth = 1;
  const size = overviewCells.size;
  for (const p of partitions) {
    context.strokeRect(p._cell[1] * size + .5, p._cell[0] * size + .5, size - 2, size - 2);
  }
}

// One partition: its refreshes over the retained catalog versions, and why it would be refreshed now.
async function showDetail(partition) {
  $("detail-title").textContent = partition.key;
  $("detail-state").replaceChildren(el("span", {class: "badge state-" + partition.state},
    STATE_LABELS[partition.state] || partition.state));
  const body = $("detail-history");
  body.replaceChildren();
  $("detail-why").textContent = "";
  $("detail-chart").replaceChildren();
  $("detail-chart").hidden = true;
  $("detail").showModal();
  try {
    const detail = await api("api/dags/" + encodeURIComponent(dagId) + "/partition?key_path="
      + encodeURIComponent(partition.key_path));
    const why = partition.reason && detail.reasons[partition.reason];
    $("detail-why").textContent = why ? "Would be refreshed because " + why + "." : "";
    if (partition.failure) $("detail-why").textContent += " Last refresh failed: " + partition.failure.error;
    for (const item of detail.history) {
      const row = el("tr", {"data-version": item.version});
      row.appendChild(el("td", {class: "num"}, item.version));
      row.appendChild(el("td", {class: "time"}, formatTime(item.committed_at) + " (" + item.operation + ")"));
      row.appendChild(el("td", {}, item.change));
      row.appendChild(el("td", {class: "num"}, item.rows === undefined ? "-" : item.rows.toLocaleString()));
      row.appendChild(el("td", {class: "num"}, formatBytes(item.bytes)));
      row.appendChild(writerCell(item));
      body.appendChild(row);
    }
    if (!detail.history.length) body.appendChild(el("tr", {}, "never written in a retained version"));
    renderRowChart(detail.history);
  } catch (err) {
    $("detail-why").textContent = err.message;
  }
}

// The partition's row count over the retained versions that wrote it, oldest left: one point per write,
// placed by commit time, the lowest and highest counts labelled.
function renderRowChart(history) {
  const chart = $("detail-chart");
  const written = history.filter((item) => item.change === "written" && typeof item.rows === "number")
    .slice().reverse();
  chart.replaceChildren();
  chart.hidden = written.length === 0;
  if (!written.length) return;
  const [width, height, pad] = [420, 90, 14];
  chart.setAttribute("width", width); chart.setAttribute("height", height);
  chart.setAttribute("viewBox", "0 0 " + width + " " + height);
  const times = written.map((item) => Date.parse(item.committed_at));
  const rows = written.map((item) => item.rows);
  const [t0, t1] = [Math.min(...times), Math.max(...times)];
  const [r0, r1] = [Math.min(...rows), Math.max(...rows)];
  const x = (t) => t1 === t0 ? width / 2 : pad + (t - t0) / (t1 - t0) * (width - 2 * pad - 60);
  const y = (r) => r1 === r0 ? height / 2 : height - pad - (r - r0) / (r1 - r0) * (height - 2 * pad);
  const svg = (tag, attrs, text) => {
    const node = document.createElementNS("http://www.w3.org/2000/svg", tag);
    for (const [name, value] of Object.entries(attrs)) node.setAttribute(name, value);
    if (text !== undefined) node.textContent = text;
    return node;
  };
  const points = written.map((item, i) => [x(times[i]), y(item.rows)]);
  const line = points.map((p) => p[0].toFixed(1) + "," + p[1].toFixed(1)).join(" ");
  chart.appendChild(svg("polyline", {points: line}));
  written.forEach((item, i) => {
    const point = svg("circle", {cx: points[i][0].toFixed(1), cy: points[i][1].toFixed(1), r: 3,
      "data-version": item.version, "data-rows": item.rows});
    const tip = "version " + item.version + ": " + item.rows.toLocaleString() + " rows";
    point.appendChild(svg("title", {}, tip));
    chart.appendChild(point);
  });
  chart.appendChild(svg("text", {x: width - 56, y: pad}, r1.toLocaleString() + " rows"));
  if (r1 !== r0) {
    chart.appendChild(svg("text", {x: width - 56, y: height - 4}, r0.toLocaleString() + " rows"));
  }
}

function airflowInfo() { return (documentData && documentData.airflow) || {}; }

function renderPaused() {
  const banner = $("paused");
  banner.replaceChildren();
  if (!airflowInfo().is_paused) return;
  banner.appendChild(document.createTextNode(
    "The DAG " + dagId + " is paused: a refresh triggered now stays queued until it is unpaused. "));
  const button = el("button", {id: "unpause", class: "secondary"}, "Unpause");
  button.disabled = !airflowInfo().can_unpause;
  if (button.disabled) button.title = "You may not unpause " + dagId;
  button.addEventListener("click", async () => {
    try { await unpause(); say("Unpaused " + dagId + ".", false); await load(); }
    catch (err) { say(err.message, true); }
  });
  banner.appendChild(button);
}

function updateButtons() {
  const canTrigger = airflowInfo().can_trigger !== false;
  const reason = canTrigger ? "" : "You may read these partitions but not refresh them: triggering "
    + (dagId || "the DAG") + " needs permission to create its runs (Airflow's User, Op or Admin role).";
  $("permission").textContent = reason;
  for (const id of ["refresh-selected", "refresh-needed"]) $(id).title = reason;
  $("refresh-selected").disabled = selected.size === 0 || !dagId || !canTrigger;
  $("refresh-needed").disabled = !dagId || !canTrigger;
  $("refresh-selected").textContent = selected.size ? "Refresh selected (" + selected.size + ")"
    : "Refresh selected";
}

function say(text, isError) {
  $("message").textContent = text;
  $("message").className = isError ? "error" : "muted";
}

async function load() {
  if (!dagId) return;
  try {
    documentData = await api("api/dags/" + encodeURIComponent(dagId) + "/partitions");
    render();
  } catch (err) {
    say(err.message, true);
  }
}

// Follow runs (the DAG run's state, not only its tasks) to their end, and notice runs started
// elsewhere: the runs endpoint is cheap, the partition document is reloaded only when runs change.
async function pollRuns() {
  if (runsTimer) { clearTimeout(runsTimer); runsTimer = null; }
  if (!dagId) return;
  let active = false;
  try {
    const listing = await api("api/dags/" + encodeURIComponent(dagId) + "/runs");
    const signature = JSON.stringify(listing.runs.map((run) => [run.run_id, run.state,
      run.tasks_refreshed, run.tasks_failed, run.tasks_waiting, run.commit_state])
      .concat([listing.is_paused]));
    for (const run of listing.runs) {
      const ended = !["queued", "running"].includes(run.state);
      if (!ended) { active = true; if (!followed.has(run.run_id)) followed.set(run.run_id, run.state); }
      else if (followed.has(run.run_id)) { followed.delete(run.run_id); report(run); }
    }
    if (documentData && documentData.airflow && documentData.airflow.is_paused !== listing.is_paused) {
      documentData.airflow.is_paused = listing.is_paused;
    }
    if (lastRunsSignature !== null && signature !== lastRunsSignature) await load();
    lastRunsSignature = signature;
  } catch (err) { /* the next poll tries again; load() reports errors */ }
  runsTimer = setTimeout(pollRuns, active || followed.size ? 1000 : 5000);
}

function report(run) {
  const outcome = run.state === "success" ? "succeeded" : run.state;
  const published = run.commit_state === "success" ? run.tasks_refreshed : 0;
  const text = "Run " + run.run_id + " " + outcome + ": published " + published + ", failed "
    + run.tasks_failed + (run.commit_state === "success" ? "" : " (nothing committed)")
    + " (counted in partition tasks).";
  say(text, run.state !== "success");
  $("message").dataset.runId = run.run_id;
}

async function unpause() {
  await api("api/dags/" + encodeURIComponent(dagId) + "/unpause", {method: "POST", body: "{}"});
  if (documentData) documentData.airflow.is_paused = false;
  renderPaused();
}

function preview(keys, title) {
  return new Promise((resolve) => {
    const dialog = $("preview");
    $("preview-title").textContent = title;
    const list = $("preview-list");
    list.replaceChildren();
    const known = (documentData && documentData.datasets[0].partitions) || [];
    const byPath = new Map(known.map((p) => [p.key_path, p]));
    for (const key of keys.slice(0, 20)) {
      list.appendChild(el("li", {}, byPath.has(key) ? byPath.get(key).key : key));
    }
    $("preview-more").textContent = keys.length > 20 ? "and " + (keys.length - 20) + " more" : "";
    $("preview-unpause-label").hidden = !airflowInfo().is_paused;
    $("preview-unpause").checked = true;
    dialog.addEventListener("close", () => resolve(dialog.returnValue === "confirm"), {once: true});
    dialog.returnValue = "";
    dialog.showModal();
  });
}

async function refresh(keys, body) {
  const title = "Refresh " + keys.length + " partition(s) of " + dagId + "?";
  if (!keys.length) { say("Nothing to refresh: no partition is failed, stale or missing.", false); return; }
  if (!(await preview(keys, title))) { say("Nothing triggered.", false); return; }
  try {
    if (airflowInfo().is_paused && $("preview-unpause").checked) await unpause();
    const run = await api("api/dags/" + encodeURIComponent(dagId) + "/refresh",
      {method: "POST", body: JSON.stringify(body)});
    say("Triggered " + run.dag_run_id + " for " + run.partitions.length + " partition(s)"
      + (airflowInfo().is_paused ? "; the DAG is paused, so it stays queued" : ""), false);
    followed.set(run.dag_run_id, "queued");
    selected.clear();
    await load();
    pollRuns();
  } catch (err) {
    say(err.message, true);
  }
}

async function start() {
  try {
    const listing = await api("api/datasets");
    const choice = $("dataset");
    for (const item of listing.datasets) {
      choice.appendChild(el("option", {value: item.dag_id}, item.dataset + " (" + item.dag_id + ")"));
    }
    if (!dagId && listing.datasets.length) dagId = listing.datasets[0].dag_id;
    if (dagId) choice.value = dagId;
    if (!listing.datasets.length) say("No refresh DAG of airflow-partitions is visible to you.", false);
  } catch (err) {
    say(err.message, true);
  }
  await load();
  pollRuns();
}

$("dataset").addEventListener("change", (event) => {
  dagId = event.target.value; selected.clear(); documentData = null; page = 0; stateFilter.clear();
  lastRunsSignature = null; followed.clear(); render(); load(); pollRuns();
});
$("filter").addEventListener("input", () => { page = 0; render(); });
for (const th of document.querySelectorAll("th.sortable")) {
  th.addEventListener("click", () => {
    if (sortKey === th.dataset.sort) sortDescending = !sortDescending;
    else { sortKey = th.dataset.sort; sortDescending = false; }
    page = 0; render();
  });
}
$("page-prev").addEventListener("click", () => { page -= 1; render(); });
$("page-next").addEventListener("click", () => { page += 1; render(); });
$("select-all").addEventListener("change", (event) => {
  for (const partition of shownPartitions()) {
    if (partition.state === "removed") continue;
    if (event.target.checked) selected.add(partition.key_path); else selected.delete(partition.key_path);
  }
  render();
});
$("refresh-selected").addEventListener("click", () => {
  const keys = Array.from(selected);
  refresh(keys, {partitions: keys});
});
$("refresh-needed").addEventListener("click", () => {
  const wanted = new Set(["failed", "stale", "missing"]);
  const keys = ((documentData && documentData.datasets[0].partitions) || [])
    .filter((p) => wanted.has(p.state)).map((p) => p.key_path);
  refresh(keys, {needs_refresh: true});
});
$("overview").addEventListener("mousemove", (event) => {
  const partition = overviewPartition(event);
  const state = partition ? STATE_LABELS[partition.state] || partition.state : "";
  $("overview").title = partition ? partition.key + ": " + state : "";
});
// Press on a cell, drag to another, release: the partitions in between are selected and the launch
// preview opens; a press and release on one cell shows that partition in the table.
$("overview").addEventListener("mousedown", (event) => {
  const partition = overviewPartition(event);
  if (!partition || event.button !== 0) return;
  event.preventDefault();
  const canvas = $("overview");
  overviewDrag = {from: partition, to: partition,
    painted: canvas.getContext("2d").getImageData(0, 0, canvas.width, canvas.height)};
});
window.addEventListener("mousemove", (event) => {
  if (!overviewDrag) return;
  const partition = overviewPartition(event);
  if (!partition || partition === overviewDrag.to) return;
  overviewDrag.to = partition;
  outlineRange(overviewRange(overviewDrag.from, partition));
});
window.addEventListener("mouseup", (event) => {
  if (!overviewDrag) return;
  const drag = overviewDrag;
  overviewDrag = null;
  $("overview").getContext("2d").putImageData(drag.painted, 0, 0);
  if (drag.from === drag.to) {
    $("filter").value = drag.from.key; page = 0; render();
    return;
  }
  const keys = overviewRange(drag.from, drag.to).filter((p) => p.state !== "removed").map((p) => p.key_path);
  selected.clear();
  for (const key of keys) selected.add(key);
  render();
  say("Selected " + keys.length + " partition(s) from " + drag.from.key + " to " + drag.to.key + ".", false);
  if (airflowInfo().can_trigger !== false) refresh(keys, {partitions: keys});
});
$("reload").addEventListener("click", () => { say("", false); load(); });
start();
</script>
</body>
</html>
"""
