"""README's "Configuration and external etcd": the examples of the line a reader of etcd prints (the root and
endpoints it reads, and where each came from) and of a refused etcd are what the commands print.

Each ``$`` line of a block runs for real: ``cat FILE`` writes the file (its endpoint pointed at the test's etcd),
``VAR=value querycoord ...`` runs the CLI as a process with that variable, ``| jq -r .KEY`` takes that key of its
JSON. What follows a command is compared line by line with its stderr then stdout, the test etcd's endpoint and
the revision masked.
"""

from __future__ import annotations

import json
import re
import shlex
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from meta.ops.etcd_server import EtcdCluster
from tests.readme_blocks import fenced_block, steps

README_ENDPOINT = "127.0.0.1:2379"


def block(project_root: Path, marker: str) -> list[str]:
    return fenced_block(project_root, f"<!-- checked by tests/test_readme_etcd_reach.py: {marker} -->")


def mask(line: str) -> str:
    return re.sub(r"at revision \d+", "at revision N", line)


def run_step(command: str, env: dict[str, str], cwd: Path, endpoint: str) -> list[str]:
    """Run one README command line; what it prints, stderr first, with ``endpoint`` shown as README's."""
    pipe = None
    if " | jq -r ." in command:
        command, _, pipe = command.partition(" | jq -r .")
    words = shlex.split(command)
    extra = {}
    while "=" in words[0]:
        name, _, value = words.pop(0).partition("=")
        extra[name] = value
    assert words[0] == "querycoord", command
    r = subprocess.run([sys.executable, "-m", "querycoord.cli", *words[1:]], capture_output=True, text=True,
                       env={**env, **extra}, cwd=cwd, timeout=60)
    out = [str(json.loads(r.stdout)[pipe])] if pipe else r.stdout.splitlines()
    return [mask(line.replace(endpoint, README_ENDPOINT)) for line in (*r.stderr.splitlines(), *out)]


def test_the_root_line_example_is_what_the_commands_print(etcd: EtcdCluster, subprocess_env, tmp_path,
                                                          project_root) -> None:
    endpoint = etcd.endpoints[0]
    for command, expected in steps(block(project_root, "root line")):
        if command.startswith("cat "):
            (tmp_path / command.split()[1]).write_text(
                "\n".join(expected).replace(README_ENDPOINT, endpoint) + "\n")
            continue
        assert run_step(command, subprocess_env, tmp_path, endpoint) == [mask(e) for e in expected], command


def test_the_refused_example_is_what_the_command_prints(default_etcd, subprocess_env, tmp_path,
                                                        project_root) -> None:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", 2379))
        except OSError:
            pytest.skip("something outside the tests listens on 127.0.0.1:2379")
    [(command, expected)] = steps(block(project_root, "refused"))
    assert run_step(command, subprocess_env, tmp_path, default_etcd) == expected
