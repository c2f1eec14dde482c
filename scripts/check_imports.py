"""Fail when the project's modules or packages import each other in a cycle (run by ``make lint``).

Layers point one way: ``meta`` knows nothing of ``querycoord``, the
configuration and the shared vocabulary sit at the bottom, the engine
(``task``, ``stream``, ``querymeta``) above them, the leader and the serving
surfaces above that, the tooling on top. A cycle is where that breaks first.
Every import counts: those inside functions (a lazy import only postpones
the cycle) and those under ``if TYPE_CHECKING:`` (a type-only import still
ties a module to what it names, and the next change turns it into a runtime
one). The engine reports to the process through hooks (``querycoord.common.events``,
``meta.observe``), never by importing it.

Two graphs are checked: modules, and packages (``querycoord.task``,
``querycoord.stream``, ...; a module directly in ``querycoord`` is its own
package). A package cycle means two parts each need the other, even when no
two modules do.

The core of ``meta`` (every module but ``meta.ops``) is a library: it imports
nothing of ``meta.ops`` (the operations tooling built on it) and nothing of
``querycoord``.

Prints each cycle as ``a -> b -> a`` and each forbidden import of the core as
``core: a imports b``, and exits 1 if there is any; with ``--graph`` prints
every module edge instead.
"""

from __future__ import annotations

import argparse
import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("meta", "querycoord")


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def project_modules() -> dict[str, Path]:
    return {module_name(p): p for pkg in PACKAGES for p in sorted((ROOT / pkg).rglob("*.py"))}


def imports_of(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The project modules ``name`` imports anywhere in its file (functions and ``if TYPE_CHECKING:`` included);
    ``from pkg import mod`` names the module, not the package."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name in modules)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            for alias in node.names:
                full = f"{base}.{alias.name}"
                if full in modules:
                    found.add(full)
                elif base in modules:
                    found.add(base)
    found.discard(name)
    return found


def package_of(name: str) -> str:
    """``querycoord.task.scheduler`` is in ``querycoord.task``, ``meta.ops.child`` in ``meta.ops``, ``meta.kv`` in
    ``meta``; a module directly in ``querycoord`` is its own package (``querycoord`` itself is only a namespace)."""
    parts = name.split(".")
    if parts[0] == "querycoord" and len(parts) >= 2:
        return ".".join(parts[:2])
    if parts[:2] == ["meta", "ops"]:
        return "meta.ops"
    return parts[0]


def package_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """The module graph folded onto packages (an edge between two packages for any edge between their modules)."""
    folded: dict[str, set[str]] = {}
    for name, targets in graph.items():
        source = package_of(name)
        folded.setdefault(source, set()).update(package_of(t) for t in targets if package_of(t) != source)
    return folded


def all_imports(name: str, path: Path) -> set[str]:
    """Every module name ``name`` imports, anywhere in the file (``if TYPE_CHECKING:`` bodies and functions too);
    ``from pkg import x`` yields both ``pkg`` and ``pkg.x`` (``x`` may be a module)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            found.add(base)
            found.update(f"{base}.{alias.name}" for alias in node.names)
    return found


# etcd3aio's protobuf package is private to that library: one module imports it (see its docstring).
PRIVATE_PROTOBUF = "etcd3aio._protobuf"
PROTOBUF_HOME = Path("meta/etcd_pb.py")
CHECKER = Path("scripts/check_imports.py")
SCANNED = ("meta", "querycoord", "tests", "scripts")


def private_protobuf_users() -> list[Path]:
    """Files other than ``meta/etcd_pb.py`` that name etcd3aio's private protobuf package."""
    found = []
    for top in SCANNED:
        for path in sorted((ROOT / top).rglob("*.py")):
            rel = path.relative_to(ROOT)
            if rel not in (PROTOBUF_HOME, CHECKER) and PRIVATE_PROTOBUF in path.read_text():
                found.append(rel)
    return found


CORE = "meta"
FORBIDDEN_TO_CORE = ("meta.ops", "querycoord")


def _within(name: str, package: str) -> bool:
    return name == package or name.startswith(package + ".")


def core_violations(modules: dict[str, Path]) -> list[tuple[str, str]]:
    """(module, import) for each import of ``meta.ops`` or ``querycoord`` by a core ``meta`` module."""
    found = []
    for name, path in sorted(modules.items()):
        if not _within(name, CORE) or _within(name, "meta.ops"):
            continue
        bad = {t for t in all_imports(name, path) if any(_within(t, b) for b in FORBIDDEN_TO_CORE)}
        # ``from meta.ops.child import X`` names ``meta.ops.child`` once, not also ``meta.ops.child.X``.
        found.extend((name, t) for t in sorted(bad) if t.rpartition(".")[0] not in bad)
    return found


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan), each as a closed path."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(_closed_path(sorted(component), graph))

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10 * len(graph) + 100))
    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def _closed_path(component: list[str], graph: dict[str, set[str]]) -> list[str]:
    """One shortest cycle through the component's first module, for a readable message."""
    start, members = component[0], set(component)
    paths = {start: [start]}
    frontier = [start]
    while frontier:
        nxt = []
        for v in frontier:
            for w in sorted(graph[v] & members):
                if w == start:
                    return [*paths[v], start]
                if w not in paths:
                    paths[w] = [*paths[v], w]
                    nxt.append(w)
        frontier = nxt
    return [*component, start]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--graph", action="store_true", help="print every import edge")
    args = parser.parse_args(argv)
    modules = project_modules()
    graph = {name: imports_of(name, path, modules) for name, path in modules.items()}
    if args.graph:
        for name in sorted(graph):
            for target in sorted(graph[name]):
                print(f"{name} -> {target}")
        return 0
    found = cycles(graph)
    for cycle in found:
        print("import cycle: " + " -> ".join(cycle))
    packages = package_graph(graph)
    package_cycles = cycles(packages)
    for cycle in package_cycles:
        print("package cycle: " + " -> ".join(cycle))
    forbidden = core_violations(modules)
    for name, target in forbidden:
        print(f"core: {name} imports {target} (the meta library imports nothing of meta.ops or querycoord)")
    private = private_protobuf_users()
    for path in private:
        print(f"private: {path} names {PRIVATE_PROTOBUF} (only {PROTOBUF_HOME} may; import from meta.etcd_pb)")
    if found or package_cycles or forbidden or private:
        return 1
    print(f"imports: no cycle among {len(modules)} modules or {len(packages)} packages, every import counted; "
          "the meta core imports nothing of meta.ops or querycoord")
    return 0


if __name__ == "__main__":
    sys.exit(main())
