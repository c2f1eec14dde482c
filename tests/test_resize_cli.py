"""`querycoord collection resize` and `collection load --replicas N` of a loaded collection, as real processes
(`up` with four query nodes), and the README's "Resizing replicas" example checked against what they print."""

from __future__ import annotations

import json
import re
from pathlib import Path

from tests.test_cli import Up, cli, ok, refused
from tests.test_cli_replicas import one_line_error

SEGMENTS = 40


def normal(lines: list[str]) -> list[str]:
    """Lines with what changes from run to run (task ids, ids, times, node ids, bar redraws) made equal."""
    out = []
    for line in lines:
        line = re.sub(r"#\d+", "#N", line)
        line = re.sub(r"\d+\.\ds\b", "T", line)
        line = re.sub(r"\bcollection \d+", "collection C", re.sub(r"\(id \d+\)", "(id C)", line))
        out.append(line.rstrip())
    return out


def final(out: str) -> list[str]:
    """The command's lines with only the last line of its progress bar (a pipe prints it once per change)."""
    lines = out.rstrip("\n").split("\n")
    bars = [i for i, line in enumerate(lines) if line.startswith("resizing ") and "%" in line]
    return [line for i, line in enumerate(lines) if i not in bars[:-1]]


def readme_examples(project_root: Path) -> dict[str, list[str]]:
    """The "Resizing replicas" block of README.md: the lines after each `$ command`, by command."""
    text = (project_root / "README.md").read_text()
    section = text[text.index("### Resizing replicas"):]
    block = section[section.index("```\n") + 4:]
    block = block[:block.index("```")]
    examples: dict[str, list[str]] = {}
    current = ""
    for line in block.rstrip("\n").split("\n"):
        if line.startswith("$ "):
            current = line[2:].split("  #")[0].strip()
            examples[current] = []
        else:
            examples[current].append(line)
    return examples


def test_resize_down_and_up_again_on_four_nodes(subprocess_env, tmp_path, project_root: Path) -> None:
    env = subprocess_env
    readme = readme_examples(project_root)
    with Up(env, tmp_path / "up", "--nodes", "4") as up:
        addr = up.wait_ready()
        ok(cli(env, addr, "collection", "create", "c1", "--partitions", "2", "--segments", str(SEGMENTS),
               "--segment-mb", "0.5"))
        one_line_error(cli(env, addr, "collection", "resize", "c1", "--replicas", "2"), 1, "not loaded")
        ok(cli(env, addr, "collection", "load", "c1", "--replicas", "2"))

        shown = {}
        for command in ("collection resize c1 --replicas 1", "collection load c1 --replicas 2",
                        "collection resize c1 --replicas 2", "collection resize c1 --replicas 5",
                        "collection resize c1 --replicas 3"):
            r = cli(env, addr, *command.split())
            if command.endswith("--replicas 5"):
                shown[command] = [refused(r, "query nodes").rstrip("\n")]
            else:
                shown[command] = final(ok(r))
        for command, lines in shown.items():
            assert normal(lines) == normal(readme[f"querycoord {command}"]), (command, lines)

        # The third replica took a node from one of the other two (no spare was left): three disjoint, whole.
        reps = json.loads(ok(cli(env, addr, "replicas", "c1", "-o", "json")))
        nodes = [set(r["node_ids"]) for r in reps]
        assert len(reps) == 3 and sum(map(len, nodes)) == len(set().union(*nodes)) == 4, reps
        assert all(r["loaded_percentage"] == 100 and r["segments"] == SEGMENTS for r in reps), reps

        # Usage errors (exit 2) and a queued resize that returns at once.
        one_line_error(cli(env, addr, "collection", "resize", "c1", "--replicas", "0"), 2, "--replicas")
        one_line_error(cli(env, addr, "collection", "resize", "c1"), 2, "--replicas")
        out = ok(cli(env, addr, "collection", "resize", "c1", "--replicas", "1", "--no-wait"))
        assert re.search(r"resizing c1 \(id \d+\) from 3 to 1 replica \(task #\d+\)", out), out
        assert "querycoord tasks --task" in out, out
