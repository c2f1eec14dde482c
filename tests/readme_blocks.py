"""README's example blocks as the tests that check them read them: the fenced block after a marker, and its
``$ command`` lines each with the lines shown after it."""

from __future__ import annotations

from pathlib import Path


def fenced_block(project_root: Path, marker: str, fence: str = "```") -> list[str]:
    """The lines of the first block fenced with ``fence`` (e.g. "```console") after ``marker`` in README.md."""
    text = (project_root / "README.md").read_text()
    start = text.index(fence + "\n", text.index(marker)) + len(fence) + 1
    return text[start:text.index("```", start)].splitlines()


def steps(lines: list[str]) -> list[tuple[str, list[str]]]:
    """(command, the lines shown after it) for each ``$ `` line."""
    out: list[tuple[str, list[str]]] = []
    for line in lines:
        if line.startswith("$ "):
            out.append((line[2:], []))
        else:
            out[-1][1].append(line)
    return out
