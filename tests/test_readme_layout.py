"""README's module table matches the tree: every package of querycoord/ and meta/ has its row, every path a row
names exists. The table is how a newcomer finds their way; a stale one sends them to files that moved."""

from __future__ import annotations

import re
from pathlib import Path


def _table_paths(readme: str) -> list[str]:
    table = readme[readme.index("| module | job |"):]
    table = table[: table.index("\n\n")]
    return [m.group(1) for m in re.finditer(r"^\| `([^`]+)`", table, re.M)]


def test_every_package_has_a_row_and_every_row_exists(project_root: Path) -> None:
    paths = _table_paths((project_root / "README.md").read_text())
    for p in paths:
        assert (project_root / p).exists(), f"README's module table names {p}, which does not exist"
    packages = sorted(f"querycoord/{d.name}/" for d in (project_root / "querycoord").iterdir()
                      if (d / "__init__.py").exists())
    missing = [p for p in packages if p not in paths]
    assert missing == [], f"packages without a row in README's module table: {missing}"
    flat = sorted(p.name for p in (project_root / "querycoord").glob("*.py") if p.name != "__init__.py")
    assert flat == [], f"modules directly in querycoord/ (each belongs to a package): {flat}"
