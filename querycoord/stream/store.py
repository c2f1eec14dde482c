"""Streams and snodes persisted in etcd: the only stream state that survives a leader change.

Layout under the root path (model: TDengine's SStreamObj and SSnodeObj rows)::

    stream/streams/<id>     StreamDef (protobuf bytes)
    stream/names/<name>     "<id>": the name index, unique by a create-revision compare
    stream/snodes/<id>      SnodeInfo (protobuf bytes)
    stream/snode-ring       bumped by every snode add or drop (serialises ring changes)
    stream/checkpoints/<id> StreamCheckpoint: the consensus checkpoint (``checkpoint_store``; removed by the drop)
    idalloc/stream, idalloc/snode, idalloc/stream-task   id allocators (``IdAllocator``)

Tasks are never persisted (TDengine does not either): the leader rebuilds them
from these definitions and from heartbeats.

Consistency rules, each enforced by compares in the txn of the write (never
by a read-then-write race):

* A stream name is used at most once: the name key is created with a
  ``create_revision == 0`` compare in the txn that writes the stream, so of two
  concurrent creates exactly one wins.
* A stream's main snode exists when the stream is written: the create txn
  compares the snode's value with the one read (so a snode being dropped, whose
  value changed to ``dropping``, is not picked) and puts it back unchanged,
  which moves the snode's mod revision: a drop that read the snode before the
  create then fails its compare and re-reads the streams, so no stream is ever
  left pointing at a dropped snode.
* Updates of a stream (stop, start, move to another snode) compare its mod
  revision with the one read: concurrent updates cannot overwrite each other.
* Ring changes compare ``stream/snode-ring``'s mod revision and bump it: two
  snode adds or drops never interleave, so the ring stays a single cycle.

The replica ring: snodes sorted by id, each one's replica is the next snode by
id and the last one's is the first. With a single snode its replica is 0 (no
replica): naming itself would promise a fallback that does not exist.

Dropped streams are REMOVED (record and name in one txn), not kept with
``user_dropped``: the name is free again at once, and a leader (this one or a
later one) that hears of tasks of a stream it does not know undeploys them
with cleanup, which is what a dropped stream needs. ``drop_stream`` returns the
removed definition with ``user_dropped`` set so the manager can post the
undeploy after the txn commits and remove the stream from its maps.

Writes go through the kv given: the coordinator passes its ``FencedKV``, and
then every txn here also carries the fence compare, so a deposed leader gets
``NotLeader`` and changes nothing. Reads are plain.
"""

from __future__ import annotations

import random
import re
import time
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass

from meta.idalloc import IdAllocator
from meta.kv import MAX_TXN_OPS, KeyValue, MetaKV
from meta.txn import Compare, Op, created_at, delete, modified_at, put, value_is
from proto import common_pb2, stream_pb2
from querycoord.common.errors import Conflict, CoordError, IllegalArgument, NotFound, status_for
from querycoord.common.messages import copy_fields
from querycoord.common.wording import plural
from querycoord.stream.checkpoint_store import checkpoint_key

STREAM_PREFIX = "stream/"
STREAMS_PREFIX = "stream/streams/"
NAMES_PREFIX = "stream/names/"
SNODES_PREFIX = "stream/snodes/"
RING_KEY = "stream/snode-ring"
STREAM_ID_KEY = "idalloc/stream"
SNODE_ID_KEY = "idalloc/snode"
TASK_ID_KEY = "idalloc/stream-task"

DEFAULT_RUNNER_DEPLOYS = 3
# Bounds that keep one stream's task set (and one heartbeat reply) reasonable.
MAX_RUNNER_DEPLOYS = 8
MAX_CALC_SCAN_PLANS = 256
MAX_CALC_SUBPLANS = 256
MAX_SOURCE_VGROUPS = 4096
MAX_NAME_LENGTH = 192
# Optimistic txns lost to concurrent writers are retried this many times before giving up.
MAX_ATTEMPTS = 20
# Streams moved per txn by a chunked snode drop: leaves room for the fence and ring compares.
MOVE_CHUNK = MAX_TXN_OPS - 8

_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_.\-]*$")


# ----- errors ---------------------------------------------------------------------------------------------------------
# How the stream store is named in reasons of errors without context of their own (etcd failures, bugs).
STATUS_SOURCE = "the stream store"


class StreamError(CoordError):
    """A refused stream request; ``code`` is the common.ErrorCode a caller sees, ``reason`` says what was wrong."""


# Each refusal is also the ``querycoord.common.errors`` class of its code (ILLEGAL_ARGUMENT, NOT_FOUND, CONFLICT).
class InvalidStream(StreamError, IllegalArgument):
    """The request itself is malformed (bad name, negative or too large counts)."""


class StreamNotFound(StreamError, NotFound):
    """No stream has the id or name the request gives."""


class SnodeNotFound(StreamError, NotFound):
    """No snode has the id the request gives."""


class StreamExists(StreamError, Conflict):
    """The name is taken by another stream."""


class SnodeExists(StreamError, Conflict):
    """The node already hosts an snode."""


class StreamStateConflict(StreamError, Conflict):
    """Stop of a stopped stream, start of a running one."""


class NoSnodeAvailable(StreamError):
    """No live snode can take the stream (create), or the snode's streams would have nowhere to go (drop)."""

    code = common_pb2.NO_AVAILABLE_NODE


class TooMuchContention(StreamError, Conflict):
    """An optimistic txn kept losing to concurrent writers; nothing was written by the last attempt."""


# The Status a caller should see for an exception (``querycoord.common.errors.status_of``, naming the stream store).
status_of = status_for(STATUS_SOURCE)


# ----- keys and helpers -----------------------------------------------------------------------------------------------
def stream_key(stream_id: int) -> str:
    return f"{STREAMS_PREFIX}{stream_id}"


def name_key(name: str) -> str:
    return f"{NAMES_PREFIX}{name}"


def snode_key(snode_id: int) -> str:
    return f"{SNODES_PREFIX}{snode_id}"


def _now_ms() -> int:
    return int(time.time() * 1000)


def ring_replicas(snode_ids: Collection[int]) -> dict[int, int]:
    """The replica of each snode in the ring (see module docstring): next by id, wrapping; alone -> 0."""
    ids = sorted(snode_ids)
    if len(ids) == 1:
        return {ids[0]: 0}
    return {sid: ids[(i + 1) % len(ids)] for i, sid in enumerate(ids)}


def check_ring(snodes: Sequence[stream_pb2.SnodeInfo]) -> list[str]:
    """Ring invariant violations (empty when consistent): used by tests and drills."""
    expected = ring_replicas([s.id for s in snodes]) if snodes else {}
    problems = [
        f"snode {s.id}: replica {s.replica_id}, expected {expected[s.id]}"
        for s in snodes
        if s.replica_id != expected[s.id]
    ]
    nodes = [s.node_id for s in snodes]
    if len(set(nodes)) != len(nodes):
        problems.append(f"a node hosts more than one snode: {sorted(nodes)}")
    return problems


def _validate(req: stream_pb2.CreateStreamRequest) -> int:
    """Check a create request; returns the runner deploys to use (0 means the default)."""
    name = req.name
    if not name or len(name) > MAX_NAME_LENGTH or not _NAME_RE.match(name):
        raise InvalidStream(
            f"invalid stream name {name!r}: use 1 to {MAX_NAME_LENGTH} letters, digits, '_', '.' or '-', "
            f"starting with a letter or '_'"
        )
    if not req.source_db and not req.source_vgroup_ids and not req.trigger_vgroup_id:
        raise InvalidStream(f"stream {name}: give a source database (source_db and its vgroups) or a trigger vgroup")
    if len(req.source_vgroup_ids) > MAX_SOURCE_VGROUPS:
        raise InvalidStream(f"stream {name}: {len(req.source_vgroup_ids)} source vgroups, at most {MAX_SOURCE_VGROUPS}")
    bad = [v for v in req.source_vgroup_ids if v <= 0]
    if bad or len(set(req.source_vgroup_ids)) != len(req.source_vgroup_ids):
        raise InvalidStream(
            f"stream {name}: source vgroup ids must be positive and distinct, got {list(req.source_vgroup_ids)}"
        )
    if req.trigger_vgroup_id < 0:
        raise InvalidStream(f"stream {name}: trigger_vgroup_id must be >= 0 (0: trigger on every source vgroup)")
    for field, limit in (("num_calc_scan_plans", MAX_CALC_SCAN_PLANS), ("num_calc_subplans", MAX_CALC_SUBPLANS)):
        value = getattr(req, field)
        if not 0 <= value <= limit:
            raise InvalidStream(f"stream {name}: {field} must be in 0..{limit}, got {value}")
    if req.num_calc_scan_plans > 0 and not req.source_vgroup_ids:
        raise InvalidStream(f"stream {name}: {req.num_calc_scan_plans} calc scan plans need source vgroups to read")
    deploys = req.runner_deploys or DEFAULT_RUNNER_DEPLOYS
    if not 1 <= deploys <= MAX_RUNNER_DEPLOYS:
        raise InvalidStream(
            f"stream {name}: runner_deploys must be in 1..{MAX_RUNNER_DEPLOYS} (0 for the default "
            f"{DEFAULT_RUNNER_DEPLOYS}), got {req.runner_deploys}"
        )
    return deploys


@dataclass(frozen=True, slots=True)
class SnodeDrop:
    """What ``drop_snode`` did: the removed snode, how many streams moved, and where."""

    snode: stream_pb2.SnodeInfo
    moved_streams: int
    moved_to: int
    txns: int


class StreamStore:
    """Streams and snodes in etcd (see module docstring). Every write is a txn through ``kv``."""

    def __init__(
        self,
        kv: MetaKV,
        *,
        rng: random.Random | None = None,
        max_attempts: int = MAX_ATTEMPTS,
        move_chunk: int = MOVE_CHUNK,
    ):
        if not 1 <= move_chunk <= MOVE_CHUNK:
            raise ValueError(f"move_chunk must be in 1..{MOVE_CHUNK} (etcd allows {MAX_TXN_OPS} operations per txn)")
        self.kv = kv
        self.move_chunk = move_chunk
        self.rng = rng or random.Random()
        self.max_attempts = max_attempts
        self.stream_ids = IdAllocator(kv, STREAM_ID_KEY, block_size=100)
        self.snode_ids = IdAllocator(kv, SNODE_ID_KEY, block_size=10)
        # Task ids for the manager (and plan.py's id callback): never reused across leaders.
        self.task_ids = IdAllocator(kv, TASK_ID_KEY)

    # ----- low-level txn ---------------------------------------------------------------------------------------------
    async def _txn(self, operation: str, compares: Sequence[Compare], ops: Sequence[Op]) -> bool:
        """One txn guarded by ``compares`` (and the fence when ``kv`` is fenced); returns whether they held.

        With a ``FencedKV`` a lost fence raises ``NotLeader`` (nothing written),
        told apart from a lost optimistic compare (``False``, retry).
        """
        return (await self.kv.txn(compares, ops, operation=operation)).succeeded

    # ----- reads -----------------------------------------------------------------------------------------------------
    async def _get_stream_kv(self, stream_id: int) -> tuple[stream_pb2.StreamDef, KeyValue]:
        item = await self.kv.get_kv(stream_key(stream_id))
        if item is None:
            raise StreamNotFound(f"unknown stream {stream_id}: it does not exist or was dropped "
                                 "(`querycoord stream show` lists the streams)")
        return stream_pb2.StreamDef.FromString(item.value), item

    async def get_stream(self, stream_id: int) -> stream_pb2.StreamDef:
        """The stream ``stream_id``; ``StreamNotFound`` if there is none."""
        return (await self._get_stream_kv(stream_id))[0]

    async def stream_id_of(self, name: str) -> int:
        """The id of the stream named ``name``; ``StreamNotFound`` if there is none."""
        raw = await self.kv.get(name_key(name)) if name else None
        if raw is None:
            raise StreamNotFound(f"unknown stream {name!r}: no stream has this name "
                                 "(`querycoord stream show` lists the streams)")
        return int(raw)

    async def get_stream_by_name(self, name: str) -> stream_pb2.StreamDef:
        return await self.get_stream(await self.stream_id_of(name))

    async def list_streams(self) -> list[stream_pb2.StreamDef]:
        """Every stream, by id (one paged read at one revision)."""
        snap = await self.kv.load_prefix(STREAMS_PREFIX)
        streams = [stream_pb2.StreamDef.FromString(v) for _, v in snap.items()]
        return sorted(streams, key=lambda s: s.id)

    async def _snodes_kv(self) -> dict[int, tuple[stream_pb2.SnodeInfo, KeyValue]]:
        snap = await self.kv.load_prefix(SNODES_PREFIX)
        out: dict[int, tuple[stream_pb2.SnodeInfo, KeyValue]] = {}
        for item in snap.kvs:
            info = stream_pb2.SnodeInfo.FromString(item.value)
            out[info.id] = (info, item)
        return out

    async def list_snodes(self) -> list[stream_pb2.SnodeInfo]:
        """Every snode, by id."""
        return [info for _, (info, _) in sorted((await self._snodes_kv()).items())]

    async def get_snode(self, snode_id: int) -> stream_pb2.SnodeInfo:
        raw = await self.kv.get(snode_key(snode_id))
        if raw is None:
            raise SnodeNotFound(f"unknown snode {snode_id} (`querycoord snode show` lists the snodes)")
        return stream_pb2.SnodeInfo.FromString(raw)

    # ----- streams ---------------------------------------------------------------------------------------------------
    async def create_stream(
        self, req: stream_pb2.CreateStreamRequest, live_snode_ids: Collection[int]
    ) -> stream_pb2.StreamDef:
        """Persist a new stream; returns it (``create_or_get_stream`` without saying whether it existed)."""
        return (await self.create_or_get_stream(req, live_snode_ids))[0]

    async def create_or_get_stream(
        self, req: stream_pb2.CreateStreamRequest, live_snode_ids: Collection[int]
    ) -> tuple[stream_pb2.StreamDef, bool]:
        """Persist a new stream; returns it with its id and main snode, and whether it already existed.

        The main snode is picked at random among the snodes that exist, are not
        being dropped and are in ``live_snode_ids`` (the store does not know
        liveness; the manager does). With ``if_not_exists`` an existing stream
        of that name is returned unchanged (and ``True``). The manager posts the deploy only
        after this returns (the txn has committed), not before.
        """
        deploys = _validate(req)
        stream_id = 0
        for _ in range(self.max_attempts):
            existing = await self.kv.get(name_key(req.name))
            if existing is not None:
                if req.if_not_exists:
                    return await self.get_stream(int(existing)), True
                raise StreamExists(
                    f"a stream named {req.name!r} already exists (id {int(existing)}); pick another name"
                )
            snodes = await self._snodes_kv()
            live = set(live_snode_ids)
            candidates = sorted(sid for sid, (info, _) in snodes.items() if sid in live and not info.dropping)
            if not candidates:
                raise NoSnodeAvailable(
                    f"no snode is available for stream {req.name!r}: "
                    + (
                        "create an snode first (`querycoord snode create NODE_ID`)"
                        if not snodes
                        else f"none of the snodes {sorted(snodes)} is live; start their stream nodes"
                    )
                )
            main = self.rng.choice(candidates)
            _, main_item = snodes[main]
            if not stream_id:
                stream_id = (await self.stream_ids.allocate(1))[0]
            now = _now_ms()
            # The definition is the request's fields (its name, source and plan sizes) with what was decided here.
            sdef = copy_fields(req, stream_pb2.StreamDef, id=stream_id, runner_deploys=deploys, main_snode_id=main,
                               create_ms=now, update_ms=now)
            compares = [created_at(name_key(req.name), 0), value_is(snode_key(main), main_item.value)]
            ops = [
                put(stream_key(stream_id), sdef.SerializeToString()),
                put(name_key(req.name), str(stream_id)),
                # Unchanged value, new mod revision: a concurrent drop of this snode notices (module docstring).
                put(snode_key(main), main_item.value),
            ]
            if await self._txn(f"create stream {req.name}", compares, ops):
                return sdef, False
            # The name was taken meanwhile, or the snode changed: re-read and decide again.
        raise TooMuchContention(f"create stream {req.name!r}: lost {self.max_attempts} txns to concurrent changes")

    async def _update_stream(
        self, stream_id: int, operation: str, change: Callable[[stream_pb2.StreamDef], None]
    ) -> stream_pb2.StreamDef:
        """Read-modify-write of one stream under a mod-revision compare, retried when another write won."""
        for _ in range(self.max_attempts):
            sdef, item = await self._get_stream_kv(stream_id)
            change(sdef)
            sdef.update_ms = _now_ms()
            ok = await self._txn(
                f"{operation} stream {stream_id}",
                [modified_at(item.key, item.mod_revision)],
                [put(item.key, sdef.SerializeToString())],
            )
            if ok:
                return sdef
        raise TooMuchContention(f"{operation} stream {stream_id}: lost {self.max_attempts} txns to concurrent changes")

    async def stop_stream(self, stream_id: int) -> stream_pb2.StreamDef:
        """Set ``user_stopped`` and the stop time; stopping a stopped stream is a ``StreamStateConflict``."""

        def stop(sdef: stream_pb2.StreamDef) -> None:
            if sdef.user_stopped:
                raise StreamStateConflict(f"stream {sdef.name} (id {sdef.id}) is already stopped; start it instead")
            sdef.user_stopped = True
            sdef.stop_ms = _now_ms()

        return await self._update_stream(stream_id, "stop", stop)

    async def start_stream(self, stream_id: int, ignore_untreated: bool = False) -> stream_pb2.StreamDef:
        """Clear ``user_stopped``; starting a stream that is not stopped is a ``StreamStateConflict``.

        With ``ignore_untreated`` the stream's tasks start from now
        (``start_from_ms``), skipping what was written while it was stopped;
        without it ``start_from_ms`` is cleared and they resume where they were.
        """

        def start(sdef: stream_pb2.StreamDef) -> None:
            if not sdef.user_stopped:
                raise StreamStateConflict(
                    f"stream {sdef.name} (id {sdef.id}) is not stopped by a user, so there is nothing to start"
                )
            sdef.user_stopped = False
            sdef.start_from_ms = _now_ms() if ignore_untreated else 0

        return await self._update_stream(stream_id, "start", start)

    async def drop_stream(self, stream_id: int) -> stream_pb2.StreamDef:
        """Remove the stream and its name in one txn; returns the removed definition with ``user_dropped`` set."""
        for _ in range(self.max_attempts):
            sdef, item = await self._get_stream_kv(stream_id)
            ok = await self._txn(
                f"drop stream {stream_id}",
                [modified_at(item.key, item.mod_revision)],
                [delete(item.key), delete(name_key(sdef.name)), delete(checkpoint_key(stream_id))],
            )
            if ok:
                sdef.user_dropped = True
                sdef.update_ms = _now_ms()
                return sdef
        raise TooMuchContention(f"drop stream {stream_id}: lost {self.max_attempts} txns to concurrent changes")

    # ----- snodes ----------------------------------------------------------------------------------------------------
    def _ring_ops(
        self, snodes: dict[int, tuple[stream_pb2.SnodeInfo, KeyValue]], new_ids: Collection[int]
    ) -> list[Op]:
        """Puts of the existing snodes (still in ``new_ids``) whose replica changes in the ring of ``new_ids``."""
        replicas = ring_replicas(new_ids) if new_ids else {}
        ops: list[Op] = []
        for sid, (info, item) in snodes.items():
            if sid in replicas and info.replica_id != replicas[sid]:
                changed = stream_pb2.SnodeInfo()
                changed.CopyFrom(info)
                changed.replica_id = replicas[sid]
                ops.append(put(item.key, changed.SerializeToString()))
        return ops

    async def _ring_revision(self) -> int:
        item = await self.kv.get_kv(RING_KEY)
        return item.mod_revision if item is not None else 0

    async def create_snode(self, node_id: int) -> stream_pb2.SnodeInfo:
        """Add an snode on ``node_id`` to the ring (one txn: the new snode and its predecessor's new replica)."""
        if node_id <= 0:
            raise InvalidStream(f"create snode: node id must be positive, got {node_id}")
        snode_id = 0
        for _ in range(self.max_attempts):
            ring_rev = await self._ring_revision()
            snodes = await self._snodes_kv()
            for info, _ in snodes.values():
                if info.node_id == node_id:
                    raise SnodeExists(f"node {node_id} already hosts snode {info.id}; a node hosts at most one snode")
            if not snode_id:
                snode_id = (await self.snode_ids.allocate(1))[0]
            new_ids = [*snodes, snode_id]
            info = stream_pb2.SnodeInfo(
                id=snode_id, node_id=node_id, replica_id=ring_replicas(new_ids)[snode_id], create_ms=_now_ms()
            )
            ops = [put(snode_key(snode_id), info.SerializeToString()), *self._ring_ops(snodes, new_ids)]
            ops.append(put(RING_KEY, str(snode_id)))
            if await self._txn(f"create snode on node {node_id}", [modified_at(RING_KEY, ring_rev)], ops):
                return info
        raise TooMuchContention(f"create snode on node {node_id}: lost {self.max_attempts} txns to ring changes")

    async def drop_snode(self, snode_id: int) -> SnodeDrop:
        """Remove an snode, moving every stream whose main snode it is to its replica.

        When the streams fit (up to ``MOVE_CHUNK``), the moves, the ring update
        and the snode's removal are ONE txn. Beyond etcd's 128 operations per
        txn the drop is chunked: first the snode is marked ``dropping`` (no new
        stream picks it, and a create that read it before fails its value
        compare), then streams move ``MOVE_CHUNK`` per txn, and the snode's
        removal with the ring update comes LAST, in the txn of the final
        chunk. A crash between chunks leaves a consistent state: moved streams
        point at the replica, which exists; the rest still point at the
        snode, which still exists; calling ``drop_snode`` again finishes.

        Refused (``NoSnodeAvailable``) when streams use it and it is the only
        snode: they would have nowhere to go.
        """
        txns = 0
        moved = 0
        for _ in range(self.max_attempts):
            ring_rev = await self._ring_revision()
            snodes = await self._snodes_kv()
            if snode_id not in snodes:
                raise SnodeNotFound(f"unknown snode {snode_id}: it does not exist or was already dropped")
            info, item = snodes[snode_id]
            streams = [s for s in await self._stream_kvs() if s[0].main_snode_id == snode_id]
            others = [sid for sid in snodes if sid != snode_id]
            target = info.replica_id if info.replica_id in others else (min(others) if others else 0)
            if streams and not target:
                raise NoSnodeAvailable(
                    f"cannot drop snode {snode_id}: it is the only snode and {plural(len(streams), 'stream')} "
                    f"{'uses' if len(streams) == 1 else 'use'} it "
                    f"(e.g. {', '.join(s.name for s, _ in streams[:5])}); create another snode first, or drop "
                    f"or move those streams"
                )
            rest = {sid: v for sid, v in snodes.items() if sid != snode_id}
            final_ops = [delete(item.key), *self._ring_ops(rest, others), put(RING_KEY, str(snode_id))]
            room = min(self.move_chunk, MAX_TXN_OPS - len(final_ops) - 2)
            if len(streams) > room and not info.dropping:
                marked = stream_pb2.SnodeInfo()
                marked.CopyFrom(info)
                marked.dropping = True
                ok = await self._txn(
                    f"mark snode {snode_id} dropping",
                    [modified_at(item.key, item.mod_revision)],
                    [put(item.key, marked.SerializeToString())],
                )
                txns += ok
                continue  # re-read: the streams loaded after the mark are all there are
            while len(streams) > room:
                chunk, streams = streams[: self.move_chunk], streams[self.move_chunk :]
                # The ring compare: a concurrent drop of the target makes this chunk fail and re-read.
                guard = [modified_at(RING_KEY, ring_rev), modified_at(item.key, item.mod_revision)]
                if not await self.move_streams(chunk, target, guard):
                    break
                txns += 1
                moved += len(chunk)
            else:
                compares = [modified_at(RING_KEY, ring_rev), modified_at(item.key, item.mod_revision)]
                compares += [modified_at(kv.key, kv.mod_revision) for _, kv in streams]
                ops = [*self._move_ops(streams, target), *final_ops]
                if await self._txn(f"drop snode {snode_id}", compares, ops):
                    return SnodeDrop(info, moved + len(streams), target, txns + 1)
        raise TooMuchContention(f"drop snode {snode_id}: lost {self.max_attempts} txns to concurrent changes")

    async def _stream_kvs(self) -> list[tuple[stream_pb2.StreamDef, KeyValue]]:
        snap = await self.kv.load_prefix(STREAMS_PREFIX)
        return [(stream_pb2.StreamDef.FromString(item.value), item) for item in snap.kvs]

    def _move_ops(self, streams: Sequence[tuple[stream_pb2.StreamDef, KeyValue]], target: int) -> list[Op]:
        now = _now_ms()
        ops: list[Op] = []
        for sdef, item in streams:
            moved = stream_pb2.StreamDef()
            moved.CopyFrom(sdef)
            moved.main_snode_id = target
            moved.update_ms = now
            ops.append(put(item.key, moved.SerializeToString()))
        return ops

    async def move_streams(
        self, streams: Sequence[tuple[stream_pb2.StreamDef, KeyValue]], target: int, extra: Sequence[Compare]
    ) -> bool:
        compares = [*extra, *(modified_at(kv.key, kv.mod_revision) for _, kv in streams)]
        ops = self._move_ops(streams, target)
        return await self._txn(f"move {len(streams)} streams to snode {target}", compares, ops)


__all__ = [
    "DEFAULT_RUNNER_DEPLOYS",
    "NoSnodeAvailable",
    "SnodeDrop",
    "SnodeExists",
    "SnodeNotFound",
    "StreamError",
    "StreamExists",
    "StreamNotFound",
    "StreamStateConflict",
    "StreamStore",
    "check_ring",
    "ring_replicas",
    "status_of",
]
