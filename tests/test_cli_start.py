"""Start-up of the command line: a command imports what it runs, not every other command's implementation.

``querycoord status`` is a short-lived process whose run is mostly its imports; the commands are registered
only for the command word given (``querycoord.cli.command_word``), and the modules that register and run
``status`` and the client commands import nothing of the checker, metatool, the leader, the engine or the
tooling. Checked as facts: which modules a real process has imported when it ends (never how long it took), and
that a command parsed with only its own module says the same help and errors as with every command.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from meta.ops.etcd_server import EtcdCluster
from querycoord.cli import MODULE_OF, build_parser, command_word

# What no client command, status among them, needs: the checker and the engine under it, metatool, the leader,
# the servers' parts, the tooling, the reference nodes.
HEAVY = ("querycoord.checkers", "querycoord.metatool", "querycoord.console.status_view",
         "querycoord.leader.coordinator", "querycoord.leader.view", "querycoord.tooling", "querycoord.task",
         "querycoord.querymeta", "querycoord.catalog", "querycoord.nodes", "querycoord.serving",
         "querycoord.stream.runtime", "querycoord.security.auth", "querycoord.common.metrics",
         "querycoord.cli.servers", "querycoord.cli.meta_cmd")

# What `status` does without although it asks each coordinator for its state: the generated QueryCoord stub module
# (every method of the service; the one method status calls is built from the service descriptor); and although it
# scrapes an etcd member's quota from its metrics (etcd 3.5 says it nowhere else): urllib and the HTTP client (the
# scrape is one GET on the event loop); the TOML parser, with no --config file to read; tenacity, with no call to
# retry; and loguru, with nothing logged (``meta.log`` loads it at the first record).
STATUS_NEEDS_NOT = frozenset({"proto.querycoord_pb2_grpc", "urllib.request", "http.client", "tomllib", "tenacity",
                              "loguru"})

# Runs `querycoord ARGS...` as `python -m querycoord.cli` does, and writes the modules it imported when it exits.
PROBE = """
import atexit, json, os, runpy, sys

def report():
    with open(os.environ["MODULES_OUT"], "w") as f:
        json.dump(sorted(sys.modules), f)

atexit.register(report)
sys.argv = ["querycoord", *sys.argv[1:]]
runpy.run_module("querycoord.cli", run_name="__main__", alter_sys=True)
"""


def run_probe(env: dict[str, str], tmp_path: Path, *args: str) -> tuple[subprocess.CompletedProcess[str], list[str]]:
    out = tmp_path / "modules.json"
    r = subprocess.run([sys.executable, "-c", PROBE, *args], env={**env, "MODULES_OUT": str(out)},
                       capture_output=True, text=True, timeout=120)
    return r, json.loads(out.read_text())


def heavy(modules: list[str]) -> list[str]:
    return [m for m in modules if m.startswith(HEAVY)]


def etcd_flags(etcd: EtcdCluster, root: str) -> list[str]:
    return ["--etcd-endpoints", ",".join(etcd.endpoints), "--root", root]


def test_status_reads_etcd_without_importing_the_checker_or_the_engine(etcd: EtcdCluster, root_path: str,
                                                                      subprocess_env: dict[str, str],
                                                                      tmp_path: Path) -> None:
    r, modules = run_probe(subprocess_env, tmp_path, "status", *etcd_flags(etcd, root_path), "-o", "json")
    assert r.returncode == 0, r.stderr
    status = json.loads(r.stdout)
    assert status["root"] == root_path
    assert status["leader"] is None and status["coordinators"] == []  # nothing runs under this root
    assert status["controls"] == {"balance": {"paused": False, "since_ms": 0, "by": ""}, "inactive_checkers": []}
    assert status["etcd"]["members"], status
    assert all(m["db_size_quota"] > 0 for m in status["etcd"]["members"]), status  # scraped without urllib
    assert heavy(modules) == []
    assert "querycoord.console.status_gather" in modules
    assert "querycoord.console.draw" not in modules  # -o json draws no table
    assert STATUS_NEEDS_NOT.isdisjoint(modules), STATUS_NEEDS_NOT & set(modules)

    r, modules = run_probe(subprocess_env, tmp_path, "status", *etcd_flags(etcd, root_path))
    assert r.returncode == 0, r.stderr
    assert "no leader elected" in r.stdout and "etcd members (" in r.stdout
    assert heavy(modules) == []


def test_status_logs_through_the_configured_sink_once_something_logs(etcd: EtcdCluster, root_path: str,
                                                                     subprocess_env: dict[str, str],
                                                                     tmp_path: Path) -> None:
    """At DEBUG the standard library's records (asyncio, grpc) reach loguru, loaded then, in the format and at the
    level `setup_logging` chose before it was loaded; stdout is still the one JSON document."""
    r, modules = run_probe(subprocess_env, tmp_path, "status", *etcd_flags(etcd, root_path), "-o", "json",
                           "--log-level", "DEBUG")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["root"] == root_path
    assert "loguru" in modules
    assert re.search(r"^\d\d:\d\d:\d\d\.\d{3} DEBUG   asyncio", r.stderr, re.M), r.stderr
    r, modules = run_probe(subprocess_env, tmp_path, "status", *etcd_flags(etcd, root_path), "-o", "json",
                           "--log-level", "DEBUG", "--log-format", "json")
    assert r.returncode == 0, r.stderr
    lines = [json.loads(line) for line in r.stderr.splitlines() if line.startswith("{")]
    assert any(e["level"] == "DEBUG" and e["component"].startswith("asyncio") for e in lines), r.stderr


def test_status_against_no_etcd_is_still_one_error_line(subprocess_env: dict[str, str], tmp_path: Path) -> None:
    r, modules = run_probe(subprocess_env, tmp_path, "status", "--etcd-endpoints", "127.0.0.1:1", "--timeout", "1")
    assert r.returncode == 1
    assert r.stderr.count("error: ") == 1 and "Traceback" not in r.stderr, r.stderr
    assert heavy(modules) == []


@pytest.mark.parametrize("command", [("collection", "show"), ("nodes",), ("tasks",), ("switchover",),
                                     ("checkers", "list"), ("health",)])
def test_client_commands_import_no_engine(subprocess_env: dict[str, str], tmp_path: Path,
                                          command: tuple[str, ...]) -> None:
    """Nothing listens at the address: each command fails with its one error line, having imported what it runs
    and nothing of the engine."""
    r, modules = run_probe(subprocess_env, tmp_path, "--address", "127.0.0.1:1", *command, "--timeout", "0.5")
    assert r.returncode == 1, (r.stdout, r.stderr)
    assert r.stderr.startswith("error: no leading coordinator answered at 127.0.0.1:1"), r.stderr
    assert heavy(modules) == []


@pytest.mark.parametrize("args", [("status", "--help"), ("collection", "show", "--help"), ("meta", "--help"),
                                  ("meta", "verify", "--help")])
def test_a_command_s_help_registers_only_its_module(subprocess_env: dict[str, str], tmp_path: Path,
                                                    args: tuple[str, ...]) -> None:
    r, modules = run_probe(subprocess_env, tmp_path, *args)
    assert r.returncode == 0 and r.stdout.startswith(f"usage: querycoord {' '.join(args[:-1])}"), r.stdout
    assert "querycoord.cli.servers" not in modules and "querycoord.cli.stream_cmd" not in modules
    assert heavy([m for m in modules if m != "querycoord.cli.meta_cmd"]) == []  # `meta` registers without metatool


def test_meta_show_takes_the_kinds_metatool_decodes() -> None:
    from querycoord.cli.meta_cmd import SHOW_KINDS
    from querycoord.metatool.show import KINDS

    assert SHOW_KINDS == tuple(KINDS)


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:  # noqa: SLF001 - argparse lists its sub-commands only here
        if isinstance(action, argparse._SubParsersAction):  # noqa: SLF001 - argparse's sub-command action class
            return dict(action.choices)
    return {}


def _helps(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()) -> dict[tuple[str, ...], str]:
    """Every sub-command's help text under ``parser``, by its words."""
    out = {path: parser.format_help()} if path else {}
    for word, sub in _subparsers(parser).items():
        out.update(_helps(sub, (*path, word)))
    return out


def test_every_command_word_is_registered_by_its_module_alone_with_the_same_help() -> None:
    whole = build_parser()
    words = set(_subparsers(whole))
    assert words == set(MODULE_OF), "cli.COMMAND_MODULES must name every command word"
    everything = _helps(whole)
    for word in sorted(words):
        alone = build_parser(word)
        helps = {path: text for path, text in _helps(alone).items() if path[0] == word}
        assert helps == {path: text for path, text in everything.items() if path[0] == word}, word


@pytest.mark.parametrize(("argv", "word"), [
    (["status", "-o", "json"], "status"),
    (["--address", "127.0.0.1:1", "tasks", "--timeout", "3"], "tasks"),
    (["--addr", "127.0.0.1:1", "nodes"], "nodes"),  # an abbreviated root option, as argparse takes it
    (["--log-level", "debug", "--timeout=2", "collection", "show"], "collection"),
    (["status", "--help"], "status"),
    (["-h", "status"], None),  # the root's help: every command
    (["--version"], None),
    ([], None),
    (["bogus"], None),  # an unknown command: the error lists every command
    (["--timeout", "-1", "status"], None),  # a bad root option: the whole parser says what is wrong
    (["--no-such-option", "status"], None),
    (["completion", "bash"], "completion"),
])
def test_command_word(argv: list[str], word: str | None) -> None:
    assert command_word(argv) == word


def test_root_help_and_errors_still_name_every_command(subprocess_env: dict[str, str], tmp_path: Path) -> None:
    r, _ = run_probe(subprocess_env, tmp_path, "-h", "status")
    assert r.returncode == 0
    for word in ("etcd", "coord", "status", "meta", "stream", "completion"):
        assert f"    {word} " in r.stdout or f"    {word}\n" in r.stdout, word
    r, _ = run_probe(subprocess_env, tmp_path, "bogus")
    assert r.returncode == 2
    assert r.stderr.startswith("error: querycoord: argument COMMAND: invalid choice: 'bogus'"), r.stderr
    assert "'status'" in r.stderr and "'drill'" in r.stderr
    r, _ = run_probe(subprocess_env, tmp_path, "--timeout", "-1", "status")
    assert r.returncode == 2 and r.stderr.startswith("error: querycoord: argument --timeout:"), r.stderr
