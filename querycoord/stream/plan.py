"""The expected task set of a stream: pure functions, no I/O.

TDengine's placement (``mndStreamMgmt.c``), expressed once and used both to
deploy a stream and to check, after WATCH, that what nodes report is
complete. Using the same functions for both is the point: if the two
counted differently (say, one calc reader per scan plan against one per
(scan plan, vgroup)), every stream they disagree on would be redeployed
after each failover instead of adopted.

Tasks of a stream:

* trigger readers: one per vgroup of the source database, or one on the
  trigger table's vgroup (``trigger_vgroup_id``);
* calc readers: one per (calc scan plan, source vgroup);
* one trigger, on the stream's static snode;
* runners: ``runner_deploys`` copies of the calc DAG of ``num_calc_subplans``
  tasks, the last of each copy flagged top; deploy 0 on the static snode,
  the others on live snodes picked by the caller's ``random.Random``.

``task_layout`` is the same set as slots (kind, deploy, index) with everything
a slot fixes (vgroup, scan plan, top); ``plan_stream`` fills exactly these
slots. A new leader uses it to check and to restore adopted tasks field by
field, so an adopted calc reader keeps its scan plan (and a reader
redeployed later does not carry a wrong one).

The static snode is the stream's main snode when live, else its replica when
live; with neither there is no placement (``NoSnodeAvailable``), as in
TDengine's ``msmRetrieveStaticSnodeId``. Readers name only a vgroup: the
manager sends them to whichever node reports leading it.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any

from proto import stream_pb2
from querycoord.stream.store import InvalidStream, NoSnodeAvailable

FIRST_SID = 1

TRIGGER_READER = stream_pb2.TRIGGER_READER
CALC_READER = stream_pb2.CALC_READER
TRIGGER = stream_pb2.TRIGGER
RUNNER = stream_pb2.RUNNER


@dataclass(frozen=True, slots=True)
class PlannedTask:
    """One task to deploy: identity and target (a vgroup for readers, an snode for the trigger and runners)."""

    kind: int
    task_id: int
    sid: int = FIRST_SID
    deploy_id: int = 0
    task_idx: int = 0
    vgroup_id: int = 0
    snode_id: int = 0
    scan_plan_idx: int = 0
    top: bool = False

    @classmethod
    def of(cls, msg: stream_pb2.TaskId | stream_pb2.TaskStatusReport, **fixed: Any) -> PlannedTask:
        """The task ``msg`` names (its fields of the same names), with ``fixed`` over them."""
        return cls(**{name: fixed[name] if name in fixed else getattr(msg, name) for name in _PLANNED_FIELDS})

    def to_proto(self, stream_id: int, node_id: int = 0) -> stream_pb2.TaskId:
        """The ``TaskId`` of this task for a deploy message (``node_id``: where it is being sent)."""
        own = {name: getattr(self, name) for name in _PLANNED_FIELDS}
        return stream_pb2.TaskId(stream_id=stream_id, node_id=node_id, **own)


# A planned task's fields, all of them also fields of ``TaskId`` and of ``TaskStatusReport``.
_PLANNED_FIELDS = tuple(f.name for f in fields(PlannedTask))


@dataclass(frozen=True, slots=True)
class ExpectedCounts:
    """How many tasks of each kind a complete stream has (WATCH's completeness check)."""

    trigger_readers: int
    calc_readers: int
    runner_deploys: int
    runners_per_deploy: int
    triggers: int = 1

    @property
    def runners(self) -> int:
        return self.runner_deploys * self.runners_per_deploy

    @property
    def total(self) -> int:
        return self.trigger_readers + self.calc_readers + self.triggers + self.runners


@dataclass(slots=True)
class StreamPlan:
    """A stream's full task set; ``runners[d]`` is deploy ``d`` in DAG order (its last task is the top)."""

    stream_id: int
    static_snode_id: int
    trigger: PlannedTask
    trigger_readers: list[PlannedTask] = field(default_factory=list)
    calc_readers: list[PlannedTask] = field(default_factory=list)
    runners: list[list[PlannedTask]] = field(default_factory=list)

    def tasks(self) -> list[PlannedTask]:
        """Every task: trigger readers, calc readers, runners by deploy, then the trigger."""
        out = [*self.trigger_readers, *self.calc_readers]
        for deploy in self.runners:
            out.extend(deploy)
        out.append(self.trigger)
        return out

    def top_runners(self) -> list[PlannedTask]:
        """The top runner of each deploy, in deploy order (what the trigger's deploy message lists)."""
        return [deploy[-1] for deploy in self.runners if deploy]

    def counts(self) -> ExpectedCounts:
        return ExpectedCounts(
            trigger_readers=len(self.trigger_readers),
            calc_readers=len(self.calc_readers),
            runner_deploys=len(self.runners),
            runners_per_deploy=len(self.runners[0]) if self.runners else 0,
        )


def source_vgroups(sdef: stream_pb2.StreamDef, vgroups: Iterable[int] | None = None) -> list[int]:
    """The source database's vgroups: those given (the catalog's current ones), else the persisted list; sorted."""
    ids = sorted(set(vgroups if vgroups is not None else sdef.source_vgroup_ids))
    if any(v <= 0 for v in ids):
        raise InvalidStream(f"stream {sdef.name}: vgroup ids must be positive, got {ids}")
    return ids


def trigger_reader_vgroups(sdef: stream_pb2.StreamDef, vgroups: Iterable[int] | None = None) -> list[int]:
    """One trigger reader per source vgroup, or a single one on the trigger table's vgroup."""
    if sdef.trigger_vgroup_id:
        return [sdef.trigger_vgroup_id]
    return source_vgroups(sdef, vgroups)


def expected_counts(sdef: stream_pb2.StreamDef, vgroups: Iterable[int] | None = None) -> ExpectedCounts:
    """The task counts ``plan_stream`` produces for ``sdef`` on ``vgroups`` (same rules, no placement)."""
    src = source_vgroups(sdef, vgroups)
    subplans = sdef.num_calc_subplans
    return ExpectedCounts(
        trigger_readers=len(trigger_reader_vgroups(sdef, src)),
        calc_readers=sdef.num_calc_scan_plans * len(src),
        runner_deploys=sdef.runner_deploys if subplans > 0 else 0,
        runners_per_deploy=subplans,
    )


def calc_reader_slots(sdef: stream_pb2.StreamDef, vgroups: Iterable[int] | None = None) -> list[tuple[int, int]]:
    """(scan plan, vgroup) of each calc reader, in task_idx order: scan plan major, then vgroup."""
    src = source_vgroups(sdef, vgroups)
    return [(p, vg) for p in range(sdef.num_calc_scan_plans) for vg in src]


@dataclass(frozen=True, slots=True)
class Slot:
    """What ``plan_stream`` fixes for one task slot besides ids, SIDs and snodes (those are placement)."""

    vgroup_id: int = 0
    scan_plan_idx: int = 0
    top: bool = False


SlotKey = tuple[int, int, int]  # (kind, deploy_id, task_idx)


def task_layout(sdef: stream_pb2.StreamDef, vgroups: Iterable[int] | None = None) -> dict[SlotKey, Slot]:
    """Every task slot of ``sdef`` (the trigger is ``(TRIGGER, 0, 0)``): what ``plan_stream`` deploys, minus placement.

    Pure and deterministic, so a new leader can restore the fields a heartbeat
    report may lack and reject reports that do not fit the definition.
    """
    counts = expected_counts(sdef, vgroups)
    layout: dict[SlotKey, Slot] = {(TRIGGER, 0, 0): Slot()}
    src = source_vgroups(sdef, vgroups)
    for i, vg in enumerate(trigger_reader_vgroups(sdef, src)):
        layout[(TRIGGER_READER, 0, i)] = Slot(vgroup_id=vg)
    for i, (p, vg) in enumerate(calc_reader_slots(sdef, src)):
        layout[(CALC_READER, 0, i)] = Slot(vgroup_id=vg, scan_plan_idx=p)
    last = counts.runners_per_deploy - 1
    for d in range(counts.runner_deploys):
        for i in range(counts.runners_per_deploy):
            layout[(RUNNER, d, i)] = Slot(top=i == last)
    return layout


def static_snode(main_snode_id: int, replica_of: Mapping[int, int], live_snode_ids: Collection[int]) -> int:
    """Where the trigger and runner deploy 0 go: the main snode if live, else its replica if live."""
    if main_snode_id in live_snode_ids:
        return main_snode_id
    replica = replica_of.get(main_snode_id, 0)
    if replica and replica in live_snode_ids:
        return replica
    raise NoSnodeAvailable(
        f"no snode is available: main snode {main_snode_id} is not live"
        + (f" and neither is its replica {replica}" if replica else " and it has no replica")
    )


def place_runner_deploys(
    static_snode_id: int, deploys: int, live_snode_ids: Collection[int], rng: random.Random
) -> list[int]:
    """The snode of each runner deploy: deploy 0 on the static snode, the others on random live snodes.

    The candidates are sorted before drawing so that a seeded ``rng`` gives
    the same placement whatever the order of ``live_snode_ids``. It also
    places runners again after an snode is lost.
    """
    if deploys <= 0:
        return []
    live = sorted(set(live_snode_ids))
    if not live:
        raise NoSnodeAvailable("no snode is available: no live snode to run the stream's runners")
    return [static_snode_id, *(rng.choice(live) for _ in range(deploys - 1))]


def plan_stream(
    sdef: stream_pb2.StreamDef,
    vgroups: Iterable[int] | None,
    live_snode_ids: Collection[int],
    replica_of: Mapping[int, int],
    next_ids: Callable[[int], Sequence[int]],
    rng: random.Random,
) -> StreamPlan:
    """Every task of ``sdef`` with fresh ids (``next_ids(n)`` returns ``n`` new ids) and SID 1.

    ``vgroups``: the source database's vgroups now (``None``: the persisted
    list). ``replica_of``: each snode's replica (``SnodeInfo.replica_id``).
    Ids are handed out in TDengine's order: trigger, trigger readers, calc
    readers, runners by deploy. Raises ``NoSnodeAvailable`` when neither the
    main snode nor its replica is live, ``InvalidStream`` when there is no
    vgroup to read.
    """
    counts = expected_counts(sdef, vgroups)
    if counts.trigger_readers == 0:
        raise InvalidStream(f"stream {sdef.name}: the source database has no vgroups, so nothing can trigger it")
    static = static_snode(sdef.main_snode_id, replica_of, live_snode_ids)
    placement = place_runner_deploys(static, counts.runner_deploys, live_snode_ids, rng)
    ids = list(next_ids(counts.total))
    if len(ids) != counts.total or len(set(ids)) != len(ids):
        raise ValueError(f"next_ids({counts.total}) returned {len(ids)} ids ({len(set(ids))} distinct)")
    it = iter(ids)
    trigger = PlannedTask(kind=TRIGGER, task_id=next(it), snode_id=static)
    src = source_vgroups(sdef, vgroups)
    trigger_readers = [
        PlannedTask(kind=TRIGGER_READER, task_id=next(it), task_idx=i, vgroup_id=vg)
        for i, vg in enumerate(trigger_reader_vgroups(sdef, src))
    ]
    calc_readers = [
        PlannedTask(kind=CALC_READER, task_id=next(it), task_idx=i, vgroup_id=vg, scan_plan_idx=p)
        for i, (p, vg) in enumerate(calc_reader_slots(sdef, src))
    ]
    last = counts.runners_per_deploy - 1
    runners = [
        [
            PlannedTask(kind=RUNNER, task_id=next(it), deploy_id=d, task_idx=i, snode_id=snode, top=i == last)
            for i in range(counts.runners_per_deploy)
        ]
        for d, snode in enumerate(placement)
    ]
    return StreamPlan(
        stream_id=sdef.id,
        static_snode_id=static,
        trigger=trigger,
        trigger_readers=trigger_readers,
        calc_readers=calc_readers,
        runners=runners,
    )


__all__ = [
    "ExpectedCounts",
    "PlannedTask",
    "Slot",
    "SlotKey",
    "StreamPlan",
    "calc_reader_slots",
    "expected_counts",
    "place_runner_deploys",
    "plan_stream",
    "source_vgroups",
    "static_snode",
    "task_layout",
    "trigger_reader_vgroups",
]
