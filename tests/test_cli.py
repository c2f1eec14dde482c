"""The command line, run as real processes: `etcd`, `up` and the client commands against it; the drawing helpers."""

from __future__ import annotations

import io
import queue
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

from proto import querycoord_pb2 as qc
from querycoord.console import draw
from tests import procs


def sigint_ignored(argv: list[str]) -> list[str]:
    """``argv`` started as a shell starts a background job: with SIGINT ignored, inherited through exec. Ctrl-C
    must still end a command so started (a suite run as `make test &` once left every child so)."""
    return ["bash", "-c", 'trap "" INT; exec "$@"', "bash", *argv]


def run_querycoord(args: list[str], env: dict[str, str], *, ignoring_sigint: bool = False,
                   **kw) -> subprocess.Popen[str]:
    argv = [sys.executable, "-m", "querycoord.cli", *args]
    return subprocess.Popen(sigint_ignored(argv) if ignoring_sigint else argv,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, **kw)


def test_etcd_command_runs_in_foreground_and_stops_on_sigterm(subprocess_env, tmp_path) -> None:
    proc = run_querycoord(["etcd", "--data-dir", str(tmp_path / "d")], subprocess_env)
    try:
        line = proc.stdout.readline()
        m = re.search(r"--etcd-endpoints (\S+)", line)
        assert m, f"no endpoints printed: {line!r}"
        pids = procs.etcd_pids_under(tmp_path)
        assert pids, "no etcd process with our data dir"
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
        deadline = time.monotonic() + 10
        while procs.etcd_pids_under(tmp_path) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not procs.etcd_pids_under(tmp_path), "etcd outlived `querycoord etcd`"
        assert "its log:" in proc.stderr.read(), "the launcher must say where etcd logs"
    finally:
        proc.kill()


# ----- `querycoord up` and the client commands ----------------------------------------------------------------------
class Up:
    """A `querycoord up` process: its output lines as they come, its endpoints once ready."""

    def __init__(self, env: dict[str, str], data_dir: Path, *args: str, root: str = "", etcd_port: str | None = "0"):
        self.root = root or f"test-up-{uuid.uuid4().hex[:8]}"
        self.data_dir = data_dir
        # etcd on any free port by default: etcd's default (2379, ``etcd_port=None``) is for the tests holding
        # ``default_etcd``
        port = ["--etcd-port", etcd_port] if etcd_port is not None else []
        self.proc = run_querycoord(["up", "--listen", "127.0.0.1:0", *port, "--ttl", "2", "--root",
                                    self.root, "--data-dir", str(data_dir), *args], env)
        self.lines: queue.Queue[str | None] = queue.Queue()
        self.out: list[str] = []
        self._seen_children: set[int] = set()
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line)
        self.lines.put(None)

    def wait_ready(self, timeout: float = 60.0) -> str:
        """The coordinator's address, once `up` printed its ready line."""
        self.wait_line("ready:", timeout)
        self.children()  # its children as started, while their parent is known
        m = re.search(r"coordinator\s+(\S+)", "".join(self.out))
        assert m, self.out
        return m.group(1)

    def wait_line(self, prefix: str, timeout: float = 60.0) -> str:
        """The next output line that starts with ``prefix``."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                line = self.lines.get(timeout=max(0.1, deadline - time.monotonic()))
            except queue.Empty:
                break
            if line is None:
                raise AssertionError(f"`up` exited ({self.proc.wait()}): {''.join(self.out)}{self.proc.stderr.read()}")
            self.out.append(line)
            if line.startswith(prefix):
                return line
        raise AssertionError(f"no {prefix!r} line after {timeout}s: {''.join(self.out)}")

    def rest(self) -> str:
        while True:
            line = self.lines.get(timeout=30)
            if line is None:
                return "".join(self.out)
            self.out.append(line)

    def children(self) -> list[int]:
        """Coordinator and query node processes of this cluster: those naming our root whose parent is `up`, seen
        while it runs (another cluster on this machine may use the same root), still running. Once `up` exited,
        its children have another parent: the pids seen before are the ones that count."""
        fragment = f"--root {self.root}"
        running = procs.pids_matching(fragment)
        if self.proc.poll() is None:
            self._seen_children.update(pid for pid in running if procs.parent_of(pid) == self.proc.pid)
        return sorted(pid for pid in running if pid in self._seen_children)

    def etcd(self) -> list[int]:
        return procs.etcd_pids_under(self.data_dir)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()

    def __enter__(self) -> Up:
        return self

    def __exit__(self, *exc: object) -> None:
        self.kill()  # whatever the test did, no `up` outlives it


def cli(env: dict[str, str], address: str, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "querycoord.cli", "--address", address, "--timeout", "10", *args],
                          capture_output=True, text=True, env=env, timeout=timeout)


def ok(r: subprocess.CompletedProcess[str]) -> str:
    assert r.returncode == 0, f"exit {r.returncode}\nstdout:\n{r.stdout}\nstderr:\n{r.stderr}"
    assert "Traceback" not in r.stderr, r.stderr
    return r.stdout


def refused(r: subprocess.CompletedProcess[str], *fragments: str) -> str:
    """A refused request: exit 1, one `error: <reason>` line, no traceback."""
    assert r.returncode == 1, f"exit {r.returncode}\nstdout:\n{r.stdout}\nstderr:\n{r.stderr}"
    assert r.stderr.startswith("error: "), r.stderr
    assert "Traceback" not in r.stderr, r.stderr
    for f in fragments:
        assert f in r.stderr, (f, r.stderr)
    return r.stderr


def wait_gone(pids_fn, timeout: float = 15.0) -> list[int]:
    deadline = time.monotonic() + timeout
    while pids_fn() and time.monotonic() < deadline:
        time.sleep(0.1)
    return pids_fn()


def node_rows(out: str) -> dict[int, list[str]]:
    """``querycoord nodes`` table rows by node id."""
    return {int(cols[0]): cols for cols in (line.split() for line in out.splitlines()[2:]) if cols}


def test_up_serves_every_client_command_and_sigint_stops_everything(subprocess_env, tmp_path) -> None:
    with Up(subprocess_env, tmp_path / "up", "--nodes", "2") as up:
        addr = up.wait_ready()
        head = "".join(up.out)
        assert re.search(r"etcd endpoints\s+127\.0\.0\.1:\d+", head), head
        assert len(re.findall(r"query node \d+\s+127\.0\.0\.1:\d+", head)) == 2, head
        assert len(up.children()) == 3 and up.etcd(), "a coordinator, two nodes and etcd run"

        out = ok(cli(subprocess_env, addr, "collection", "create", "c1", "--partitions", "4", "--segments", "400",
                     "--segment-mb", "0.5"))
        m = re.search(r"created collection c1 \(id (\d+)\): 4 partitions, 2 DM channels, 400 segments", out)
        assert m, out
        cid = m.group(1)
        refused(cli(subprocess_env, addr, "collection", "create", "c1"), "already used")

        out = ok(cli(subprocess_env, addr, "collection", "load", "c1"))
        assert "100%" in out and re.search(r"loaded c1 \(id \d+\) in [\d.]+s \(task #(\d+)\)", out), out
        load_task = re.search(r"task #(\d+)\)", out).group(1)  # type: ignore[union-attr]
        out = ok(cli(subprocess_env, addr, "collection", "load", cid))
        assert "already loaded" in out

        out = ok(cli(subprocess_env, addr, "collection", "show"))
        row = next(line for line in out.splitlines() if " c1 " in line)
        assert row.split() == [cid, "c1", "4", "400", "collection", "100%", "4"], out

        nodes = node_rows(ok(cli(subprocess_env, addr, "nodes")))
        assert len(nodes) == 2 and all(r[2] == "online" for r in nodes.values()), nodes
        assert sum(int(r[3].replace(",", "")) for r in nodes.values()) == 400, nodes

        out = ok(cli(subprocess_env, addr, "tasks"))
        assert "no task is queued or running" in out
        out = ok(cli(subprocess_env, addr, "tasks", "--all", "--children"))
        assert re.search(rf"^#{load_task}\s+LoadCollection\s+DONE\s+collection {cid}", out, re.M), out
        assert re.search(r"^├── #\d+\s+LoadSegment\s+load \d+ segments .*node \d+\s+DONE", out, re.M), out
        assert re.search(r"^└── ", out, re.M), out
        out = ok(cli(subprocess_env, addr, "tasks", "--task", load_task, "--max-children", "1"))
        assert out.splitlines()[0].startswith(f"#{load_task}") and re.search(r"└── … \d+ other children", out), out

        source, dst = sorted(nodes)
        out = ok(cli(subprocess_env, addr, "balance", "--source", str(source), "--dst", str(dst)))
        assert re.search(r"#\d+\s+LoadBalance\s+DONE", out) and "segments moved" in out, out
        after = node_rows(ok(cli(subprocess_env, addr, "nodes")))
        assert after[source][3] == "0" and after[dst][3] == "400", after

        refused(cli(subprocess_env, addr, "collection", "load", "nosuch"), "nosuch")
        refused(cli(subprocess_env, addr, "collection", "load", "987654321"), "987654321")
        refused(cli(subprocess_env, addr, "balance", "--source", "987654"), "987654")
        refused(cli(subprocess_env, addr, "collection", "release", "c1", "--partitions", "partition_0"),
                "loaded as a whole")
        refused(cli(subprocess_env, addr, "collection", "release", "c1", "--partitions", "nope"), "no partition")

        out = ok(cli(subprocess_env, addr, "collection", "release", "c1"))
        assert re.search(r"released c1 \(id \d+\) in [\d.]+s \(task #\d+\)", out), out
        out = ok(cli(subprocess_env, addr, "collection", "show", "c1"))
        assert "not loaded" in out, out
        out = ok(cli(subprocess_env, addr, "collection", "load", "c1", "--partitions", "partition_1", "--no-wait"))
        assert "queued as task #" in out, out

        up.proc.send_signal(signal.SIGINT)
        assert up.proc.wait(timeout=40) == 0, up.proc.stderr.read()
        assert "stopped: every process of the cluster is gone" in up.rest()
        assert not up.children(), "a coordinator or query node outlived `up`"
        assert not up.etcd(), "etcd outlived `up`"


def test_up_sigkilled_takes_its_children_along(subprocess_env, tmp_path) -> None:
    """The children die with `up` even when it gets no chance to stop them (parent-death signal)."""
    with Up(subprocess_env, tmp_path / "up", "--nodes", "1") as up:
        up.wait_ready()
        assert len(up.children()) == 2 and up.etcd()
        up.proc.send_signal(signal.SIGKILL)
        up.proc.wait()
        assert not wait_gone(up.children), "a child outlived a SIGKILLed `up`"
        assert not wait_gone(up.etcd), "etcd outlived a SIGKILLed `up`"


def test_sigterm_stops_up_too(subprocess_env, tmp_path) -> None:
    with Up(subprocess_env, tmp_path / "up", "--nodes", "1") as up:
        up.wait_ready()
        up.proc.send_signal(signal.SIGTERM)
        assert up.proc.wait(timeout=40) == 0
        assert not up.children() and not up.etcd()


def test_up_refuses_a_busy_coordinator_port_and_starts_nothing(subprocess_env, tmp_path) -> None:
    """gRPC would share the port (SO_REUSEPORT) with whoever holds it: `up` must refuse instead."""
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        root = f"test-up-{uuid.uuid4().hex[:8]}"
        r = subprocess.run([sys.executable, "-m", "querycoord.cli", "up", "--listen", f"127.0.0.1:{port}",
                            "--etcd-port", "0", "--root", root, "--data-dir", str(tmp_path / "d")],
                           capture_output=True, text=True, env=subprocess_env, timeout=60)
    assert r.returncode == 1 and f"error: cannot listen on 127.0.0.1:{port}" in r.stderr, r.stderr
    assert not procs.pids_matching(f"--root {root}") and not procs.etcd_pids_under(tmp_path)


def test_up_with_a_data_dir_keeps_the_cluster_across_restarts(subprocess_env, tmp_path) -> None:
    """Stopped and started again on the same data dir: the load is still there, moved to the new nodes."""
    data = tmp_path / "kept"
    with Up(subprocess_env, data, "--nodes", "1") as up:
        addr = up.wait_ready()
        ok(cli(subprocess_env, addr, "collection", "create", "kept", "--partitions", "2", "--segments", "50"))
        ok(cli(subprocess_env, addr, "collection", "load", "kept"))
        up.proc.send_signal(signal.SIGINT)
        assert up.proc.wait(timeout=40) == 0
    with Up(subprocess_env, data, "--nodes", "1", root=up.root) as again:
        addr = again.wait_ready()
        # Still loaded; served again once the checker's repair loaded the old node's segments on the new one (a
        # moment after `ready`: until then the collection shows less than 100 %).
        deadline = time.monotonic() + 30
        while True:
            out = ok(cli(subprocess_env, addr, "collection", "show", "kept"))
            assert re.search(r"kept\s+2\s+50\s+collection\s+\d+%", out), out
            rows = node_rows(ok(cli(subprocess_env, addr, "nodes")))
            if [r[3] for r in rows.values()] == ["50"] and re.search(r"collection\s+100%", out):
                break
            assert time.monotonic() < deadline, f"the old node's segments never reached the new one: {rows} {out}"
            time.sleep(0.3)
        out = ok(cli(subprocess_env, addr, "tasks", "--all"))
        assert re.search(r"Repair\s+DONE .*segments held by no node", out), out
        again.proc.send_signal(signal.SIGINT)
        assert again.proc.wait(timeout=40) == 0


def test_unreachable_coordinator_is_a_clear_error(subprocess_env) -> None:
    r = subprocess.run([sys.executable, "-m", "querycoord.cli", "nodes", "--address", "127.0.0.1:1",
                        "--timeout", "1"], capture_output=True, text=True, env=subprocess_env, timeout=60)
    refused(r, "127.0.0.1:1", "querycoord up")


def test_bad_arguments_exit_2_without_traceback(subprocess_env) -> None:
    r = subprocess.run([sys.executable, "-m", "querycoord.cli", "balance", "--source", "x", "--address",
                        "127.0.0.1:1"], capture_output=True, text=True, env=subprocess_env, timeout=60)
    assert r.returncode == 2 and "error: --source must be numeric" in r.stderr and "Traceback" not in r.stderr


# ----- drawing --------------------------------------------------------------------------------------------------------
def _tree() -> qc.TaskTree:
    trig = qc.TaskInfo(task_id=1, kind=qc.TASK_KIND_LOAD_COLLECTION, state=qc.TASK_STATE_DONE, collection_id=7,
                       trigger_condition=qc.TRIGGER_CONDITION_GRPC_REQUEST)
    kids = [
        qc.TaskInfo(task_id=2, kind=qc.TASK_KIND_LOAD_SEGMENT, state=qc.TASK_STATE_DONE, node_id=3, retry_count=1,
                    summary="load 40 segments of collection 7", parent_id=1),
        qc.TaskInfo(task_id=9, kind=qc.TASK_KIND_LOAD_SEGMENT, state=qc.TASK_STATE_DOING, node_id=4, retry_count=3,
                    summary="load 20 segments of collection 7", parent_id=1, replaces_task_id=5,
                    excluded_node_ids=[5], error="query node 4 LoadSegments: injected failure"),
        qc.TaskInfo(task_id=3, kind=qc.TASK_KIND_WATCH_DM_CHANNEL, state=qc.TASK_STATE_UNDO, node_id=3,
                    summary="watch dm ch-0", parent_id=1),
    ]
    counts = qc.ChildStateCounts(total=3, undo=1, doing=1, done=1)
    return qc.TaskTree(trigger=trig, children=kids, child_counts=counts)


def test_draw_tree_uses_box_drawing_and_shows_reschedules() -> None:
    lines = draw.draw_tree(_tree())
    # The trigger's DONE is its commit point while children run: users read DOING.
    assert lines[0] == "#1  LoadCollection  DOING  collection 7  children 3 (1 undo, 1 doing, 1 done)"
    assert lines[1].startswith("├── #2  LoadSegment  load 40 segments of collection 7  node 3  DONE  retries 0")
    assert lines[2].startswith("├── #9  LoadSegment") and "retries 2  replaces #5  excluded [5]" in lines[2]
    assert "last error: query node 4 LoadSegments: injected failure" in lines[2]
    assert lines[3].startswith("└── #3  WatchDmChannel  watch dm ch-0  node 3  UNDO")


def test_draw_tree_filter_counts_what_it_hides() -> None:
    lines = draw.draw_tree(_tree(), only=draw.is_rescheduled, hidden_note="others")
    assert len(lines) == 3 and lines[1].startswith("├── #9") and lines[2] == "└── … 2 others"


def test_trigger_line_shows_the_error() -> None:
    t = qc.TaskInfo(task_id=4, kind=qc.TASK_KIND_LOAD_BALANCE, state=qc.TASK_STATE_FAILED,
                    trigger_condition=qc.TRIGGER_CONDITION_NODE_DOWN, summary="balance (node_down) from nodes [3]",
                    error="1 of 2 child tasks failed:\n no node")
    assert draw.trigger_line(t) == ("#4  LoadBalance  FAILED  balance (node_down) from nodes [3]  "
                                    "error: 1 of 2 child tasks failed: no node")


def test_progress_bar_in_a_pipe_prints_sparse_lines() -> None:
    out = io.StringIO()
    bar = draw.ProgressBar("loading c", stream=out, width=10, interval=3600, tty=False)
    for pct in (0, 5, 10, 50, 99):
        bar.update(pct)
    bar.update(100, force=True)
    bar.finish()
    lines = out.getvalue().splitlines()
    assert lines == ["loading c [░░░░░░░░░░]   0%", "loading c [██████████] 100%"], lines


def test_progress_bar_on_a_terminal_redraws_in_place() -> None:
    out = io.StringIO()
    bar = draw.ProgressBar("loading c", stream=out, width=4, tty=True)
    bar.update(50)
    bar.message("event")
    bar.finish("done")
    text = out.getvalue()
    assert text.count("\n") == 2 and "\r\x1b[2Kevent\n" in text and text.endswith(" 50%  done\n")


def test_table_aligns_columns() -> None:
    lines = draw.table(("ID", "NAME"), [(1, "a"), (22, "bbb")], right=(0,))
    assert lines == ["ID  NAME", "──  ────", " 1  a", "22  bbb"]


def test_replica_rows_show_nodes_progress_and_counts() -> None:
    from proto import data_pb2

    records = draw.replica_records([
        data_pb2.ReplicaInfo(replica_id=12, collection_id=5, node_ids=[4, 3], in_memory_percentage=40,
                             segment_count=1200, dm_channels=["c-0", "c-1"]),
        data_pb2.ReplicaInfo(replica_id=11, collection_id=5, node_ids=[1, 2], in_memory_percentage=100,
                             segment_count=3000, dm_channels=["c-0", "c-1"]),
        data_pb2.ReplicaInfo(replica_id=13, collection_id=5),
    ])
    assert [r["id"] for r in records] == [11, 12, 13] and records[1]["node_ids"] == [3, 4]
    assert records[0] == {"id": 11, "collection_id": 5, "node_ids": [1, 2], "loaded_percentage": 100,
                          "segments": 3000, "dm_channels": ["c-0", "c-1"]}
    lines = draw.table(draw.REPLICA_HEADERS, draw.replica_rows(records), right=(0, 2, 3, 4))
    assert lines[0].split() == ["REPLICA", "NODES", "LOADED", "SEGMENTS", "DM", "CHANNELS"]
    assert [line.split() for line in lines[2:]] == [["11", "1,2", "100%", "3,000", "2"],
                                                    ["12", "3,4", "40%", "1,200", "2"], ["13", "-", "0%", "0", "0"]]
    assert draw.replica_rows(records[:1], collection=True) == [[5, 11, "1,2", "100%", "3,000", 2]]
