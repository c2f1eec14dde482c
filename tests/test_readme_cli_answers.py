"""README's "Answers to rely on": each command of its example block, run as a process, prints what README shows."""

from __future__ import annotations

import shlex
import subprocess
import sys
from pathlib import Path

from tests.readme_blocks import fenced_block, steps

MARKER = "<!-- checked by tests/test_readme_cli_answers.py -->"


def examples(project_root: Path) -> list[tuple[str, list[str]]]:
    """(command line, the lines README shows after it) for each ``$ querycoord ...`` of the block."""
    return steps(fenced_block(project_root, MARKER, "```console"))


def test_readme_cli_answers_are_what_the_commands_print(project_root: Path, subprocess_env) -> None:
    shown = examples(project_root)
    assert len(shown) >= 2
    for command, expected in shown:
        argv = shlex.split(command)
        assert argv[0] == "querycoord", command
        r = subprocess.run([sys.executable, "-m", "querycoord.cli", *argv[1:]], capture_output=True, text=True,
                           env=subprocess_env, timeout=60, check=False)
        assert r.returncode == 2, (command, r)
        assert (r.stdout + r.stderr).splitlines() == expected, (command, r.stdout, r.stderr)
