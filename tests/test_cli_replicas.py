"""The replica commands as real processes: `up` with four query nodes, `collection load --replicas`,
`querycoord replicas` and `collection show` (table and -o json), and the refusals."""

from __future__ import annotations

import json
import re

from tests.test_cli import Up, cli, node_rows, ok, refused

SEGMENTS = 40


def one_line_error(r, code: int, *fragments: str) -> str:
    """Exit ``code``, a single `error: ...` line naming ``fragments``, no traceback."""
    assert r.returncode == code, f"exit {r.returncode}\nstdout:\n{r.stdout}\nstderr:\n{r.stderr}"
    assert r.stderr.startswith("error: ") and r.stderr.count("\n") == 1, r.stderr
    assert "Traceback" not in r.stderr
    for f in fragments:
        assert f in r.stderr, (f, r.stderr)
    return r.stderr


def test_load_with_two_replicas_on_four_nodes_and_the_refusals(subprocess_env, tmp_path) -> None:
    env = subprocess_env
    with Up(env, tmp_path / "up", "--nodes", "4") as up:
        addr = up.wait_ready()
        out = ok(cli(env, addr, "collection", "create", "r2", "--partitions", "2", "--segments", str(SEGMENTS),
                     "--segment-mb", "0.5"))
        cid = re.search(r"\(id (\d+)\)", out).group(1)  # type: ignore[union-attr]
        one_line_error(cli(env, addr, "replicas", "r2"), 1, "r2", "not loaded")

        # Refused: no replica (the CLI, a usage error) and more replicas than the four nodes can hold (the server).
        one_line_error(cli(env, addr, "collection", "load", "r2", "--replicas", "0"), 2, "--replicas")
        one_line_error(cli(env, addr, "collection", "load", "r2", "--replicas", "5"), 1, "replica")
        out = ok(cli(env, addr, "collection", "show", "r2"))
        assert "not loaded" in out, out

        out = ok(cli(env, addr, "collection", "load", "r2", "--replicas", "2"))
        assert "100%" in out and re.search(r"loaded r2 \(id \d+\) with 2 replicas in [\d.]+s \(task #\d+\)", out), out

        # querycoord replicas -o json: two replicas on disjoint nodes, each holding every segment.
        reps = json.loads(ok(cli(env, addr, "replicas", "r2", "-o", "json")))
        assert len(reps) == 2 and [r["id"] for r in reps] == sorted(r["id"] for r in reps), reps
        nodes = node_rows(ok(cli(env, addr, "nodes")))
        assert len(nodes) == 4, nodes
        a, b = (set(r["node_ids"]) for r in reps)
        assert a and b and not a & b and a | b <= set(nodes), reps
        for r in reps:
            assert r["collection_id"] == int(cid) and r["loaded_percentage"] == 100, r
            assert r["segments"] == SEGMENTS and len(r["dm_channels"]) == 2, r
        # Each replica holds each segment once: the nodes hold two copies in all.
        assert sum(int(row[3].replace(",", "")) for row in nodes.values()) == 2 * SEGMENTS, nodes

        # The table: the same replicas, one line each.
        out = ok(cli(env, addr, "replicas", cid))
        lines = out.splitlines()
        assert lines[0].split() == ["REPLICA", "NODES", "LOADED", "SEGMENTS", "DM", "CHANNELS"], out
        assert [line.split() for line in lines[2:]] == [
            [str(r["id"]), ",".join(map(str, r["node_ids"])), "100%", str(SEGMENTS), "2"] for r in reps], out

        # collection show: the collection's row, then its replicas; -o json carries them too.
        out = ok(cli(env, addr, "collection", "show", "r2"))
        row = next(line for line in out.splitlines() if " r2 " in line)
        assert row.split() == [cid, "r2", "2", str(SEGMENTS), "collection", "100%", "2"], out
        assert re.search(r"^COLLECTION\s+REPLICA\s+NODES\s+LOADED\s+SEGMENTS\s+DM CHANNELS$", out, re.M), out
        for r in reps:
            assert re.search(rf"^\s*{cid}\s+{r['id']}\s+{','.join(map(str, r['node_ids']))}\s+100%\s+{SEGMENTS}\s+2$",
                             out, re.M), out
        shown = json.loads(ok(cli(env, addr, "collection", "show", "r2", "-o", "json")))
        assert len(shown) == 1 and shown[0]["replicas"] == reps, shown

        # Loaded with 2: the same number is already loaded; another one resizes in place (a node moves from a
        # replica to the new one), and one the four nodes cannot give is refused.
        out = ok(cli(env, addr, "collection", "load", "r2", "--replicas", "2"))
        assert "already loaded" in out, out
        out = ok(cli(env, addr, "collection", "load", "r2", "--replicas", "3"))
        assert "resized r2" in out and "to 3 replicas" in out, out
        grown = json.loads(ok(cli(env, addr, "collection", "show", "r2", "-o", "json")))[0]["replicas"]
        assert len(grown) == 3 and all(r["node_ids"] for r in grown), grown
        placed = [n for r in grown for n in r["node_ids"]]
        assert len(placed) == len(set(placed)), grown  # each replica on its own nodes
        one_line_error(cli(env, addr, "collection", "load", "r2", "--replicas", "5"), 1, "replica")

        ok(cli(env, addr, "collection", "release", "r2"))
        one_line_error(cli(env, addr, "replicas", "r2"), 1, "not loaded")
        shown = json.loads(ok(cli(env, addr, "collection", "show", "r2", "-o", "json")))
        assert shown[0]["replicas"] is None and shown[0]["load_type"] is None, shown
        refused(cli(env, addr, "replicas", "nosuch"), "nosuch")
