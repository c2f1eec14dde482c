"""The coordinators' status page (``/``, ``/status.json`` on ``--http-listen``) against a real cluster: in headless
Chromium during a load (what the DOM shows once the page's script ran, and a screenshot kept in the test's
output directory), and over plain HTTP (the JSON's shape, a standby's page, escaping of a hostile name)."""

from __future__ import annotations

import asyncio
import json
import re
import shutil
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Awaitable, Callable
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from meta.kv import MetaKV
from meta.ops.etcd_server import EtcdCluster
from proto import catalog_pb2, common_pb2
from proto import querycoord_pb2 as qc
from querycoord.catalog.store import CatalogStore, collection_key
from querycoord.console.actions import create_snode, create_stream_answer
from querycoord.console.status_page import script_json
from querycoord.net.client import QueryCoordClient
from tests.spawn import MID_LOAD_FLAGS, Processes, Spawned, spawn_snode_host

HTTP = ("--http-listen", "127.0.0.1:0")
HOSTILE = "<script>alert(1)</script>"
# Node calls of a second, two children at a time, a few segments each: the load runs for about twenty seconds,
# long past the time the browser needs to draw the page.
SEGMENTS = 400
SLOW_LOAD = (*MID_LOAD_FLAGS, "--max-request-bytes", "1500")
SLOW_NODE = ("--ttl", "2", "--latency-ms", "1000", "--capacity-mb", "2048")
BROWSER_TIMEOUT = 120.0


# ----- the browser ---------------------------------------------------------------------------------------------------
@pytest.fixture(scope="session")
def chromium() -> str:
    """Debian's headless Chromium, installed with apt-get when missing (a failed install fails the test: the page
    is only tested in a browser)."""
    found = shutil.which("chromium")
    if found:
        return found
    try:
        install = subprocess.run(
            ["bash", "-c", "apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y chromium"],
            capture_output=True, text=True, timeout=1200, check=False)
        why = f"exit {install.returncode}: {(install.stderr or install.stdout).strip()[-600:]}"
    except (OSError, subprocess.TimeoutExpired) as exc:
        why = repr(exc)
    found = shutil.which("chromium")
    if not found:
        pytest.fail(f"the status page test needs headless Chromium; `apt-get install -y chromium` failed ({why})",
                    pytrace=False)
    return found


async def browse(chromium: str, profile: Path, url: str, *mode: str) -> str:
    """Run headless Chromium on ``url`` in ``mode`` (``--dump-dom`` or ``--screenshot=PATH``) with virtual time
    enough for the page's script to poll ``status.json`` a few times; its standard output."""
    argv = [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run",
            "--no-default-browser-check", "--hide-scrollbars", f"--user-data-dir={profile}",
            "--virtual-time-budget=6000", *mode, url]
    proc = await asyncio.create_subprocess_exec(*argv, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    try:
        out, err = await asyncio.wait_for(proc.communicate(), BROWSER_TIMEOUT)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        raise AssertionError(f"chromium did not finish {mode} within {BROWSER_TIMEOUT:g}s") from None
    assert proc.returncode == 0, f"chromium {mode} exited {proc.returncode}: {err.decode()[-2000:]}"
    return out.decode()


_MEASURE = """<script>
window.addEventListener("load", () => setTimeout(() => {
  const cards = {};
  for (const c of document.querySelectorAll("section.card")) {
    cards[c.id] = {scroll: c.scrollWidth, client: c.clientWidth, right: Math.ceil(c.getBoundingClientRect().right)};
  }
  document.body.setAttribute("data-layout", JSON.stringify({width: window.innerWidth, cards: cards}));
}, 300));
</script>
"""


async def measure_layout(chromium: str, tmp_path: Path, proc: Spawned, width: int) -> dict[str, Any]:
    """Each card's box as Chromium lays the page out ``width`` px wide: the page as served (its snapshot
    embedded), saved with a script that writes the boxes into the body, dumped. The served page runs only its own
    two scripts, so the measuring one runs in this local copy (which draws from the same embedded snapshot)."""
    code, _, html = await get(proc, "/")
    assert code == 200, code
    page = tmp_path / "layout.html"
    page.write_text(html.replace("</body>", _MEASURE + "</body>"))
    dom = Dom(await browse(chromium, tmp_path / "profile", page.as_uri(), "--dump-dom",
                           f"--window-size={width},1500"))
    layout: dict[str, Any] = json.loads(dom.body["data-layout"])
    return layout


class Dom(HTMLParser):
    """What a dumped DOM shows: the text under each element with an id, the rows (cell texts) of the tables
    under each id, the body's attributes and the script elements' contents."""

    VOID = frozenset({"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source", "track",
                      "wbr"})

    def __init__(self, html: str):
        super().__init__(convert_charrefs=True)
        self.texts: dict[str, list[str]] = {}
        self.rows: dict[str, list[list[str]]] = {}  # body rows (of td cells) only
        self.body: dict[str, str] = {}
        self.scripts: list[str] = []
        self._open: list[tuple[str, str | None]] = []  # (tag, id)
        self._row: list[str] | None = None
        self._cell: list[str] | None = None
        self._body_row = False
        self.feed(html)

    def _ids(self) -> list[str]:
        return [i for _, i in self._open if i]

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        if tag == "body":
            self.body = {k: v or "" for k, v in a.items()}
        if tag == "script":
            self.scripts.append("")
        if tag == "tr":
            self._row, self._body_row = [], False
        elif tag in ("td", "th") and self._row is not None:
            self._cell = []
            self._body_row |= tag == "td"
        if tag not in self.VOID:
            self._open.append((tag, a.get("id")))
            if a.get("id"):
                self.texts.setdefault(str(a["id"]), [])

    def handle_endtag(self, tag: str) -> None:
        if tag in ("td", "th") and self._cell is not None and self._row is not None:
            self._row.append(" ".join("".join(self._cell).split()))
            self._cell = None
        elif tag == "tr" and self._row is not None:
            for i in self._ids():
                if self._body_row:
                    self.rows.setdefault(i, []).append(self._row)
            self._row = None
        while self._open:
            top, _ = self._open.pop()
            if top == tag:
                break

    def handle_data(self, data: str) -> None:
        if self._open and self._open[-1][0] == "script":
            self.scripts[-1] += data
            return
        for i in self._ids():
            self.texts[i].append(data)
        if self._cell is not None:
            self._cell.append(data)

    def text(self, element_id: str) -> str:
        assert element_id in self.texts, f"no element #{element_id} in the page"
        return " ".join("".join(self.texts[element_id]).split())

    def table(self, element_id: str) -> list[list[str]]:
        """The body rows (not the headers) of the tables under ``element_id``, as cell texts."""
        return self.rows.get(element_id, [])


# ----- HTTP --------------------------------------------------------------------------------------------------------
def _get(url: str, headers: dict[str, str]) -> tuple[int, dict[str, str], str]:
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=15) as resp:
            return resp.status, dict(resp.headers), resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers), exc.read().decode()


async def get(proc: Spawned, path: str, headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], str]:
    return await asyncio.to_thread(_get, f"http://{proc.ready['http_address']}{path}", headers or {})


async def status_json(proc: Spawned) -> dict[str, Any]:
    code, headers, body = await get(proc, "/status.json")
    assert code == 200 and headers["Content-Type"] == "application/json", body
    return dict(json.loads(body))


async def until(what: str, check: Callable[[], Awaitable[bool]], timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not await check():
        assert time.monotonic() < deadline, f"never: {what}"
        await asyncio.sleep(0.2)


def load_state(status: dict[str, Any], cid: int) -> int | None:
    return next((c["loaded_percentage"] for c in status["collections"] if c["id"] == cid), None)


def history_ids(status: dict[str, Any]) -> list[int]:
    return [t["task_id"] for t in status["tasks"]["history"]]


async def plant_hostile_name(kv: MetaKV, catalog: CatalogStore) -> catalog_pb2.CollectionDescription:
    """A collection whose record names it ``HOSTILE``: the catalog refuses such a name, so it is written into etcd
    as an outside hand (or a catalog of another make) would."""
    desc = await catalog.create_collection("hostile")
    desc.name = HOSTILE
    await kv.save(collection_key(desc.collection_id), desc.SerializeToString())
    return desc


async def load(client: QueryCoordClient, cid: int) -> int:
    r = await client.query("LoadCollection", qc.LoadCollectionRequest(collection_id=cid))
    assert r.status.error_code == common_pb2.SUCCESS, r
    return int(r.task_id)


# ----- the tests ---------------------------------------------------------------------------------------------------
@pytest.mark.timeout(1500)  # the first run may install Chromium
async def test_status_page_in_a_browser_during_a_load(etcd: EtcdCluster, root_path: str, kv: MetaKV,
                                                      tmp_path: Path, chromium: str) -> None:
    async with Processes(etcd, root_path, tmp_path) as procs:
        leader = await procs.coordinator(*SLOW_LOAD, *HTTP, name="coord-a")
        await leader.next_event("leader", timeout=60)
        standby = await procs.coordinator(*SLOW_LOAD, name="coord-b")
        nodes = [await procs.query_node(*SLOW_NODE, name=f"querynode-{i}") for i in range(2)]
        catalog = CatalogStore(kv)
        desc, _ = await catalog.create_bulk_collection("status_page", num_partitions=2, num_segments=SEGMENTS)
        hostile = await plant_hostile_name(kv, catalog)
        cid = desc.collection_id
        client = QueryCoordClient([leader.address], deadline=60)
        try:
            await until("both nodes and the standby on the page", lambda: _sees(leader, nodes, standby))
            task_id = await load(client, cid)

            async def loading() -> bool:
                s = await status_json(leader)
                held = sum(n["segments"] or 0 for n in s["query_nodes"])
                return held > 0 and task_id in [t["task_id"] for t in s["tasks"]["running"]]

            await until("the load under way on the page", loading)
            url = f"http://{leader.ready['http_address']}/"
            dom = Dom(await browse(chromium, tmp_path / "profile", url, "--dump-dom"))
            shot = tmp_path / "status-page.png"
            await browse(chromium, tmp_path / "profile", url, f"--screenshot={shot}", "--window-size=1400,1500")
            layout = await measure_layout(chromium, tmp_path, leader, width=1400)
            during = await status_json(leader)
        finally:
            await client.close()
        print(f"status page screenshot (during the load): {shot}")
        # At 1,400 px every card holds its content: nothing scrolls sideways inside a card, no card passes the edge.
        assert layout["width"] == 1400, layout
        assert "query-nodes" in layout["cards"], layout
        for name, box in layout["cards"].items():
            assert box["scroll"] <= box["client"] and box["right"] <= layout["width"], (name, box)
        assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 10_000
        pct = load_state(during, cid)
        assert pct is not None and pct < 100, f"the page was drawn during the load (at {pct}% after it)"

        # What the page showed, once its script had drawn it and polled status.json.
        assert int(dom.body.get("data-polls", "0")) >= 1, "the page's script polled status.json"
        assert dom.text("leader") == leader.address
        coordinators = {r[0]: r for r in dom.table("coordinators")}
        assert set(coordinators) == {leader.address, standby.address}
        assert coordinators[leader.address][2] == "leader" and coordinators[standby.address][2] == "standby #1"
        node_rows = {int(r[0]): r for r in dom.table("query-nodes")}
        assert set(node_rows) == {n.node_id for n in nodes}, node_rows
        held = [int(r[3].replace(",", "")) for r in node_rows.values()]
        assert sum(held) > 0, node_rows
        assert all("MiB /" in r[5] for r in node_rows.values()), "a memory bar per node"
        collections = {r[1]: r for r in dom.table("collections")}
        assert re.fullmatch(r"\d{1,2}%", collections["status_page"][-1]), collections["status_page"]
        # The hostile name is shown as text: in the dump it is a text node, not an element, and no script ran it.
        assert collections[HOSTILE][0] == str(hostile.collection_id)
        assert collections[HOSTILE][-1] == "not loaded"
        assert len(dom.scripts) == 2, "the embedded snapshot and the page's script, no other"
        assert dom.scripts[0].lstrip().startswith("{") and "alert(1)" not in dom.scripts[1]
        running = dom.text("running-tasks")
        assert f"#{task_id} LoadCollection" in running and f"collection {cid}" in running, running
        assert "children done" in running and "LoadSegment" in running, running
        etcd_rows = dom.table("etcd")
        assert len(etcd_rows) == 1 and etcd_rows[0][0] in etcd.endpoints and etcd_rows[0][-1] == "ok", etcd_rows
        assert "alarms: none" in dom.text("etcd")

        # Once the load is done it is in the recent history, on the page too.
        await until("the load in the history", lambda: _finished(leader, task_id, cid), timeout=180)
        after = Dom(await browse(chromium, tmp_path / "profile", url, "--dump-dom"))
        history = {r[0]: r for r in after.table("history")}
        assert f"#{task_id}" in history, history
        assert history[f"#{task_id}"][1:3] == ["LoadCollection", "DONE"], history[f"#{task_id}"]
        assert {r[1]: r for r in after.table("collections")}["status_page"][-1] == "100%"


async def _sees(proc: Spawned, nodes: list[Spawned], standby: Spawned) -> bool:
    s = await status_json(proc)
    return ({n["id"] for n in s["query_nodes"]} == {n.node_id for n in nodes}
            and (standby.address, "standby") in [(c["address"], c["role"]) for c in s["coordinators"]])


async def _finished(proc: Spawned, task_id: int, cid: int) -> bool:
    s = await status_json(proc)
    return task_id in history_ids(s) and load_state(s, cid) == 100


async def test_status_json_on_leader_and_standby_and_escaping(etcd: EtcdCluster, root_path: str, kv: MetaKV,
                                                              tmp_path: Path) -> None:
    async with Processes(etcd, root_path, tmp_path) as procs:
        leader = await procs.coordinator("--stream-scale", "0.1", *HTTP, name="coord-a")
        await leader.next_event("leader", timeout=60)
        standby = await procs.coordinator("--stream-scale", "0.1", *HTTP, name="coord-b")
        node = await procs.query_node("--ttl", "2", name="querynode")
        snode_host = procs.keep(await spawn_snode_host(etcd, root_path, tmp_path, "1", name="streamnode"))
        catalog = CatalogStore(kv)
        desc, _ = await catalog.create_bulk_collection("plain", num_partitions=1, num_segments=12)
        hostile = await plant_hostile_name(kv, catalog)
        async with QueryCoordClient([leader.address], deadline=60) as client:
            await until("the node on the page", lambda: _has_node(leader, node))
            task_id = await load(client, desc.collection_id)
            snode = await create_snode(client, snode_host.node_id)
            await until("the snode live", lambda: _snode_live(leader))
            stream = (await create_stream_answer(client, "s1", vgroups=[1], runner_deploys=1)).stream
            await until("the load done and in the history", lambda: _finished(leader, task_id, desc.collection_id))
            await until("the stream running", lambda: _stream_running(leader))

        s = await status_json(leader)
        assert set(s) == {"generated_ms", "root", "this", "leader", "switchover", "controls", "coordinators",
                          "query_nodes", "stream_nodes", "collections", "health", "tasks", "streams", "etcd", "errors"}
        assert s["controls"] == {"balance": {"paused": False, "since_ms": 0, "by": ""}, "inactive_checkers": []}
        assert s["errors"] == {}, s["errors"]
        assert s["root"] == root_path and s["leader"] == leader.address and s["switchover"] is None
        assert s["this"]["address"] == leader.address and s["this"]["role"] == "leader"
        assert abs(s["generated_ms"] / 1000 - time.time()) < 600
        assert [(c["address"], c["role"], c["health"]) for c in s["coordinators"]] == [
            (leader.address, "leader", "SERVING"), (standby.address, "standby", "NOT_SERVING")]
        [n] = s["query_nodes"]
        assert (n["id"], n["address"], n["state"], n["segments"]) == (node.node_id, node.address, "online", 12)
        assert n["memory_used_bytes"] > 0 and n["memory_capacity_bytes"] > n["memory_used_bytes"]
        by_id = {c["id"]: c for c in s["collections"]}
        assert by_id[desc.collection_id]["loaded_percentage"] == 100 and by_id[desc.collection_id]["name"] == "plain"
        assert (s["health"], by_id[desc.collection_id]["health"], by_id[desc.collection_id]["missing"]) == (
            "green", "green", ""), "CheckHealth's colours, as `querycoord health` names them"
        assert by_id[hostile.collection_id]["name"] == HOSTILE and by_id[hostile.collection_id]["load_type"] is None
        assert by_id[hostile.collection_id]["health"] is None, "not loaded: no colour"
        assert s["tasks"]["running"] == [] or all(t["task_id"] != task_id for t in s["tasks"]["running"])
        [done] = [t for t in s["tasks"]["history"] if t["task_id"] == task_id]
        assert (done["kind"], done["state"], done["collection_id"]) == ("LoadCollection", "DONE", desc.collection_id)
        assert done["child_counts"]["total"] >= 1 and done["finished_ms"] >= done["started_ms"] > 0
        [s1] = s["streams"]["streams"]
        assert (s1["id"], s1["name"], s1["state"], s1["main_snode_id"]) == (stream.id, "s1", "running", snode.id)
        assert "nothing to do" in s1["activity"] and s1["task_count"] == len(s1["tasks"]) > 0
        assert {t["kind"] for t in s1["tasks"]} >= {"trigger reader", "trigger"}
        assert all(t["state"] == "RUNNING" and t["sid"] >= 1 and t["node_id"] == snode_host.node_id
                   for t in s1["tasks"]), s1["tasks"]
        assert s["streams"]["snodes"] == [{"id": snode.id, "node_id": snode_host.node_id, "replica_id": 0,
                                           "dropping": False, "live": True}]
        assert [(n["id"], n["vgroups"]) for n in s["stream_nodes"]] == [(snode_host.node_id, [1])]
        [member] = s["etcd"]["members"]
        assert member["endpoint"] in etcd.endpoints and member["error"] == "" and re.fullmatch(r"[0-9a-f]+",
                                                                                               member["member_id"])
        assert s["etcd"]["alarms"] == [] and s["etcd"]["revision"] > 0

        # A standby's page: the same cluster (what only the leader knows, asked of it), saying it stands by.
        t = await status_json(standby)
        assert t["errors"] == {}, t["errors"]
        assert t["this"]["role"] == "standby" and t["leader"] == leader.address
        assert [(n["id"], n["segments"]) for n in t["query_nodes"]] == [(node.node_id, 12)]
        assert {c["id"]: c["loaded_percentage"] for c in t["collections"]}[desc.collection_id] == 100
        assert t["health"] == "green", "the leader's answer, asked by the standby"
        assert task_id in history_ids(t)
        assert [x["state"] for x in t["streams"]["streams"]] == ["running"], "the leader's stream states"

        # The HTML: the hostile name only as escaped JSON in the embedded snapshot, which parses back to it.
        for path in ("/", "/status", "/?refresh=5"):
            code, headers, html = await get(leader, path)
            assert code == 200 and headers["Content-Type"] == "text/html; charset=utf-8", (path, html[:200])
            assert headers["Cache-Control"] == "no-store"
            assert HOSTILE not in html and "alert(1)</script>" not in html
            assert "\\u003cscript\\u003ealert(1)\\u003c/script\\u003e" in html
            embedded = re.search(r'<script id="snapshot" type="application/json">(.*?)</script>', html, re.S)
            assert embedded is not None
            names = {c["id"]: c["name"] for c in json.loads(embedded.group(1))["collections"]}
            assert names[hostile.collection_id] == HOSTILE
            assert "const REFRESH_MS = 5000;" in html or path != "/?refresh=5"
        # Bad input: one clear error; an unknown path names the pages there are.
        for bad in ("abc", "0", "1e9", "nan"):
            code, _, body = await get(leader, f"/?refresh={bad}")
            assert code == 400 and body.startswith("error: refresh=") and len(body.splitlines()) == 1, body
        code, _, body = await get(leader, "/nothing")
        assert code == 404 and "/status.json" in body
        # Development mode (no security setting): the page asks for no credential and answers any Host, as before.
        code, _, body = await get(leader, "/status.json", {"Host": "rebound.example"})
        assert code == 200 and json.loads(body)["leader"] == leader.address


async def _stream_running(proc: Spawned) -> bool:
    streams = (await status_json(proc))["streams"]["streams"]
    return bool(streams) and streams[0]["state"] == "running" and all(t["state"] == "RUNNING"
                                                                       for t in streams[0]["tasks"])


async def _snode_live(proc: Spawned) -> bool:
    return any(n["live"] for n in (await status_json(proc))["streams"]["snodes"])


async def _has_node(proc: Spawned, node: Spawned) -> bool:
    return any(n["id"] == node.node_id and n["segments"] is not None for n in (await status_json(proc))["query_nodes"])


@given(st.text())
def test_embedded_json_cannot_end_its_script_element(text: str) -> None:
    encoded = script_json({"name": text, "tail": "</script><!--"})
    assert not set(encoded) & {"<", ">", "&", "\u2028", "\u2029"}
    assert json.loads(encoded) == {"name": text, "tail": "</script><!--"}
