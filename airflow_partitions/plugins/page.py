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
  body { font-family: system-ui, -apple-system, "Segoe UI", sans-serif; margin: 16px; color: #1f2933;
         font-size: 14px; }
  h1 { font-size: 20px; margin: 0 0 12px; }
  .bar { display: flex; gap: 8px; align-items: center; flex-wrap: wrap; margin-bottom: 10px; }
  select, input[type=search] { padding: 5px 8px; border: 1px solid #cbd2d9; border-radius: 4px; }
  input[type=search] { min-width: 260px; }
  button { padding: 6px 12px; border-radius: 4px; border: 1px solid #0b69a3; background: #0b69a3;
           color: white; cursor: pointer; }
  button.secondary { background: white; color: #0b69a3; }
  button:disabled { opacity: .5; cursor: default; }
  table { border-collapse: collapse; width: 100%; }
  th, td { text-align: left; padding: 5px 8px; border-bottom: 1px solid #e4e7eb; vertical-align: top; }
  th { background: #f5f7fa; font-weight: 600; }
  td.num { text-align: right; font-variant-numeric: tabular-nums; }
  .badge { display: inline-block; padding: 1px 8px; border-radius: 10px; font-size: 12px; font-weight: 600; }
  .state-fresh { background: #d1fadf; color: #05603a; }
  .state-stale { background: #fef0c7; color: #93370d; }
  .state-failed { background: #fee4e2; color: #912018; }
  .state-refreshing { background: #d1e9ff; color: #194185; }
  .state-missing { background: #f2f4f7; color: #344054; }
  .state-removed { background: #e4e7ec; color: #475467; text-decoration: line-through; }
  .state-unknown { background: #f2f4f7; color: #667085; }
  .summary span { margin-right: 6px; }
  .muted { color: #616e7c; }
  .error { color: #912018; white-space: pre-wrap; }
  #message { min-height: 20px; margin: 6px 0; }
  td.key { font-family: ui-monospace, monospace; overflow-wrap: anywhere; min-width: 8em; }
  td.time { white-space: nowrap; }
</style>
</head>
<body>
<h1>Partitions</h1>
<div class="bar">
  <label for="dataset">Dataset</label> <select id="dataset"></select>
  <span id="version" class="muted"></span>
</div>
<div class="bar summary" id="summary"></div>
<div class="bar">
  <input type="search" id="filter" placeholder="Filter: key text or a state (failed, stale...)">
  <button id="refresh-selected" disabled>Refresh selected</button>
  <button id="refresh-needed" class="secondary">Refresh everything failed or stale</button>
  <button id="reload" class="secondary">Reload</button>
</div>
<div id="message"></div>
<div id="warning" class="error"></div>
<table>
  <thead><tr>
    <th><input type="checkbox" id="select-all" title="Select every shown partition"></th>
    <th>State</th><th>Partition</th><th>Rows</th><th>Bytes</th><th>Last refresh</th>
    <th>Written by</th><th>Last error</th>
  </tr></thead>
  <tbody id="rows"></tbody>
</table>
<script>
"use strict";
const query = new URLSearchParams(window.location.search);
let dagId = query.get("dag_id");
let documentData = null;
let pollTimer = null;
const selected = new Set();
const $ = (id) => document.getElementById(id);

async function api(path, options) {
  const response = await fetch(path, Object.assign(
    {credentials: "same-origin", headers: {"Content-Type": "application/json"}}, options || {}));
  let body = {};
  try { body = await response.json(); } catch (err) { body = {}; }
  if (!response.ok) {
    const detail = typeof body.detail === "string" ? body.detail : JSON.stringify(body.detail || "");
    const hint = response.status === 401 ? " (sign in to Airflow first)" : "";
    throw new Error("HTTP " + response.status + ": " + detail + hint);
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

function uiLink(path, text) {
  const link = el("a", {href: path, target: "_top"}, text);
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
  cell.textContent = failure.error.split("\n")[0].slice(0, 300);
  cell.title = failure.error;
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

function matchesFilter(partition) {
  const text = $("filter").value.trim().toLowerCase();
  if (!text) return true;
  return partition.state === text || partition.key.toLowerCase().includes(text)
    || partition.key_path.toLowerCase().includes(text);
}

function render() {
  const tbody = $("rows");
  tbody.replaceChildren();
  if (!documentData) return;
  const report = documentData.datasets[0];
  $("version").textContent = report.latest_version === null ? "no version committed yet"
    : "version " + report.latest_version + " (" + report.operation + ", "
      + formatTime(report.committed_at) + ")";
  const summary = $("summary");
  summary.replaceChildren();
  for (const [state, count] of Object.entries(report.states || {})) {
    if (!count) continue;
    const badge = el("span", {class: "badge state-" + state, "data-state-count": state}, count + " " + state);
    summary.appendChild(badge);
  }
  const verified = report.last_verify;
  if (verified) {
    summary.appendChild(el("span", {class: "badge", "data-last-verify": verified.result},
      "verified " + verified.result + " at " + formatTime(verified.verified_at)
      + " (version " + verified.version + ")"));
  }
  $("warning").textContent = report.discovery_error ? "Source not surveyed: " + report.discovery_error : "";
  for (const partition of report.partitions || []) {
    if (!matchesFilter(partition)) continue;
    const row = el("tr", {"data-key-path": partition.key_path, "data-state": partition.state});
    const pick = el("input", {type: "checkbox", class: "pick"});
    pick.checked = selected.has(partition.key_path);
    pick.disabled = partition.state === "removed";
    pick.addEventListener("change", () => {
      if (pick.checked) selected.add(partition.key_path); else selected.delete(partition.key_path);
      updateButtons();
    });
    const pickCell = el("td"); pickCell.appendChild(pick); row.appendChild(pickCell);
    const stateCell = el("td", {class: "state"});
    stateCell.appendChild(el("span", {class: "badge state-" + partition.state}, partition.state));
    row.appendChild(stateCell);
    row.appendChild(el("td", {class: "key", title: partition.key_path}, partition.key));
    const rows = partition.rows === null ? "-" : partition.rows.toLocaleString();
    row.appendChild(el("td", {class: "num"}, rows));
    row.appendChild(el("td", {class: "num"}, formatBytes(partition.bytes)));
    row.appendChild(el("td", {class: "time"}, formatTime(partition.refreshed_at)));
    row.appendChild(writerCell(partition));
    row.appendChild(errorCell(partition));
    tbody.appendChild(row);
  }
  updateButtons();
}

function updateButtons() {
  $("refresh-selected").disabled = selected.size === 0 || !dagId;
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
    const refreshing = (documentData.datasets[0].states || {}).refreshing || 0;
    schedulePoll(refreshing > 0 ? 2000 : null);
  } catch (err) {
    say(err.message, true);
    schedulePoll(null);
  }
}

function schedulePoll(delay) {
  if (pollTimer) { clearTimeout(pollTimer); pollTimer = null; }
  if (delay) pollTimer = setTimeout(load, delay);
}

async function refresh(body) {
  try {
    const run = await api("api/dags/" + encodeURIComponent(dagId) + "/refresh",
      {method: "POST", body: JSON.stringify(body)});
    say("Triggered " + run.dag_run_id + " for " + run.partitions.length + " partition(s)", false);
    selected.clear();
    await load();
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
}

$("dataset").addEventListener("change", (event) => {
  dagId = event.target.value; selected.clear(); documentData = null; render(); load();
});
$("filter").addEventListener("input", render);
$("select-all").addEventListener("change", (event) => {
  if (!documentData) return;
  for (const partition of documentData.datasets[0].partitions) {
    if (!matchesFilter(partition) || partition.state === "removed") continue;
    if (event.target.checked) selected.add(partition.key_path); else selected.delete(partition.key_path);
  }
  render();
});
$("refresh-selected").addEventListener("click", () => refresh({partitions: Array.from(selected)}));
$("refresh-needed").addEventListener("click", () => refresh({needs_refresh: true}));
$("reload").addEventListener("click", () => { say("", false); load(); });
start();
</script>
</body>
</html>
"""
