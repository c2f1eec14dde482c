"""README's "Lag and progress": its alert rules parse as Prometheus rules naming only metrics the coordinator
exports, and its ``stream show --summary`` example is what the
drawing code prints for the state it describes."""

from __future__ import annotations

import re
import time
import types
from pathlib import Path
from typing import Any

import yaml

from proto import stream_pb2 as sp
from querycoord.console import draw
from querycoord.serving.stream_metrics import stream_progress_families
from querycoord.stream.plan import RUNNER, PlannedTask
from querycoord.stream.runtime import StreamRuntime, TaskRuntime


def section(project_root: Path) -> str:
    text = (project_root / "README.md").read_text()
    start = text.index("### Lag and progress")
    return text[start:text.index("\n## ", start)]


def block(text: str, fence: str) -> str:
    start = text.index(fence + "\n") + len(fence) + 1
    return text[start:text.index("```", start)]


def exported_stream_metrics() -> set[str]:
    """The names the coordinator's per-stream families export, from the code itself."""
    rt = StreamRuntime(sdef=sp.StreamDef(id=1, name="s1"))
    rt.tasks[1] = TaskRuntime(task=PlannedTask(kind=RUNNER, task_id=1), processed_ms=1, source_ms=2)
    rt.checkpoint_id, rt.checkpoint_ms = 3, 1
    manager: Any = types.SimpleNamespace(streams={1: rt})
    return {family.name for family in stream_progress_families(manager, 10)}


def test_alert_rules_parse_and_name_only_exported_metrics(project_root: Path) -> None:
    text = section(project_root)
    doc = yaml.safe_load(block(text, "```yaml"))
    rules = [r for group in doc["groups"] for r in group["rules"]]
    assert {r["alert"] for r in rules} == {"StreamFailed", "StreamLagging", "StreamNotCheckpointing"}
    for rule in rules:
        assert set(rule) <= {"alert", "expr", "for", "labels", "annotations"}, rule
        assert re.fullmatch(r"\d+[smh]", rule["for"]), rule
    exprs = {r["alert"]: r["expr"] for r in rules}
    assert exprs["StreamFailed"] == "querycoord_stream_failed == 1"
    assert exprs["StreamLagging"] == "querycoord_stream_lag_seconds > 300"
    assert exprs["StreamNotCheckpointing"].startswith("querycoord_stream_checkpoint_age_seconds > 3 * ")

    exported = exported_stream_metrics()
    named = {m for expr in exprs.values() for m in re.findall(r"\bquerycoord_[a-z_]+", expr)}
    assert named <= exported, f"named but not exported: {named - exported}"
    assert named == {"querycoord_stream_failed", "querycoord_stream_lag_seconds",
                     "querycoord_stream_checkpoint_age_seconds"}


def test_summary_example_is_what_stream_show_draws(project_root: Path) -> None:
    lines = block(section(project_root), "```text").rstrip("\n").split("\n")
    assert lines[0] == "$ querycoord stream show --summary"
    # The state the example describes: s1 running, its slowest task at 21:42:17.1 today (local time), 42.5 s behind.
    processed_ms = int(time.mktime(time.strptime(time.strftime("%Y-%m-%d") + " 21:42:17", "%Y-%m-%d %H:%M:%S"))
                       * 1000) + 100
    tasks = [sp.TaskRow(task=sp.TaskId(task_id=i, kind=kind, sid=1, snode_id=snode, deploy_id=deploy,
                                       top=kind == sp.RUNNER and idx == 1, task_idx=idx), status=sp.TASK_RUNNING)
             for i, kind, snode, deploy, idx in [
                 (1, sp.TRIGGER, 1, 0, 0), (2, sp.TRIGGER_READER, 0, 0, 0), (3, sp.TRIGGER_READER, 0, 0, 1),
                 (4, sp.CALC_READER, 0, 0, 0), (5, sp.CALC_READER, 0, 0, 1), (6, sp.RUNNER, 1, 0, 0),
                 (7, sp.RUNNER, 1, 0, 1), (8, sp.RUNNER, 1, 1, 0), (9, sp.RUNNER, 1, 1, 1), (10, sp.RUNNER, 2, 2, 0),
                 (11, sp.RUNNER, 2, 2, 1)]]
    info = sp.StreamStatusInfo(stream=sp.StreamDef(id=1, name="s1", main_snode_id=1), state=sp.STREAM_RUNNING,
                               tasks=tasks, processed_ms=processed_ms, lag_ms=42_500)
    assert draw.stream_summary(sp.ShowStreamsResponse(streams=[info])) == lines[1:]
