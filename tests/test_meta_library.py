"""``meta`` as a library: its public API, ``py.typed``, silence until enabled, and the README's recipes.

The recipes are run as the README prints them: the test takes the Python block of the section "meta/ as a
library" and runs it as a script against the suite's etcd, the election as two processes of which the leader is
killed with SIGKILL.
"""

from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
import sys
import time
import tomllib
from pathlib import Path

import pytest

import meta
from meta.election import current_leader, election_prefix
from meta.ops.etcd_server import EtcdCluster

pytestmark = pytest.mark.timeout(120)

PUBLIC = ("EtcdConfig", "MetaKV", "FencedKV", "Session", "Election", "Fence", "watch_prefix", "Resync",
          "IdAllocator", "connect", "MetaError", "MetaUnavailable", "MetaAuthError", "MetaNoSpace",
          "NotLeader", "RequestTooLarge", "InvalidKey", "SessionLost", "SessionIdTaken", "WatchCancelled")


def readme_recipe(project_root: Path) -> str:
    text = (project_root / "README.md").read_text()
    section = text.split("\n## meta/ as a library\n", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```python\n(.*?)```", section, re.S)
    assert len(blocks) == 1, "the section holds one Python block: the recipes"
    return blocks[0]


@pytest.fixture
def recipe(project_root: Path, tmp_path: Path) -> Path:
    path = tmp_path / "recipes.py"
    path.write_text(readme_recipe(project_root))
    return path


def recipe_env(env: dict[str, str], etcd: EtcdCluster, root: str) -> dict[str, str]:
    return {**env, "ETCD_ENDPOINTS": ",".join(etcd.endpoints), "ROOT": root}


def test_the_public_api_is_importable_from_meta_itself(project_root: Path) -> None:
    for name in PUBLIC:
        assert name in meta.__all__, name
    for name in meta.__all__:
        assert getattr(meta, name) is not None, name
    assert issubclass(meta.NotLeader, meta.MetaError)
    assert (Path(meta.__file__).parent / "py.typed").is_file()
    pyproject = tomllib.loads((project_root / "pyproject.toml").read_text())
    assert "py.typed" in pyproject["tool"]["setuptools"]["package-data"]["meta"]


def test_the_library_loads_none_of_the_operations_tooling() -> None:
    """``import meta`` (and every name of ``meta.__all__``) leaves ``meta.ops`` unloaded: the launcher is apart."""
    code = "import sys, meta; sys.exit(sorted(m for m in sys.modules if m.startswith('meta.ops')) or None)"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r


def test_the_library_loads_loguru_only_when_it_logs() -> None:
    """``import meta`` leaves loguru unloaded (``meta.log``): a short process that logs nothing never loads it.
    The application enabling meta's logs after importing meta is the SILENT script below."""
    code = "import sys, meta; sys.exit('loguru' in sys.modules)"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r


SILENT = """
import asyncio, os, sys
from meta import Election, EtcdConfig, MetaKV, Session, connect

async def main():
    async with await connect(EtcdConfig.from_endpoints(os.environ["ETCD_ENDPOINTS"])) as client:
        kv = MetaKV(client, os.environ["ROOT"])
        await kv.save("k", "v")
        assert await kv.get("k") == b"v"
        async with Session(kv, "worker", "x", ttl=2) as session:
            election = Election(kv, session, "e")
            await election.campaign("x")
            await election.resign()
    print("done")

if len(sys.argv) > 1:
    from loguru import logger
    logger.enable("meta")
asyncio.run(main())
"""


@pytest.mark.parametrize("enabled", [False, True])
def test_meta_logs_nothing_unless_the_application_enables_it(etcd, root_path, subprocess_env, enabled) -> None:
    argv = [sys.executable, "-c", SILENT, *(["enable"] if enabled else [])]
    r = subprocess.run(argv, capture_output=True, text=True, env=recipe_env(subprocess_env, etcd, root_path),
                       timeout=60)
    assert r.returncode == 0 and r.stdout == "done\n", r
    if enabled:
        assert "election" in r.stderr and "registered" in r.stderr, r.stderr
    else:
        assert r.stderr == "", r.stderr


def test_readme_recipes_run_and_print_nothing_on_stderr(etcd, root_path, subprocess_env, recipe) -> None:
    r = subprocess.run([sys.executable, str(recipe)], capture_output=True, text=True,
                       env=recipe_env(subprocess_env, etcd, root_path), timeout=60)
    assert r.returncode == 0, r
    assert r.stderr == "", r.stderr
    lines = r.stdout.splitlines()
    assert lines[0].startswith("deposed: not leader: fence ") and "nothing was written" in lines[0], lines
    assert lines[1] == "watch: PUT jobs/1 queued", lines
    assert lines[2] == "session lost: session key deleted", lines


async def _line(stream: asyncio.StreamReader, timeout: float) -> str:
    return (await asyncio.wait_for(stream.readline(), timeout)).decode().strip()


async def test_readme_election_between_two_processes(etcd, root_path, subprocess_env, recipe, kv) -> None:
    env = recipe_env(subprocess_env, etcd, root_path)
    procs = []

    async def start(name: str) -> asyncio.subprocess.Process:
        p = await asyncio.create_subprocess_exec(sys.executable, str(recipe), "candidate", name, env=env,
                                                 stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        procs.append(p)
        return p

    try:
        first = await start("A")
        assert first.stdout is not None
        assert await _line(first.stdout, 30) == "A leads"
        second = await start("B")
        assert second.stdout is not None
        # B campaigns once its session exists; while A lives, A stays the leader and the owner.
        deadline = time.monotonic() + 30
        while len((await kv.load_prefix(election_prefix("workers"))).kvs) < 2:
            assert time.monotonic() < deadline, "B never queued in the election"
            await asyncio.sleep(0.05)
        leader = await current_leader(kv, election_prefix("workers"))
        assert leader is not None and leader.value == b"A"
        assert await kv.get("owner") == b"A"

        os.kill(first.pid, signal.SIGKILL)  # no resignation: B leads once A's lease (TTL 2 s) expires
        await first.wait()
        assert await _line(second.stdout, 30) == "B leads"
        deadline = time.monotonic() + 30
        while await kv.get("owner") != b"B":  # B writes it, fenced, right after saying it leads
            assert time.monotonic() < deadline, "B leads but never wrote the owner key"
            await asyncio.sleep(0.05)
    finally:
        for p in procs:
            if p.returncode is None:
                p.kill()
            await p.wait()
    assert second.stderr is not None and await second.stderr.read() == b""
