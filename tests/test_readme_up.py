"""README's "All-in-one cluster" example is what `querycoord up` prints: the command in the block is run (on free
ports, so that it runs beside other tests) and its ready table compared line by line, with what varies masked
(ports, pids, node ids, the data dir)."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

from tests.test_cli import Up


def readme_example(project_root: Path) -> tuple[list[str], list[str]]:
    """The ``$ querycoord up ...`` command's arguments and the lines it prints, from the README."""
    text = (project_root / "README.md").read_text()
    start = text.index("### All-in-one cluster")
    start = text.index("```text\n", start) + len("```text\n")
    lines = text[start:text.index("```", start)].rstrip("\n").splitlines()
    command = shlex.split(lines[0].removeprefix("$ "))
    assert command[:2] == ["querycoord", "up"], lines[0]
    return command[2:], lines[1:]


def mask(lines: list[str], data_dir: str) -> list[str]:
    out = []
    for line in lines:
        line = line.replace(data_dir, "DIR")
        line = re.sub(r"127\.0\.0\.1:\d+", "127.0.0.1:PORT", line)
        line = re.sub(r"pid \d+", "pid N", line)
        line = re.sub(r"query node \d+\s+", "query node ID ", line)
        line = re.sub(r"querynode-\d+\.log", "querynode-ID.log", line)
        out.append(line)
    return out


def test_readme_up_example_is_what_up_prints(subprocess_env, tmp_path, project_root) -> None:
    args, expected = readme_example(project_root)
    i = args.index("--data-dir")
    readme_dir, args = args[i + 1], args[:i] + args[i + 2:]
    data = tmp_path / "qc"
    with Up(subprocess_env, data, *args, root="querycoord") as up:  # ``Up`` adds --data-dir and free ports
        up.wait_ready()
        printed = [line.rstrip("\n") for line in up.out]
        up.kill()
    assert mask(printed, str(data)) == mask(expected, readme_dir)
