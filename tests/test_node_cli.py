"""``querycoord node cordon|uncordon|drain`` against a real ``querycoord up``: its lines, ``-o json``, the
``nodes`` table's LIFECYCLE and DRAIN columns, usage errors (exit 2) and refusals (exit 1); the README's drain
example has the shape the command prints."""

from __future__ import annotations

import json
import re
from pathlib import Path

from tests.test_cli import Up, cli, node_rows, ok, refused

LINE = re.compile(r"^node \d+: (active|cordoned|draining|drained)(, \d+/\d+ left(, eta \d\d:\d\d:\d\d)?"
                  r"(, waiting: .+)?)?$")


def readme_drain_example(project_root: Path) -> list[str]:
    text = (project_root / "README.md").read_text()
    block = text[text.index("$ querycoord node drain 2 --wait"):]
    return block[: block.index("```")].strip().splitlines()[1:]


def test_node_commands(subprocess_env, tmp_path, project_root: Path) -> None:
    example = readme_drain_example(project_root)
    assert example and all(LINE.match(line) for line in example), example
    with Up(subprocess_env, tmp_path / "up", "--nodes", "2") as up:
        addr = up.wait_ready()
        ok(cli(subprocess_env, addr, "collection", "create", "c1", "--partitions", "1", "--segments", "40",
               "--segment-mb", "0.5"))
        ok(cli(subprocess_env, addr, "collection", "load", "c1"))
        rows = node_rows(ok(cli(subprocess_env, addr, "nodes")))
        a, b = sorted(rows)
        assert all(r[-2:] == ["active", "-"] for r in rows.values()), rows

        out = ok(cli(subprocess_env, addr, "node", "cordon", str(a)))
        assert out.strip() == f"node {a}: cordoned", out
        record = json.loads(ok(cli(subprocess_env, addr, "node", "cordon", str(a), "-o", "json")))
        assert record["id"] == a and record["lifecycle"] == "cordoned" and record["drain"] is None, record

        out = ok(cli(subprocess_env, addr, "node", "drain", str(a), "--wait"))
        lines = out.strip().splitlines()
        assert all(LINE.match(line) for line in lines), lines
        assert re.fullmatch(rf"node {a}: drained, 0/(\d+) left", lines[-1]), lines
        rows = node_rows(ok(cli(subprocess_env, addr, "nodes")))
        assert rows[a][3] == "0" and rows[a][-3] == "drained" and rows[b][3] == "40", rows
        shown = json.loads(ok(cli(subprocess_env, addr, "nodes", "-o", "json")))
        drained = next(n for n in shown if n["id"] == a)
        assert drained["drain"]["copies_left"] == 0 and drained["drain"]["copies_total"] > 0, drained

        status = ok(subprocess_run_status(subprocess_env, up))
        assert re.search(rf"^\s*{a}\s+\S+\s+online\s+.*drained\s*$", status, re.M), status

        out = ok(cli(subprocess_env, addr, "node", "uncordon", str(a)))
        assert out.strip() == f"node {a}: active", out

        refused(cli(subprocess_env, addr, "node", "drain", "424242"), "424242", "unknown")
        for bad in (["node", "drain"], ["node", "drain", "0"], ["node", "evict", "1"], ["node", "cordon", "x"],
                    ["node", "cordon", str(a), "--wait"]):
            r = cli(subprocess_env, addr, *bad)
            assert r.returncode == 2 and r.stderr.strip().splitlines()[-1].startswith("error: "), (bad, r.stderr)
            assert "Traceback" not in r.stderr


def subprocess_run_status(env: dict[str, str], up: Up):  # type: ignore[no-untyped-def]
    """``querycoord status`` against the cluster's etcd (it reads etcd, not a coordinator)."""
    import subprocess
    import sys

    head = "".join(up.out)
    endpoints = re.search(r"etcd endpoints\s+(\S+)", head)
    assert endpoints, head
    args = [sys.executable, "-m", "querycoord.cli", "status", "--etcd-endpoints", endpoints.group(1), "--root",
            up.root]
    return subprocess.run(args, capture_output=True, text=True, env=env, timeout=60)
