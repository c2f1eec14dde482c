"""README's "Answers to rely on": each command of its example block, run as a process, prints what README shows."""

from __future__ import annotations

import shlex
import subprocess
import sys
from pathlib import Path

MARKER = "<!-- checked by tests/test_readme_cli_answers.py -->"


def examples(project_root: Path) -> list[tuple[str, list[str]]]:
    """(command line, the lines README shows after it) for each ``$ querycoord ...`` of the block."""
    text = (project_root / "README.md").read_text()
    start = text.index("```console\n", text.index(MARKER)) + len("```console\n")
    body = text[start:text.index("```", start)].splitlines()
    out: list[tuple[str, list[str]]] = []
    for line in body:
        if line.startswith("$ "):
            out.append((line[2:], []))
        else:
            out[-1][1].append(line)
    return out


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
