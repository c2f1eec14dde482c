"""scripts/check_imports.py: no cycle among modules or packages, every import counted (top level, inside a
function, under ``if TYPE_CHECKING:``), and the core of ``meta`` imports nothing of ``meta.ops`` or ``querycoord``."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest


@pytest.fixture
def check_imports(project_root: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location("check_imports", project_root / "scripts" / "check_imports.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _tree(tmp_path: Path, files: dict[str, str]) -> dict[str, Path]:
    modules = {}
    for name, text in files.items():
        path = tmp_path / (name.replace(".", "/") + ".py")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        modules[name] = path
    return modules


def test_every_kind_of_import_of_ops_or_querycoord_by_the_core_is_refused(check_imports, tmp_path: Path) -> None:
    modules = _tree(tmp_path, {
        "meta.kv": "from meta.ops.child import ChildProcess\n",
        "meta.fence": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from meta.ops import etcd_server\n",
        "meta.loops": "def f():\n    import querycoord.settings.config\n",
        "meta.watch": "from meta import ops\n",
        "meta.idalloc": "from . import ops\n",
        "meta.ops.child": "from meta.kv import MetaKV\nimport querycoord\n",  # ops may import anything
        "meta.txn": "from meta.errors import MetaError\nimport meta.observe\n",  # the core importing the core
    })
    assert check_imports.core_violations(modules) == [
        ("meta.fence", "meta.ops"),
        ("meta.idalloc", "meta.ops"),
        ("meta.kv", "meta.ops.child"),
        ("meta.loops", "querycoord.settings.config"),
        ("meta.watch", "meta.ops"),
    ]


def test_a_cycle_through_a_type_only_or_a_function_import_is_a_cycle(check_imports, tmp_path: Path) -> None:
    modules = _tree(tmp_path, {
        "querycoord.a": "from querycoord.b import B\n",
        "querycoord.b": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from querycoord.a import A\n",
        "querycoord.c": "def f():\n    from querycoord.d import D\n",
        "querycoord.d": "import querycoord.c\n",
        "querycoord.e": "import querycoord.a\n",  # into a cycle, not part of one
    })
    graph = {n: check_imports.imports_of(n, p, modules) for n, p in modules.items()}
    assert sorted(check_imports.cycles(graph)) == [["querycoord.a", "querycoord.b", "querycoord.a"],
                                                   ["querycoord.c", "querycoord.d", "querycoord.c"]]


def test_packages_that_need_each_other_are_a_cycle_though_no_two_modules_are(check_imports, tmp_path: Path) -> None:
    modules = _tree(tmp_path, {
        "querycoord.task.run": "from querycoord.served.persist import lower\n",
        "querycoord.served.persist": "",
        "querycoord.served.explain": "from querycoord.task.parking import Parked\n",
        "querycoord.task.parking": "",
        "querycoord.gate": "from querycoord.task.run import x\n",  # a flat module is its own package
    })
    graph = {n: check_imports.imports_of(n, p, modules) for n, p in modules.items()}
    assert check_imports.cycles(graph) == []
    packages = check_imports.package_graph(graph)
    assert packages["querycoord.gate"] == {"querycoord.task"}
    assert check_imports.cycles(packages) == [["querycoord.served", "querycoord.task", "querycoord.served"]]


def test_the_project_passes(project_root: Path) -> None:
    r = subprocess.run([sys.executable, str(project_root / "scripts" / "check_imports.py")], capture_output=True,
                       text=True, timeout=60, cwd=project_root)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "the meta core imports nothing of meta.ops or querycoord" in r.stdout
    assert "every import counted" in r.stdout


def test_only_etcd_pb_names_the_private_protobuf_package(check_imports, tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    private = check_imports.PRIVATE_PROTOBUF  # not spelled here: this file is scanned too
    _tree(tmp_path, {
        "meta.etcd_pb": f"from {private} import RangeRequest\n",
        "meta.kv": "from meta.etcd_pb import RangeRequest\n",
        "querycoord.x": f"from {private} import TxnRequest\n",
        "tests.test_y": f"import {private}\n",
    })
    monkeypatch.setattr(check_imports, "ROOT", tmp_path)
    assert check_imports.private_protobuf_users() == [Path("querycoord/x.py"), Path("tests/test_y.py")]
