"""A coordinator's status page, served on its ``--http-listen`` port: ``/`` (or ``/status``) and ``/status.json``.

The page is one HTML document with its style and a small plain script in it
(no build step, nothing fetched from elsewhere): the coordinators and who
leads, the query nodes with memory bars and segment counts, the collections
with their live load percentage and health (green, yellow, red: the colours
of ``querycoord health``, with what is missing), the running task trees with
what each waits for, the recent history, the
streams with their tasks' states, and etcd's members and alarms. Its data is
the snapshot of ``querycoord.console.status_view.StatusSource``: embedded in the page
as it is served (so the first paint needs no second request), then polled
from ``/status.json`` every ``?refresh=`` seconds (default 2) and drawn again.

The snapshot a request gets may be up to ``MAX_AGE`` (10 s) old when nobody
asked for a while: the header says when it was taken and how long ago, and
the next poll shows a fresh one (``StatusSource.snapshot``).

Every value is escaped. The snapshot is embedded as JSON inside a
``<script type="application/json">`` element with ``<``, ``>`` and ``&``
written as ``\\u003c``-style escapes, so no value can end that element; the
script builds the page with ``createElement`` and text nodes only (never
``innerHTML``), so a collection named ``<script>...`` is shown as those
characters. The page is read-only. With security on it shows only to the
reader role and to requests for one of the coordinator's names
(``querycoord.net.http_access``); in development mode, like ``/metrics``, to
anyone who reaches ``--http-listen``.
"""

from __future__ import annotations

import json
from http import HTTPStatus
from typing import Any

from querycoord.console.status_view import StatusSource
from querycoord.net.http_server import Page

HTML_PATHS = ("/", "/status")
JSON_PATH = "/status.json"
REFRESH_DEFAULT = 2.0
REFRESH_MIN, REFRESH_MAX = 0.5, 3600.0

_SCRIPT_ESCAPES = {"<": "\\u003c", ">": "\\u003e", "&": "\\u0026", "\u2028": "\\u2028", "\u2029": "\\u2029"}


def script_json(data: Any) -> str:
    """``data`` as JSON that is safe inside an HTML ``<script>`` element: nothing in it can close the element or
    open a comment, and it parses to the same value."""
    text = json.dumps(data, separators=(",", ":"), ensure_ascii=False)
    for char, escape in _SCRIPT_ESCAPES.items():
        text = text.replace(char, escape)
    return text


def refresh_seconds(query: dict[str, list[str]]) -> float:
    """``?refresh=SECONDS`` (default 2); ``ValueError`` naming the parameter and its range."""
    values = query.get("refresh")
    if not values:
        return REFRESH_DEFAULT
    try:
        seconds = float(values[0])
    except ValueError:
        seconds = float("nan")
    if not REFRESH_MIN <= seconds <= REFRESH_MAX:  # also false for nan
        raise ValueError(f"refresh={values[0]!r} is not a number of seconds in {REFRESH_MIN:g}..{REFRESH_MAX:g}")
    return seconds


def render_page(snapshot: dict[str, Any], refresh: float) -> bytes:
    """The HTML page with ``snapshot`` embedded, polling ``status.json`` every ``refresh`` seconds."""
    html = _PAGE.replace("__REFRESH_MS__", str(round(refresh * 1000)))
    return html.replace("__SNAPSHOT__", script_json(snapshot)).encode()


async def answer(source: StatusSource, path: str, query: dict[str, list[str]]) -> Page:
    """The answer at ``path``: the page, its JSON, a 400 for a bad ``refresh``, else a 404 naming the paths."""
    if path == JSON_PATH:
        body = json.dumps(await source.snapshot(), separators=(",", ":")).encode()
        return Page(HTTPStatus.OK, "application/json", body)
    if path in HTML_PATHS:
        try:
            refresh = refresh_seconds(query)
        except ValueError as exc:
            return Page(HTTPStatus.BAD_REQUEST, "text/plain; charset=utf-8", f"error: {exc}\n".encode())
        return Page(HTTPStatus.OK, "text/html; charset=utf-8", render_page(await source.snapshot(), refresh))
    return Page(HTTPStatus.NOT_FOUND, "text/plain",
                b"not found: try / (the status page), /status.json, /metrics, /healthz or /readyz\n")


_PAGE = """<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>querycoord status</title>
<style>
:root { --ink: #1d2430; --mute: #6b7585; --line: #e3e7ee; --good: #1f8a4c; --busy: #b7791f; --bad: #c53030;
        --accent: #2b6cb0; --bg: #f4f6f9; }
* { box-sizing: border-box; }
body { margin: 0; font: 14px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; color: var(--ink);
       background: var(--bg); }
header { background: #1d2430; color: #fff; padding: 12px 20px; display: flex; flex-wrap: wrap; gap: 8px 24px;
         align-items: baseline; }
header h1 { font-size: 18px; margin: 0; }
header .who { color: #cfd6e2; }
header .who b { color: #fff; }
#banner { display: none; background: #fff5f5; color: var(--bad); border-bottom: 1px solid #fed7d7;
          padding: 8px 20px; }
#banner.on { display: block; }
main { padding: 16px 20px; display: grid; gap: 16px; grid-template-columns: repeat(auto-fit, minmax(560px, 1fr)); }
.wide { grid-column: 1 / -1; }
.card { background: #fff; border: 1px solid var(--line); border-radius: 8px; padding: 12px 16px; min-width: 0;
        overflow-x: auto; }
.card h2 { font-size: 15px; margin: 0 0 8px; }
.card h3 { font-size: 13px; margin: 12px 0 4px; color: var(--mute); }
.card h2 .count { color: var(--mute); font-weight: normal; margin-left: 6px; }
table { border-collapse: collapse; width: 100%; }
th, td { text-align: left; padding: 4px 8px; border-bottom: 1px solid var(--line); vertical-align: top; }
th { color: var(--mute); font-weight: 600; font-size: 12px; text-transform: uppercase; white-space: nowrap; }
td.num, th.num { text-align: right; font-variant-numeric: tabular-nums; }
.badge { display: inline-block; padding: 0 7px; border-radius: 10px; font-size: 12px; font-weight: 600;
         background: #edf2f7; color: var(--mute); white-space: nowrap; }
.badge.good { background: #e6f6ec; color: var(--good); }
.badge.busy { background: #fdf3e1; color: var(--busy); }
.badge.bad { background: #fde8e8; color: var(--bad); }
.bar { position: relative; display: inline-block; width: 200px; height: 18px; background: #edf2f7;
       border-radius: 4px; overflow: hidden; vertical-align: middle; }
.bar .fill { position: absolute; left: 0; top: 0; bottom: 0; background: #90cdf4; }
.bar .fill.good { background: #9ae6b4; }
.bar .fill.bad { background: #feb2b2; }
.bar .label { position: relative; padding: 0 6px; font-size: 12px; line-height: 18px; white-space: nowrap; }
.tree { border-left: 3px solid var(--accent); padding: 4px 0 4px 10px; margin: 8px 0; }
.tree .trigger { display: flex; flex-wrap: wrap; gap: 4px 10px; align-items: center; }
.tree ul { list-style: none; margin: 4px 0 0; padding: 0 0 0 14px; font-size: 13px; }
.tree li { padding: 1px 0; }
.tree li::before { content: "\\2514\\2500\\00a0"; color: var(--mute); }
.tree .bar { width: 330px; }
.mute { color: var(--mute); }
.error { color: var(--bad); }
.busy { color: var(--busy); }
.empty { color: var(--mute); margin: 4px 0; }
.stream { margin: 8px 0 12px; }
.stream .head { display: flex; flex-wrap: wrap; gap: 4px 10px; align-items: center; margin-bottom: 4px; }
code, .mono { font-family: ui-monospace, SFMono-Regular, Menlo, monospace; font-size: 12.5px; }
</style>
</head>
<body data-polls="0">
<header>
  <h1>querycoord status</h1>
  <span class="who" id="who"></span>
</header>
<div id="banner"></div>
<noscript><p style="padding: 0 20px">This page draws itself with JavaScript; the same data is at
  <a href="status.json">status.json</a>.</p></noscript>
<main id="status"></main>
<script id="snapshot" type="application/json">__SNAPSHOT__</script>
<script>
"use strict";
(function () {
  const REFRESH_MS = __REFRESH_MS__;
  const main = document.getElementById("status");
  const who = document.getElementById("who");
  const banner = document.getElementById("banner");
  let polls = 0;

  // Every value goes into the page as a text node: nothing a name holds can become markup.
  function el(tag, cls, ...kids) {
    const e = document.createElement(tag);
    if (cls) e.className = cls;
    for (const k of kids.flat(Infinity)) {
      if (k === null || k === undefined || k === false || k === "") continue;
      e.append(k instanceof Node ? k : document.createTextNode(String(k)));
    }
    return e;
  }
  const dash = (v) => (v === null || v === undefined || v === "" ? "-" : String(v));
  const num = (n) => (n === null || n === undefined ? "-" : Number(n).toLocaleString("en-US"));
  function mib(n) {
    if (n === null || n === undefined) return "-";
    const v = n / 1048576;
    if (v === 0) return "0 MiB";
    return v < 10 ? v.toFixed(1) + " MiB" : Math.round(v).toLocaleString("en-US") + " MiB";
  }
  function clock(ms) { return ms ? new Date(ms).toLocaleTimeString("en-GB") : "-"; }
  function span(ms) {
    const s = Math.max(0, ms / 1000);
    if (s < 120) return s.toFixed(s < 10 ? 1 : 0) + "s";
    return s < 7200 ? Math.floor(s / 60) + "m" : Math.floor(s / 3600) + "h";
  }
  function kindOf(word) {
    const w = String(word).toLowerCase();
    if (/fail|error|offline|no answer|nospace|dropping/.test(w)) return "bad";
    if (/^(leader|serving|online|running|done|ok|yes)$/.test(w)) return "good";
    if (/doing|deploy|undo|init|pending|standby|not_serving|starting|watch|stopped|undeployed/.test(w)) return "busy";
    return "";
  }
  const badge = (word, kind) => el("span", "badge " + (kind === undefined ? kindOf(word) : kind), dash(word));
  function bar(pct, label, kind) {
    const p = Math.max(0, Math.min(100, Number(pct) || 0));
    const fill = el("span", "fill " + (kind || ""));
    fill.style.width = p.toFixed(1) + "%";
    return el("span", "bar", fill, el("span", "label", label));
  }
  function table(headers, rows, numeric) {
    const right = new Set(numeric || []);
    const head = el("tr", null, headers.map((h, i) => el("th", right.has(i) ? "num" : null, h)));
    const body = rows.map((r) => el("tr", null, r.map((c, i) => el("td", right.has(i) ? "num" : null,
      c === null || c === undefined ? "-" : c))));
    return el("table", null, el("thead", null, head), el("tbody", null, body));
  }
  function card(id, title, count, wide, ...body) {
    const s = el("section", "card" + (wide ? " wide" : ""),
      el("h2", null, title, count === null ? null : el("span", "count", String(count))), body);
    s.id = id;
    return s;
  }
  function problem(d, name) {
    const why = d.errors && d.errors[name];
    return why ? el("p", "error", "cannot read this part: " + why) : null;
  }
  // What an empty list says, unless it is empty because its part could not be read (``problem`` says why then).
  const none = (text, d, part) => (d && d.errors && d.errors[part] ? null : el("p", "empty", text));
  // Items of a flex line, with a space between them (for the page's text, as copied or read aloud).
  const spaced = (...items) => items.filter((i) => i !== null && i !== undefined && i !== false && i !== "")
    .flatMap((i, n) => (n ? [" ", i] : [i]));

  function header(d) {
    const me = d.this || {};
    const leader = el("b", null, d.leader ? d.leader : "none elected");
    leader.id = "leader";
    who.replaceChildren("root ", el("b", null, dash(d.root)), " \\u00b7 leader ", leader,
      " \\u00b7 this coordinator ", el("b", null, dash(me.address)), " (" + dash(me.role) + ")",
      " \\u00b7 updated " + clock(d.generated_ms) + " (" + span(Date.now() - d.generated_ms) + " ago)");
  }

  function coordinators(d) {
    const rows = d.coordinators.map((c) => [
      el("span", "mono", c.address), num(c.server_id),
      badge(c.role + (c.role === "standby" && c.queue_position !== null ? " #" + c.queue_position : ""),
            kindOf(c.role)),
      c.since ? clock(c.since * 1000) + " (" + span(d.generated_ms - c.since * 1000) + " ago)" : "-",
      dash(c.fence_revision), badge(c.health)]);
    const sw = d.switchover ? el("p", "busy", "switchover in progress: " + dash(d.switchover.from) + " \\u2192 " +
      dash(d.switchover.to)) : null;
    const ctl = d.controls || {balance: {paused: false}, inactive_checkers: []};
    const off = ctl.inactive_checkers.filter((c) => c.name !== "balance").map((c) => c.name);
    const paused = ctl.balance.paused ? el("p", "busy", "balance paused since " + clock(ctl.balance.since_ms) +
      (ctl.balance.by ? " by " + ctl.balance.by : "")) : null;
    if (paused) paused.id = "balance-paused";
    const offLine = off.length ? el("p", "busy", "checkers off: " + off.join(", ")) : null;
    return card("coordinators", "Coordinators", d.coordinators.length, true, problem(d, "cluster"), sw, paused,
      offLine,
      rows.length ? table(["Address", "ID", "Role", "Since", "Fence", "Health"], rows, [1, 4])
                  : none("no coordinator session in etcd", d, "cluster"));
  }

  function queryNodes(d) {
    const rows = d.query_nodes.map((n) => {
      const cap = n.memory_capacity_bytes, used = n.memory_used_bytes;
      const pct = cap ? 100 * (used || 0) / cap : 0;
      const memory = used === null || used === undefined ? dash(mib(cap)) + " offered"
        : bar(pct, mib(used) + " / " + mib(cap) + (cap ? " (" + pct.toFixed(0) + "%)" : ""), pct > 90 ? "bad" : "");
      const drain = n.drain ? n.drain.copies_left + "/" + n.drain.copies_total + " left" +
        (n.drain.waiting ? ", waiting: " + n.drain.waiting : "") : "";
      return [num(n.id), el("span", "mono", n.address), badge(n.state), num(n.segments), num(n.dm_channels), memory,
              el("span", null, dash(n.lifecycle) + (drain ? " (" + drain + ")" : ""))];
    });
    return card("query-nodes", "Query nodes", d.query_nodes.length, true, problem(d, "nodes"),
      rows.length ? table(["ID", "Address", "State", "Segments", "DM channels", "Memory", "Lifecycle"], rows, [0, 3, 4])
                  : none("no query node is registered", d, "nodes"));
  }

  function streamNodes(d) {
    const snodes = new Map(d.streams.snodes.map((s) => [s.node_id, s]));
    const rows = d.stream_nodes.map((n) => {
      const s = snodes.get(n.id);
      return [num(n.id), el("span", "mono", n.address), badge(n.state), (n.vgroups || []).join(", ") || "-",
              s ? ["snode " + s.id + (s.replica_id ? " (replica " + s.replica_id + ") " : " "),
                   badge(s.dropping ? "dropping" : s.live ? "live" : "not live", s.live && !s.dropping ? "good"
                                                                                                  : "bad")] : "-"];
    });
    return [el("h3", null, "Stream nodes (" + d.stream_nodes.length + ")"),
      rows.length ? table(["ID", "Address", "State", "Vgroups", "Snode"], rows, [0])
                  : none("no stream node is registered", d, "cluster")];
  }

  // Health as ``querycoord health`` names it, coloured alike everywhere on the page.
  const HEALTH = { green: "good", yellow: "busy", red: "bad" };
  function collections(d) {
    const rows = d.collections.map((c) => {
      const pct = c.loaded_percentage;
      const kind = c.health ? HEALTH[c.health] : (pct >= 100 ? "good" : "");
      const loaded = pct === null || pct === undefined ? el("span", "mute", "not loaded")
        : bar(pct, pct + "%", kind === "busy" ? "" : kind);
      const health = c.health ? [badge(c.health, HEALTH[c.health] || ""),
                                 c.missing ? el("span", "mute", " " + c.missing) : null] : "-";
      return [num(c.id), c.name === null ? "?" : c.name, dash(c.load_type), num(c.partitions), num(c.segments),
              dash(c.loaded_partitions), health, loaded];
    });
    const counts = ["green", "yellow", "red"].map((h) => d.collections.filter((c) => c.health === h).length);
    const overall = d.health ? el("p", null, "health ", badge(d.health, HEALTH[d.health] || ""),
      el("span", "mute", " " + counts[0] + " green, " + counts[1] + " yellow, " + counts[2] + " red")) : null;
    return card("collections", "Collections", d.collections.length, true, problem(d, "collections"),
      problem(d, "health"), overall,
      rows.length ? table(["ID", "Name", "Load type", "Partitions", "Segments", "Loaded partitions", "Health",
                           "Loaded"], rows, [0, 3, 4, 5])
                  : none("no collection in the catalog", d, "collections"));
  }

  function childLine(c) {
    return el("li", "mono", "#" + c.task_id + " " + c.kind + " ", c.summary ? c.summary + " " : "",
      c.node_id ? "node " + c.node_id + " " : "no node ", badge(c.state),
      c.retries ? " retries " + c.retries : "", c.replaces_task_id ? " replaces #" + c.replaces_task_id : "",
      c.error ? el("span", "error", " " + c.error) : null);
  }

  function tree(t, now) {
    const c = t.child_counts;
    const pct = c.total ? 100 * c.done / c.total : 0;
    const head = el("div", "trigger", ...spaced(el("b", "mono", "#" + t.task_id), el("b", null, t.kind), badge(t.state),
      t.collection_id ? "collection " + t.collection_id : "",
      t.trigger_condition && t.trigger_condition !== "request" ? "(" + t.trigger_condition + ")" : "",
      c.total ? bar(pct, c.done + " / " + c.total + " children done" + (c.doing ? ", " + c.doing + " doing" : "") +
                         (c.failed ? ", " + c.failed + " failed" : ""), c.failed ? "bad" : "") : "",
      t.created_ms ? el("span", "mute", "for " + span(now - t.created_ms)) : "",
      t.error ? el("span", "error", t.error) : null));
    const kids = t.children.map(childLine);
    const hidden = Math.max(c.total, t.children.length) - t.children.length;
    if (hidden > 0) kids.push(el("li", "mute", "\\u2026 " + hidden + " other children"));
    // What it waits for, since when (``querycoord tasks show ID`` lists them all).
    const waits = (t.waits || []).slice(0, 3).map((w) => el("div", w.kind === "retry" ? "error" : "busy",
      "waiting: " + w.text + (w.since_ms ? " (for " + span(now - w.since_ms) + ")" : "")));
    return el("div", "tree", head, waits, kids.length ? el("ul", null, kids) : null);
  }

  function running(d) {
    const trees = d.tasks.running.map((t) => tree(t, d.generated_ms));
    if (d.tasks.running_more) trees.push(none("\\u2026 more running trees: see `querycoord tasks`"));
    return card("running-tasks", "Running task trees", d.tasks.running.length, true, problem(d, "tasks"),
      trees.length ? trees : none("no task is queued or running", d, "tasks"));
  }

  function history(d) {
    const rows = d.tasks.history.map((t) => {
      const c = t.child_counts;
      return [el("span", "mono", "#" + t.task_id), t.kind, badge(t.state), t.collection_id ? num(t.collection_id) : "-",
              num(c.total) + (c.failed ? " (" + c.failed + " failed)" : ""),
              t.finished_ms && t.started_ms ? span(t.finished_ms - t.started_ms) : "-", clock(t.finished_ms),
              t.error ? el("span", "error", t.error) : (t.summary || "")];
    });
    return card("history", "Recent history", d.tasks.history.length, true, problem(d, "tasks"),
      rows.length ? table(["Task", "Kind", "Outcome", "Collection", "Children", "Took", "Finished", "Detail"],
                          rows, [3, 4, 5])
                  : none("no finished task recorded", d, "tasks"));
  }

  function streams(d) {
    const s = d.streams;
    const blocks = s.streams.map((st) => el("div", "stream",
      el("div", "head", ...spaced(el("b", null, st.name), el("span", "mute", "id " + st.id), badge(st.state),
         el("span", "mute", "main snode " + dash(st.main_snode_id) + ", deployed " + st.deploy_times + "x"))),
      el("div", "mute", st.activity),
      el("div", "mute", "progress: " + st.progress),
      st.tasks.length ? table(["Task", "Kind", "Node", "Vgroup", "Snode", "SID", "State", "Processed", "Lag"],
                              st.tasks.map((t) => [
        el("span", "mono", "#" + t.task_id), t.kind, dash(t.node_id || null), dash(t.vgroup_id || null),
        dash(t.snode_id || null), num(t.sid), t.error ? [badge(t.state), el("span", "error", " " + t.error)]
                                                     : badge(t.state), t.processed, t.lag]), [2, 3, 4, 5, 8]) : null,
      st.task_count > st.tasks.length ? none("\\u2026 " + (st.task_count - st.tasks.length) + " other tasks") : null));
    return card("streams", "Streams", s.streams.length, true, problem(d, "streams"),
      s.watching ? el("p", "busy", "the stream manager watches (a new leader listens before it acts)") : null,
      blocks.length ? blocks : none("no stream is defined", d, "streams"), streamNodes(d),
      s.snodes.length ? el("p", "mute", "snodes: " + s.snodes.map((n) => n.id + " on node " + n.node_id +
                                                                   (n.live ? "" : " (not live)") +
                                                                   (n.dropping ? " (dropping)" : "")).join(", "))
                      : null);
  }

  function etcd(d) {
    const e = d.etcd;
    if (!e) return card("etcd", "etcd", null, true, problem(d, "etcd"));
    const rows = e.members.map((m) => {
      const quota = m.db_size_quota;
      const size = quota ? bar(100 * m.db_size / quota, mib(m.db_size) + " of " + mib(quota),
                               m.db_size / quota > 0.8 ? "bad" : "") : mib(m.db_size);
      return [el("span", "mono", m.endpoint), el("span", "mono", dash(m.member_id)), dash(m.version),
              m.is_leader ? badge("yes", "good") : "", size, mib(m.db_size_in_use), num(m.revision),
              m.error ? el("span", "error", m.error) : (m.errors.length ? el("span", "error", m.errors.join("; "))
                                                                         : badge("ok"))];
    });
    const alarms = e.alarms.length
      ? el("p", null, "alarms: ", e.alarms.map((a) => [badge(a.alarm, "bad"), " on member " + a.member_id + " "]))
      : el("p", "mute", "alarms: none");
    return card("etcd", "etcd", e.members.length, true, problem(d, "etcd"),
      table(["Endpoint", "ID", "Version", "Leader", "DB size", "In use", "Revision", "State"], rows, [6]), alarms,
      el("p", "mute", "revision " + num(e.revision) + ", compacted at " + num(e.compacted_revision)));
  }

  function render(d) {
    header(d);
    main.replaceChildren(coordinators(d), queryNodes(d), collections(d), running(d), history(d), streams(d),
                         etcd(d));
  }

  async function poll() {
    try {
      const resp = await fetch("status.json", { cache: "no-store" });
      if (!resp.ok) throw new Error("HTTP " + resp.status + ": " + (await resp.text()).trim());
      const d = await resp.json();
      polls += 1;
      document.body.dataset.polls = String(polls);
      render(d);
      banner.className = "";
    } catch (err) {
      banner.textContent = "cannot refresh from this coordinator (" + err.message + "); showing what it said last";
      banner.className = "on";
    } finally {
      setTimeout(poll, REFRESH_MS);
    }
  }

  try {
    render(JSON.parse(document.getElementById("snapshot").textContent));
  } finally {
    setTimeout(poll, REFRESH_MS);
  }
})();
</script>
</body>
</html>
"""


__all__ = ["HTML_PATHS", "JSON_PATH", "answer", "refresh_seconds", "render_page", "script_json"]
