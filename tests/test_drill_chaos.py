"""The chaos drill: its TCP proxy cuts, stalls and heals a link over loopback; its oracle accepts exactly the
final states some order of the concurrent requests explains; short runs against real processes (3
coordinators, 5 query nodes, 2 replicas, partitions, leader kills; with ``--capacity tight`` nodes too small for
every replica, node and whole-cluster restarts) end with zero unanswered calls, invariant violations, stuck
triggers and sampled false full answers, blocked units and blocked releases."""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from querycoord.tooling.drill.chaos_checks import idempotence_violations
from querycoord.tooling.drill.chaos_ops import (
    INF,
    RELEASED,
    Attempt,
    admissible_states,
    effect_of,
    make_plan,
)
from querycoord.tooling.drill.chaos_records import ChaosCall
from querycoord.tooling.drill.invariants import CatalogColl, Expected, MetaColl, MetaView, NodeView, check
from querycoord.tooling.drill.options import SEGMENT_BYTES, ChaosOptions
from querycoord.tooling.drill.proxy import TcpProxy


async def _echo_server() -> tuple[asyncio.Server, str]:
    async def echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(ConnectionError, OSError):
            while data := await reader.read(4096):
                writer.write(data)
                await writer.drain()
        writer.close()

    server = await asyncio.start_server(echo, "127.0.0.1", 0)
    return server, f"127.0.0.1:{server.sockets[0].getsockname()[1]}"


async def _connect(proxy: TcpProxy) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    host, port = proxy.address.rsplit(":", 1)
    return await asyncio.open_connection(host, int(port))


async def _roundtrip(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, data: bytes,
                     timeout: float = 2.0) -> bytes:
    writer.write(data)
    await writer.drain()
    return await asyncio.wait_for(reader.readexactly(len(data)), timeout)


async def _send_held(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, data: bytes) -> None:
    """Send ``data`` through a proxy that holds it (a stall, a blackhole): no echo comes back meanwhile."""
    writer.write(data)
    await writer.drain()
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(reader.readexactly(len(data)), 0.3)


async def test_proxy_forwards_cuts_stalls_and_heals() -> None:
    server, target = await _echo_server()
    async with server, TcpProxy(target, name="echo") as proxy:
        r, w = await _connect(proxy)
        assert await _roundtrip(r, w, b"hello") == b"hello"

        # stall: nothing moves, nothing closes; heal delivers what was held, in order.
        proxy.stall()
        await _send_held(r, w, b"held")
        r2, w2 = await _connect(proxy)  # a new connection during a stall is accepted and held
        await _send_held(r2, w2, b"new")
        proxy.heal()
        assert await asyncio.wait_for(r.readexactly(4), 2) == b"held"
        assert await asyncio.wait_for(r2.readexactly(3), 2) == b"new"
        assert await _roundtrip(r, w, b"after stall") == b"after stall"

        # cut: existing connections are reset, new ones refused.
        proxy.cut()
        with pytest.raises((ConnectionError, asyncio.IncompleteReadError)):
            await _roundtrip(r, w, b"x")
        with pytest.raises((ConnectionError, asyncio.IncompleteReadError)):
            r3, w3 = await _connect(proxy)
            await _roundtrip(r3, w3, b"y")
        assert proxy.stats.dropped >= 2 and proxy.stats.refused >= 1

        # cut with blackhole: new connections are accepted and held silently, forwarded once healed.
        proxy.cut(blackhole=True)
        r4, w4 = await _connect(proxy)
        await _send_held(r4, w4, b"quiet")
        proxy.heal()
        assert await asyncio.wait_for(r4.readexactly(5), 2) == b"quiet"

        # healed: new connections work again.
        r5, w5 = await _connect(proxy)
        assert await _roundtrip(r5, w5, b"healed") == b"healed"
        assert proxy.stats.bytes_up >= len(b"hello" b"held" b"new" b"after stall" b"quiet" b"healed")
        for writer in (w, w2, w4, w5):
            writer.close()


async def test_proxy_waits_for_a_late_target_and_resets_on_close() -> None:
    server, target = await _echo_server()
    async with server:
        proxy = await TcpProxy(name="late").start()
        r, w = await _connect(proxy)
        w.write(b"early")
        await w.drain()
        await asyncio.sleep(0.1)
        proxy.set_target(target)  # the node's port is known only after the proxy's address was advertised
        assert await asyncio.wait_for(r.readexactly(5), 2) == b"early"
        await proxy.close()
        with pytest.raises((ConnectionError, asyncio.IncompleteReadError)):
            await _roundtrip(r, w, b"gone")
        w.close()


# ----- the plan and the oracle (pure) ------------------------------------------------------------------------------
def test_same_seed_same_plan_and_the_first_phases_cover_the_key_faults() -> None:
    opts = ChaosOptions(ops=40, collections=12, partitions=3, clients=3)
    a, b, c = make_plan(5, opts), make_plan(5, opts), make_plan(6, opts)
    assert a.phases == b.phases and a.digest() == b.digest() and a.digest() != c.digest()
    assert a.ops == 40 and make_plan(5, ChaosOptions(ops=300, collections=12, partitions=3)).ops == 300
    kinds = [f.kind for p in a.phases for f in p.faults]
    assert kinds[:2] == ["leader_etcd_cut", "leader_kill"], kinds
    patterns = {item.pattern for p in make_plan(5, ChaosOptions(ops=300, collections=12, partitions=3)).phases
                for w in p.workers for item in w}
    assert patterns == {"plain", "duplicate", "retry", "conflict"}


def test_a_tight_plan_restarts_nodes_and_the_cluster_first_and_chains_compactions() -> None:
    ample, tight = ChaosOptions(ops=300), ChaosOptions(ops=300, capacity="tight")
    assert make_plan(13, ample).digest() != make_plan(13, tight).digest()
    kinds = [f.kind for p in make_plan(13, tight).phases for f in p.faults]
    assert kinds[:3] == ["node_kill", "node_restart", "cluster_restart"], kinds
    ops = {op.kind for p in make_plan(13, tight).phases for w in p.workers for item in w for op in item.ops}
    assert "compact_chain" in ops
    assert not {"node_restart", "cluster_restart"} & {f.kind for p in make_plan(13, ample).phases for f in p.faults}
    # Tight nodes: every replica of every collection would need twice their room under the 90 % limit.
    demand = 12 * 2 * 30 * SEGMENT_BYTES
    assert tight.node_memory * 5 * 0.9 < demand < 2.1 * tight.node_memory * 5 * 0.9
    assert ample.node_memory == 4096 << 20 and ChaosOptions(node_memory_mb=64).node_memory == 64 << 20
    with pytest.raises(ValueError, match="--capacity"):
        ChaosOptions(capacity="roomy").validate()
    with pytest.raises(ValueError, match="cannot hold even one segment"):
        ChaosOptions(node_memory_mb=0.5).validate()


EVERY = frozenset({1, 2, 3})


def _a(seq: int, kind: str, sent: float, answered: float, effect: str = "yes", parts: tuple[int, ...] = ()) -> Attempt:
    return Attempt(seq, kind, frozenset(parts), sent, answered, effect)  # type: ignore[arg-type]


def test_oracle_sequential_requests_have_one_outcome() -> None:
    seq = [_a(1, "load", 0, 1), _a(2, "release", 2, 3), _a(3, "load_partitions", 4, 5, parts=(1, 2)),
           _a(4, "release_partitions", 6, 7, parts=(2,))]
    assert admissible_states({RELEASED}, seq, EVERY) == {("partitions", frozenset({1}))}
    # A clear refusal changes nothing.
    refused = [_a(1, "load", 0, 1), _a(2, "release", 2, 3, effect="no")]
    assert admissible_states({RELEASED}, refused, EVERY) == {("collection", EVERY)}


def test_oracle_concurrent_and_open_requests_admit_every_order() -> None:
    both = [_a(1, "load", 0, 2), _a(2, "release", 1, 3)]
    assert admissible_states({RELEASED}, both, EVERY) == {("collection", EVERY), RELEASED}
    # A release abandoned by its client may land after a later load, or never.
    late = [_a(1, "release", 0, INF, effect="maybe"), _a(2, "load", 5, 6)]
    assert admissible_states({("collection", EVERY)}, late, EVERY) == {("collection", EVERY), RELEASED}
    # Releasing other partitions never takes a pending partition load away, whatever the order.
    unrelated = [_a(1, "load_partitions", 0, 2, parts=(1,)), _a(2, "release_partitions", 1, 3, parts=(2,))]
    assert admissible_states({RELEASED}, unrelated, EVERY) == {("partitions", frozenset({1}))}
    # A LoadPartitions that failed clearly leaves the partitions loaded before it.
    failed = [_a(1, "load_partitions", 0, 1, parts=(1,)), _a(2, "load_partitions", 2, 3, "no", parts=(2,))]
    assert admissible_states({RELEASED}, failed, EVERY) == {("partitions", frozenset({1}))}


def test_effect_of_answers() -> None:
    assert effect_of("load", "success", "SUCCESS") == "yes"
    assert effect_of("load", "error", "CONFLICT") == "no" and effect_of("load", "error", "CANCELLED") == "no"
    assert effect_of("release", "error", "CANCELLED") == "maybe"  # a release may have released some nodes
    for outcome, code in (("error", "TIMEOUT"), ("error", "META_UNAVAILABLE"), ("unanswered", ""),
                          ("abandoned", "")):
        assert effect_of("load_partitions", outcome, code) == "maybe"


def _call(seq: int, group: int, pattern: str, code: str, sent: float, answered: float, cid: int = 7,
          kind: str = "load_partitions") -> ChaosCall:
    return ChaosCall(seq, 0, 0, group, pattern, "LoadPartitions", kind, f"coll {cid}", cid, (1,), sent, answered,
                     "success" if code == "SUCCESS" else "error", code, "already loaded" if code == "CONFLICT" else "")


def test_identical_retry_refused_is_a_violation_unless_something_else_intervened() -> None:
    retry = [_call(1, 1, "retry", "SUCCESS", 0.0, 0.1), _call(2, 1, "retry", "CONFLICT", 0.2, 0.3)]
    found = idempotence_violations(retry, retry)
    assert len(found) == 1 and "identical requests (retry)" in found[0]
    other = _call(3, 2, "plain", "SUCCESS", 0.15, 0.16, kind="release")
    assert idempotence_violations(retry, [*retry, other]) == []
    assert idempotence_violations([_call(1, 1, "retry", "SUCCESS", 0, 0.1), _call(2, 1, "retry", "SUCCESS", 0.2,
                                                                                 0.3)], []) == []


def test_a_compacted_away_segment_still_held_is_a_violation() -> None:
    expected = {1: Expected("collection", frozenset({10}), "#1 LoadCollection")}
    catalog = {1: CatalogColl({10: frozenset({101})}, frozenset({"ch1"}))}  # 100 was compacted into 101
    meta = MetaView(collections={1: MetaColl("collection", 100, frozenset({10}))},
                    segments={100: (1, 10, 7), 101: (1, 10, 7)}, channels={(1, "ch1"): 7})
    nodes = {7: NodeView(segments={100: (1, 10), 101: (1, 10)}, dm_channels={(1, "ch1")})}
    res = check(expected, catalog, meta, nodes, task_keys={}, unanswered=[])
    assert res.invariant_violations == 1 and "compacted away" in res.details[0], res.details
    del nodes[7].segments[100], meta.segments[100]
    assert check(expected, catalog, meta, nodes, task_keys={}, unanswered=[]).invariant_violations == 0


# ----- a short run against real processes ----------------------------------------------------------------------------
# About 30 s on an idle 2-core machine; the budget is for a machine loaded by other suites. A run that needs it all
# is stuck, not slow: its progress lines (-v) show where, and its work dir keeps every child's log.
CHAOS_BUDGET_S = 300


def _findings(out: str) -> str:
    """The report's stuck triggers, problems and continuous findings on one line: a CI log that shortens a long
    failure message keeps its start, and the start is then what went wrong, not the phase table."""
    section = out[out.find("\nstuck triggers:"):]
    section = section[:section.find("\nlogs and etcd data kept")]
    return " | ".join(ln.strip() for ln in section.splitlines() if ln.strip())[:3000]


def _run_drill(tmp_path: Path, env: dict[str, str], *args: str) -> tuple[dict[str, object], str, subprocess.Popen[str]]:
    """``querycoord drill chaos`` with ``args``: its JSON line, the end of its table, the finished process."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "querycoord.cli", "drill", "chaos", *args, "-v",
         "--time-budget", str(CHAOS_BUDGET_S - 60), "--work-dir", str(tmp_path / "chaos")],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        out, err = proc.communicate(timeout=CHAOS_BUDGET_S)
    except subprocess.TimeoutExpired:
        proc.kill()  # its children die with it (pdeathsig)
        out, err = proc.communicate()
        pytest.fail(f"the drill did not finish within {CHAOS_BUDGET_S}s; its last lines:\n{out[-6000:]}\n{err[-3000:]}")
    summary = json.loads(out.strip().splitlines()[-1])
    tail = out[out.find("\nphases\n"):][-8000:] + "\n" + err[-3000:]
    for key in ("unanswered", "invariant_violations", "stuck_triggers", "false_full_samples", "blocked_units",
                "blocked_releases"):
        assert summary[key] == 0, f"{key} {summary[key]}: {_findings(out)}\n{tail}"
    assert summary["samples"] > 0, summary
    assert proc.returncode == 0, f"exit {proc.returncode}\n{tail}"
    return summary, tail, proc


@pytest.mark.timeout(CHAOS_BUDGET_S + 60)
def test_short_chaos_run_answers_everything_and_keeps_every_invariant(subprocess_env: dict[str, str],
                                                                       tmp_path: Path) -> None:
    """40 requests in 4 phases, every load with 2 replicas: the leader cut off from etcd, SIGKILLed, the
    coordinators cut off from a node, the leader SIGSTOPped past its TTL; every count 0."""
    started = time.monotonic()
    summary, _tail, _proc = _run_drill(tmp_path, subprocess_env, "--ops", "40", "--seed", "1", "--replicas", "2")
    assert summary["ops"] == 40 and summary["seed"] == 1 and summary["replicas"] == 2
    assert summary["partitions"] >= 1 and summary["leader_kills"] >= 1, summary
    print(f"chaos drill took {time.monotonic() - started:.1f}s: {summary}")


@pytest.mark.timeout(CHAOS_BUDGET_S + 60)
def test_short_tight_chaos_run_restarts_nodes_and_the_cluster_and_keeps_every_invariant(
        subprocess_env: dict[str, str], tmp_path: Path, project_root: Path) -> None:
    """``--capacity tight``: a node killed for good, one restarted under its fixed id, the whole cluster (etcd
    too) restarted, a leader cut off from etcd; loads refused for want of memory; every count 0. The JSON line has
    every key the README shows."""
    summary, tail, _proc = _run_drill(tmp_path, subprocess_env, "--ops", "40", "--seed", "1", "--replicas", "2",
                                      "--capacity", "tight")
    assert summary["capacity"] == "tight", summary
    assert summary["node_kills"] >= 1 and summary["node_restarts"] >= 1 and summary["cluster_restarts"] == 1, tail
    readme = (project_root / "README.md").read_text()
    shown = readme[readme.index('It ends with `{"ops": ..., "capacity"'):]
    shown = shown[:shown.index("}`")]
    keys = re.findall(r'"(\w+)": ', shown)
    assert len(keys) > 10 and set(keys) <= set(summary), set(keys) - set(summary)
