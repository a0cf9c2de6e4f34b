//! The dashboard's page: plain HTML, CSS and JavaScript (no outside resources), polling
//! `/api/status` once a second.

/// The page.
pub(crate) const HTML: &str = r##"<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>dask-comm dashboard</title>
<style>
body { font: 13px system-ui, sans-serif; margin: 12px 18px; color: #222; background: #fafafa; }
h1 { font-size: 18px; margin: 0 0 4px; }
h2 { font-size: 14px; margin: 16px 0 6px; }
#summary { color: #555; }
#stream { background: #fff; border: 1px solid #ddd; padding: 4px 6px; }
.row { display: flex; align-items: center; height: 16px; margin: 1px 0; }
.label { width: 190px; flex: none; overflow: hidden; white-space: nowrap; text-overflow: ellipsis; color: #555; font-size: 11px; }
.lane { position: relative; flex: 1; height: 14px; background: #f2f2f2; }
.bar { position: absolute; top: 1px; height: 12px; min-width: 1px; border-radius: 1px; }
.bar.fetch { background: #d62728; }
.axis { display: flex; justify-content: space-between; margin-left: 190px; color: #888; font-size: 11px; }
table { border-collapse: collapse; background: #fff; }
th, td { border: 1px solid #ddd; padding: 3px 8px; text-align: right; }
th { background: #eee; }
td.name { text-align: left; }
.meter { width: 120px; height: 10px; background: #eee; display: inline-block; vertical-align: middle; position: relative; }
.meter > span { position: absolute; top: 0; bottom: 0; left: 0; }
.progress { display: flex; align-items: center; margin: 2px 0; }
.progress .name { width: 240px; overflow: hidden; white-space: nowrap; text-overflow: ellipsis; }
.progress .track { width: 360px; height: 12px; background: #eee; display: flex; }
.progress .count { margin-left: 8px; color: #555; }
.state { display: inline-block; margin-right: 14px; }
.legend span { display: inline-block; margin-right: 12px; }
.legend i { display: inline-block; width: 10px; height: 10px; margin-right: 4px; vertical-align: middle; }
#error { color: #b00; }
</style>
</head>
<body>
<h1>dask-comm</h1>
<div id="summary">connecting…</div>
<div id="error"></div>
<h2>Task stream <small>(last <span id="window">10</span> s; fetches between workers in red)</small></h2>
<div id="stream"></div>
<div class="axis"><span id="axis-start"></span><span>now</span></div>
<div class="legend" id="legend"></div>
<h2>Progress</h2>
<div id="progress"></div>
<h2>Workers</h2>
<table id="workers"><thead><tr><th>name</th><th>address</th><th>threads</th><th>CPU</th><th>memory</th><th>spilled</th><th>RSS</th><th>processing</th></tr></thead><tbody></tbody></table>
<h2>Tasks by state</h2>
<div id="states"></div>
<script>
"use strict";
const WINDOW = 10;
document.getElementById("window").textContent = WINDOW;
document.getElementById("axis-start").textContent = "-" + WINDOW + " s";
function esc(s) {
  return String(s).replace(/[&<>"']/g, c => ({"&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;"}[c]));
}
function colour(name) {
  let h = 0;
  for (const c of name) h = (h * 31 + c.charCodeAt(0)) >>> 0;
  return "hsl(" + (30 + h % 300) + ", 60%, 55%)";
}
function bytes(n) {
  const u = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  while (n >= 1024 && i < u.length - 1) { n /= 1024; i++; }
  return (i ? n.toFixed(1) : n) + " " + u[i];
}
function render(s) {
  const t = s.totals;
  const overhead = t.tasks_finished ? (t.scheduler_busy_seconds / t.tasks_finished * 1e6).toFixed(1) + " µs" : "–";
  document.getElementById("summary").textContent =
    s.workers.length + " workers · " + t.tasks_finished + " tasks finished · " + t.fetches +
    " fetches (" + bytes(t.fetch_bytes) + ") · scheduler time per task " + overhead +
    " · up " + s.now.toFixed(0) + " s";
  // The task stream: a row per worker thread, and one for its fetches.
  const start = s.now - s.window;
  const rows = [];
  const groups = new Set();
  for (const w of s.workers) {
    const lanes = [];
    for (let i = 0; i < w.nthreads; i++) lanes.push({label: w.name + " · thread " + i, thread: i});
    lanes.push({label: w.name + " · fetches", thread: -1});
    for (const lane of lanes) {
      let bars = "";
      for (const b of s.bars) {
        if (b.worker !== w.id || b.thread !== lane.thread) continue;
        const left = Math.max(0, (b.start - start) / s.window * 100);
        const width = Math.max(0.1, (Math.min(b.stop, s.now) - Math.max(b.start, start)) / s.window * 100);
        const ms = ((b.stop - b.start) * 1000).toFixed(2) + " ms";
        if (lane.thread < 0) {
          bars += '<div class="bar fetch" style="left:' + left + '%;width:' + width + '%" title="' +
            esc(b.group + ", " + bytes(b.bytes) + ", " + ms) + '"></div>';
        } else {
          groups.add(b.group);
          bars += '<div class="bar" data-group="' + esc(b.group) + '" style="left:' + left + '%;width:' + width +
            '%;background:' + colour(b.group) + '" title="' + esc(b.group + ", " + ms) + '"></div>';
        }
      }
      rows.push('<div class="row"><span class="label">' + esc(lane.label) + '</span><div class="lane">' + bars + '</div></div>');
    }
  }
  document.getElementById("stream").innerHTML = rows.join("") || "<em>no workers</em>";
  document.getElementById("legend").innerHTML = [...groups].sort().map(g =>
    '<span><i style="background:' + colour(g) + '"></i>' + esc(g) + '</span>').join("") +
    '<span><i style="background:#d62728"></i>fetch</span>';
  // Progress per group.
  document.getElementById("progress").innerHTML = s.groups.map(g => {
    const pct = n => (g.total ? n / g.total * 100 : 0) + "%";
    return '<div class="progress"><span class="name">' + esc(g.name) + '</span><span class="track">' +
      '<span style="width:' + pct(g.memory) + ';background:' + colour(g.name) + '"></span>' +
      '<span style="width:' + pct(g.processing) + ';background:#9ecae1"></span>' +
      '<span style="width:' + pct(g.erred) + ';background:#000"></span></span>' +
      '<span class="count">' + g.memory + " / " + g.total + (g.erred ? " (" + g.erred + " erred)" : "") + '</span></div>';
  }).join("") || "<em>no tasks</em>";
  // Workers.
  document.querySelector("#workers tbody").innerHTML = s.workers.map(w => {
    const used = w.memory_limit ? Math.min(100, w.stored / w.memory_limit * 100) : 0;
    return '<tr class="worker"><td class="name">' + esc(w.name) + (w.paused ? " (paused)" : "") +
      (w.retiring ? " (retiring)" : "") + '</td><td class="name">' + esc(w.address) + '</td><td>' + w.nthreads +
      '</td><td>' + (w.cpu * 100).toFixed(0) + ' %</td><td><span class="meter"><span style="width:' + used +
      '%;background:#74c476"></span></span> ' + bytes(w.stored) + (w.memory_limit ? " / " + bytes(w.memory_limit) : "") +
      '</td><td>' + bytes(w.spilled) + '</td><td>' + bytes(w.rss) + '</td><td>' + w.processing + '</td></tr>';
  }).join("");
  document.getElementById("states").innerHTML = s.states.map(([name, n]) =>
    '<span class="state" data-state="' + esc(name) + '">' + esc(name) + ": <b>" + n + "</b></span>").join("");
}
async function poll() {
  try {
    const r = await fetch("/api/status?window=" + WINDOW, {cache: "no-store"});
    if (!r.ok) throw new Error(r.status + " " + (await r.text()));
    render(await r.json());
    document.getElementById("error").textContent = "";
    // How many times the page has redrawn itself (tests read it from the DOM).
    document.body.dataset.updates = String(Number(document.body.dataset.updates || 0) + 1);
  } catch (e) {
    document.getElementById("error").textContent = "the scheduler does not answer: " + e.message;
  }
  setTimeout(poll, 1000);
}
poll();
</script>
</body>
</html>
"##;
