"""Habits from kubectl, etcdctl and Milvus's tools, run as real processes against `up` with four query nodes:
`collection describe`, `segments` (one row per copy, checked against what the nodes themselves hold), `-o
yaml|wide`, `--no-headers`, `--watch`, `tasks ID` and fish completion; README's describe and segments example
against the real output."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
import yaml

from proto import querynode_pb2
from proto.querynode_pb2_grpc import QueryNodeStub
from tests.test_cli import Up, cli, ok, refused, run_querycoord

ROOT = Path(__file__).resolve().parents[1]
README_SETUP = (("collection", "create", "books", "--partitions", "2", "--segments", "4", "--segment-mb", "0.5"),
                ("collection", "load", "books", "--replicas", "2"))


class Cluster:
    def __init__(self, env: dict[str, str], up: Up) -> None:
        self.env = env
        self.up = up
        self.address = up.wait_ready()

    def node_pid(self, node_id: int) -> int:
        """The pid `up` printed for query node ``node_id``."""
        m = re.search(rf"query node {node_id}\s+\S+\s+\(pid (\d+)", "".join(self.up.out))
        assert m, self.up.out
        return int(m.group(1))

    def run(self, *args: str) -> subprocess.CompletedProcess[str]:
        return cli(self.env, self.address, *args)

    def distribution(self) -> dict[int, querynode_pb2.GetDataDistributionResponse]:
        """What each query node says it holds (GetDataDistribution, asked of the node itself)."""
        out = {}
        for n in json.loads(ok(self.run("nodes", "-o", "json"))):
            with grpc.insecure_channel(n["address"]) as ch:
                out[n["id"]] = QueryNodeStub(ch).GetDataDistribution(
                    querynode_pb2.GetDataDistributionRequest(), timeout=10)
        return out


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    with Up(env, tmp_path_factory.mktemp("habits"), "--nodes", "4") as up:
        c = Cluster(env, up)
        for args in README_SETUP:  # README's example collection first, as a user following it would
            ok(c.run(*args))
        ok(c.run("collection", "create", "c2", "--partitions", "3", "--segments", "12", "--segment-mb", "0.25"))
        ok(c.run("collection", "load", "c2"))
        ok(c.run("collection", "create", "cold", "--segments", "2"))  # never loaded
        yield c


# ----- collection describe ------------------------------------------------------------------------------------------
def test_describe_shows_each_partition_channel_and_replica_as_the_nodes_hold_them(cluster: Cluster) -> None:
    d = json.loads(ok(cluster.run("collection", "describe", "books", "-o", "json")))
    assert d["name"] == "books" and d["segments"] == 4 and d["load"]["replicas"] == 2, d
    assert d["load"] == {"type": "collection", "replicas": 2, "loaded_percentage": 100}, d
    assert [(p["name"], p["state"], p["loaded_percentage"]) for p in d["partitions"]] == [
        ("partition_0", "IN_MEMORY", 100), ("partition_1", "IN_MEMORY", 100)], d
    assert [f["type"] for f in d["schema"]["fields"]] == ["INT64", "FLOAT_VECTOR"], d
    members = {r["id"]: set(r["node_ids"]) for r in d["replicas"]}
    assert len(members) == 2 and not set.intersection(*members.values()), members
    # Every channel is watched once per replica, by a node of that replica which says it watches it.
    held = cluster.distribution()
    watched = {(n, ch.channel_name) for n, dist in held.items() for ch in dist.channels
               if ch.collection_id == d["id"]}
    assert len(d["dm_channels"]) == 2, d
    for ch in d["dm_channels"]:
        assert sorted(w["replica_id"] for w in ch["watched_by"]) == sorted(members), ch
        for w in ch["watched_by"]:
            assert w["node_id"] in members[w["replica_id"]] and (w["node_id"], ch["name"]) in watched, (w, watched)

    # The table says the same: a channel row names each replica's node.
    out = ok(cluster.run("collection", "describe", str(d["id"])))
    assert re.search(r"^Load:\s+collection, 2 replicas, 100% in memory$", out, re.M), out
    for ch in d["dm_channels"]:
        nodes = r"\s+".join(f"node {w['node_id']}" for w in sorted(ch["watched_by"], key=lambda w: w["replica_id"]))
        assert re.search(rf"^{re.escape(ch['name'])}\s+{nodes}$", out, re.M), out
    # -o yaml: the same document as -o json.
    assert yaml.safe_load(ok(cluster.run("collection", "describe", "books", "-o", "yaml"))) == d


def test_describe_a_collection_not_loaded_and_an_unknown_one(cluster: Cluster) -> None:
    d = json.loads(ok(cluster.run("collection", "describe", "cold", "-o", "json")))
    assert d["load"] is None and d["replicas"] is None and d["segments"] == 2, d
    assert all(p["state"] is None for p in d["partitions"]) and all(not c["watched_by"] for c in d["dm_channels"])
    out = ok(cluster.run("collection", "describe", "cold"))
    assert re.search(r"^Load:\s+not loaded$", out, re.M) and "not loaded" in out.split("PARTITION")[1], out
    r = cluster.run("collection", "describe", "no-such-collection")
    refused(r, "no-such-collection")
    assert r.stderr.count("\n") == 1 and r.stdout == "", r


# ----- segments -----------------------------------------------------------------------------------------------------
def test_segments_lists_one_row_per_copy_the_nodes_report(cluster: Cluster) -> None:
    rows = json.loads(ok(cluster.run("segments", "c2", "-o", "json")))
    cid = rows[0]["collection_id"]
    held = cluster.distribution()
    reported = {(s.segment_id, n) for n, dist in held.items() for s in dist.segments if s.collection_id == cid}
    assert {(r["segment_id"], r["node_id"]) for r in rows} == reported and len(rows) == len(reported) == 12, rows
    # c2 is loaded with one replica: every copy in it, named with its partition.
    replicas = json.loads(ok(cluster.run("replicas", "c2", "-o", "json")))
    assert len(replicas) == 1 and {r["replica_id"] for r in rows} == {replicas[0]["id"]}, (rows, replicas)
    assert {r["partition"] for r in rows} == {"partition_0", "partition_1", "partition_2"}
    assert all(r["state"] == "SEALED" and r["num_rows"] > 0 for r in rows), rows
    by_copy = {(s.segment_id, n): s for n, dist in held.items() for s in dist.segments}
    for r in rows:
        s = by_copy[(r["segment_id"], r["node_id"])]
        assert (r["mem_size_bytes"], r["num_rows"]) == (s.mem_size, s.num_rows), (r, s)

    # Two replicas: each segment twice, once in each replica, on a node of that replica.
    books = json.loads(ok(cluster.run("segments", "books", "-o", "json")))
    members = {r["id"]: set(r["node_ids"]) for r in json.loads(ok(cluster.run("replicas", "books", "-o", "json")))}
    assert len(books) == 8 and all(r["node_id"] in members[r["replica_id"]] for r in books), (books, members)
    assert all(sorted(r["replica_id"] for r in books if r["segment_id"] == sid) == sorted(members)
               for sid in {r["segment_id"] for r in books}), books

    # --segments filters (ids comma or space separated); the table has a row per copy.
    a, b = sorted({r["segment_id"] for r in books})[:2]
    out = ok(cluster.run("segments", "books", "--segments", f"{a},{b}"))
    lines = out.splitlines()
    assert lines[0].split() == ["SEGMENT", "PARTITION", "NODE", "REPLICA", "SIZE", "ROWS", "STATE"], out
    assert sorted(int(line.split()[0]) for line in lines[2:]) == [a, a, b, b], out
    wide = ok(cluster.run("segments", "books", "--segments", str(a), "-o", "wide")).splitlines()
    assert wide[0].split()[-3:] == ["DM", "CHANNEL", "INDEXES"] and len(wide) == 4, wide
    assert "rootcoord-dml" in wide[2], wide


def test_segments_refusals(cluster: Cluster) -> None:
    r = cluster.run("segments", "books", "--segments", "x1")
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "--segments" in r.stderr, r
    refused(cluster.run("segments", "books", "--segments", "999999"), "999999", "not loaded")
    refused(cluster.run("segments", "nowhere"), "nowhere")
    out = ok(cluster.run("segments", "cold"))
    assert "not loaded" in out and "collection load cold" in out, out


# ----- -o yaml|wide, --no-headers -----------------------------------------------------------------------------------
def test_yaml_is_the_json_document_and_no_headers_drops_the_header_lines(cluster: Cluster) -> None:
    for args in (("nodes",), ("collection", "show"), ("replicas", "books"), ("tasks", "--all")):
        as_json = json.loads(ok(cluster.run(*args, "-o", "json")))
        assert yaml.safe_load(ok(cluster.run(*args, "-o", "yaml"))) == as_json, args
    table = ok(cluster.run("nodes")).splitlines()
    bare = ok(cluster.run("nodes", "--no-headers")).splitlines()
    assert table[0].startswith("ID") and [line.split() for line in bare] == [line.split() for line in table[2:]]
    assert len(bare) == 4, bare
    # Every table of a command follows it: collection show draws two.
    shown = ok(cluster.run("collection", "show", "--no-headers"))
    assert "ID" not in shown.split() and "REPLICA" not in shown and "─" not in shown, shown


def test_wide_adds_columns_where_a_command_has_them(cluster: Cluster) -> None:
    nodes = ok(cluster.run("nodes", "-o", "wide")).splitlines()
    assert nodes[0].endswith("DRAIN  RE-REPLICATES AT"), nodes
    assert len(nodes) == 6 and all(line.endswith("-") for line in nodes[2:]), nodes
    tasks = ok(cluster.run("tasks", "--all", "-o", "wide"))
    load = next(line for line in tasks.splitlines() if "LoadCollection" in line)
    assert re.search(r"  nodes [\d,]+ \(children #\d+-#\d+\)$", load), tasks
    # Where a command has no wide columns, wide is its table.
    assert ok(cluster.run("replicas", "books", "-o", "wide")) == ok(cluster.run("replicas", "books"))


# ----- tasks ID -----------------------------------------------------------------------------------------------------
def test_tasks_id_is_tasks_show_id(cluster: Cluster) -> None:
    first = json.loads(ok(cluster.run("tasks", "--history", "-o", "json")))[-1]
    tid = str(first["task_id"])
    assert ok(cluster.run("tasks", tid)) == ok(cluster.run("tasks", "show", tid))
    assert json.loads(ok(cluster.run("tasks", tid, "-o", "json"))) == json.loads(
        ok(cluster.run("tasks", "show", tid, "-o", "json")))
    # The options and the other forms still work.
    assert "LoadCollection" in ok(cluster.run("tasks", "--history"))
    assert ok(cluster.run("tasks", "--task", tid)) == ok(cluster.run("tasks", tid))
    for bad, fragment in ((("tasks", "0"),  "at least 1"), (("tasks", "nine"), "invalid choice"),
                          (("tasks", tid, "7"), "unexpected argument 7")):
        r = cluster.run(*bad)
        assert r.returncode == 2 and r.stderr.count("\n") == 1 and fragment in r.stderr, (bad, r)
    refused(cluster.run("tasks", "987654321"), "987654321")


# ----- --watch ------------------------------------------------------------------------------------------------------
def _frames(proc: subprocess.Popen[str], count: int, timeout: float = 60) -> list[str]:
    """The first ``count`` frames a watching process printed (each starts with its ``Every ...`` header)."""
    assert proc.stdout is not None
    lines: list[str] = []
    deadline = time.monotonic() + timeout
    while sum(line.startswith("Every ") for line in lines) <= count and time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        lines.append(line)
    text = "".join(lines)
    return [f for f in re.split(r"^(?=Every )", text, flags=re.M) if f.strip()][:count]


@pytest.mark.parametrize("command", [("nodes",), ("collection", "describe", "books"), ("segments", "books"),
                                     ("tasks", "--all")])
def test_watch_redraws_until_ctrl_c_which_ends_it_quietly(cluster: Cluster, command: tuple[str, ...]) -> None:
    proc = run_querycoord(["--address", cluster.address, *command, "--watch", "--interval", "0.2"], cluster.env,
                          ignoring_sigint=True)
    try:
        frames = _frames(proc, 2)
        assert len(frames) == 2, frames
        once = ok(cluster.run(*command))
        for frame in frames:
            head, _, body = frame.partition("\n\n")
            assert re.fullmatch(rf"Every 0.2s: querycoord .*{command[0]}.* \d{{4}}-\d\d-\d\d \d\d:\d\d:\d\d", head)
            assert [line.split()[:2] for line in body.strip().splitlines()] == [
                line.split()[:2] for line in once.strip().splitlines()], (frame, once)
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=30) == 0
        assert proc.stderr is not None and proc.stderr.read() == ""
    finally:
        proc.kill()
        proc.wait()


def test_watch_json_is_a_stream_of_documents_and_a_failing_first_frame_ends_it(cluster: Cluster) -> None:
    proc = run_querycoord(["--address", cluster.address, "replicas", "books", "-w", "-o", "json", "--interval",
                           "0.2"], cluster.env, ignoring_sigint=True)
    try:
        assert proc.stdout is not None
        docs, text, decoder = [], "", json.JSONDecoder()
        deadline = time.monotonic() + 60
        while len(docs) < 3 and time.monotonic() < deadline:
            text += proc.stdout.readline()
            try:
                doc, end = decoder.raw_decode(text.strip())
            except json.JSONDecodeError:
                continue
            docs.append(doc)
            text = text.strip()[end:]
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=30) == 0
        assert len(docs) == 3 and docs[0] == docs[1] == json.loads(ok(cluster.run("replicas", "books", "-o", "json")))
    finally:
        proc.kill()
        proc.wait()
    # An unknown collection stays unknown: one error line, exit 1, no frame.
    r = cluster.run("collection", "describe", "nope", "--watch", "--interval", "0.2")
    refused(r, "nope")
    assert r.stdout == "" and r.stderr.count("\n") == 1, r
    # A watch never repeats a change.
    r = cluster.run("tasks", "cancel", "1", "--watch")
    assert r.returncode == 2 and "--watch" in r.stderr and r.stderr.count("\n") == 1, r
    r = cluster.run("nodes", "--watch", "--interval", "0")
    assert r.returncode == 2 and "--interval" in r.stderr and r.stderr.count("\n") == 1, r


# ----- fish completion ----------------------------------------------------------------------------------------------
def test_fish_completion_names_every_command_and_parses(tmp_path: Path) -> None:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    r = subprocess.run([sys.executable, "-m", "querycoord.cli", "completion", "fish"], capture_output=True,
                       text=True, env=env, timeout=60)
    script = ok(r)
    assert script.startswith("# fish completion for querycoord"), script[:200]
    for word in ("-a collection", "-a describe", "-a segments", "-a tasks", "-l watch", "-l no-headers",
                 "-l output -x -a 'table wide json yaml'", "__fish_seen_subcommand_from collection"):
        assert word in script, word
    fish = shutil.which("fish")
    if fish is None:
        return
    path = tmp_path / "querycoord.fish"
    path.write_text(script)
    assert subprocess.run([fish, "-n", str(path)], capture_output=True, timeout=60).returncode == 0
    # What fish offers after `querycoord collection `: its sub-commands, describe among them.
    done = subprocess.run([fish, "--no-config", "-c", f"source {path}; complete -C 'querycoord collection '"],
                          capture_output=True, text=True, timeout=60, env=dict(env, HOME=str(tmp_path)))
    offered = {line.split("\t")[0] for line in done.stdout.splitlines()}
    assert {"create", "load", "describe", "show", "drop"} <= offered, done.stdout + done.stderr


# ----- README's example ---------------------------------------------------------------------------------------------
def _normalize(line: str) -> str:
    """A line with what varies between clusters masked: times, then every number; rules and gaps to one."""
    line = re.sub(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d", "TIME", line)
    line = re.sub(r"\d+", "#", line)
    line = re.sub(r"─+", "─", line)
    return " ".join(line.split())


def test_readme_describe_and_segments_example_is_the_real_output(cluster: Cluster) -> None:
    text = (ROOT / "README.md").read_text()
    section = text[text.index("### Output formats, watching, describing"):text.index("### Task history")]
    for args in README_SETUP:  # the set-up the example names is the one the cluster ran
        assert f"`querycoord {' '.join(args)}`" in section, args
    block = section[section.index("```text\n") + 8:]
    block = block[:block.index("```")]
    commands: list[tuple[str, list[str]]] = []
    for line in block.rstrip("\n").split("\n"):
        if line.startswith("$ "):
            commands.append((line[2:], []))
        else:
            commands[-1][1].append(line)
    assert [c for c, _ in commands] == ["querycoord collection describe books", "querycoord segments books"]
    for command, expected in commands:
        got = ok(cluster.run(*command.split()[1:])).rstrip("\n").split("\n")
        assert [_normalize(x) for x in got] == [_normalize(x) for x in expected], "\n".join(got)


# ----- last: a node dies (the cluster is not whole after this) ----------------------------------------------------
def test_a_lost_watcher_shows_as_none_and_its_copies_leave_segments(cluster: Cluster) -> None:
    """A watcher SIGKILLed: `up` restarts it under its id, empty. With nothing repairing, describe names a watcher
    and segments lists a copy only where a node says it holds it: the restarted node is named for nothing."""
    for checker in ("replicas", "segments", "channels", "balance"):  # nothing repairs while the test looks
        ok(cluster.run("checkers", "deactivate", checker))
    d = json.loads(ok(cluster.run("collection", "describe", "books", "-o", "json")))
    victim = d["dm_channels"][0]["watched_by"][0]
    os.kill(cluster.node_pid(victim["node_id"]), signal.SIGKILL)
    cluster.up.wait_line(f"restarted: query node {victim['node_id']} ", timeout=90)
    deadline = time.monotonic() + 60
    while not any(n["id"] == victim["node_id"] and n["state"] == "online"
                  for n in json.loads(ok(cluster.run("nodes", "-o", "json")))):
        assert time.monotonic() < deadline, "the restarted node never came back online"
        time.sleep(0.3)
    d = json.loads(ok(cluster.run("collection", "describe", "books", "-o", "json")))
    held = cluster.distribution()
    watched = {(n, ch.channel_name) for n, dist in held.items() for ch in dist.channels}
    for ch in d["dm_channels"]:
        for w in ch["watched_by"]:
            assert w["node_id"] == 0 or (w["node_id"], ch["name"]) in watched, (w, ch["name"], watched)
    lost = next((w for w in d["dm_channels"][0]["watched_by"] if w["replica_id"] == victim["replica_id"]), None)
    assert lost is None or lost["node_id"] == 0, d
    row = next(line for line in ok(cluster.run("collection", "describe", "books")).splitlines()
               if line.startswith(d["dm_channels"][0]["name"]))
    assert "-" in row.split()[1:], row
    # GetSegmentInfo lists what online nodes report: nothing on the restarted (empty) node, every other copy.
    rows = json.loads(ok(cluster.run("segments", "books", "-o", "json")))
    assert rows and victim["node_id"] not in {r["node_id"] for r in rows}, rows
    assert {(r["segment_id"], r["node_id"]) for r in rows} == {
        (s.segment_id, n) for n, dist in held.items() for s in dist.segments if s.collection_id == d["id"]}
