"""The fuzzing engine: hostile requests derived from the protobuf descriptors, sent raw, every answer classified.

Why it is built this way:

* **Coverage follows the protos.** Every unary RPC of every service in ``proto/querycoord.proto``,
  ``catalog.proto``, ``stream.proto``, ``querynode.proto`` and gRPC health is enumerated from the file
  descriptors (``rpcs``), and each request is drawn by walking its message descriptor (``MessageStrategies``):
  integers get boundary values, strings get empty, huge, unicode and control characters, enums get unknown
  numbers, repeated fields get many and duplicate items, nested messages and oneofs are recursed into. A new
  field or RPC is fuzzed without touching this file.
* **Real ids reach deeper code.** A ``World`` holds what the cluster really has (collections and their
  partitions, segments, nodes, snodes, streams, tasks), fed by every answer; integers and names are drawn
  from it often, and a share of the requests are well-formed mutations of real things (``valid_request``).
* **Garbage goes through unchanged.** Requests are sent as bytes on ``channel.unary_unary(path,
  request_serializer=None, response_deserializer=None)``: random bytes, truncated and bit-flipped messages,
  another RPC's request type, invalid UTF-8 in a string field, broken wire types, an oversized message.
* **Every answer is classified** (``classify``): a decoded response carrying a status, a proper gRPC code,
  a crash (UNKNOWN, INTERNAL, an undecodable answer, a status UNEXPECTED_ERROR, which is what a handler's
  unexpected exception becomes), or unanswered (DEADLINE_EXCEEDED, a dropped connection).

Generation runs in hypothesis (``@given`` with a seed, generate phase only, in a worker thread) one batch at a
time, so the world seen by the strategies grows as the run creates things; ``Fuzzer`` sends the cases from
several concurrent clients (asyncio tasks with their own channels), each call with a deadline.
"""

from __future__ import annotations

import asyncio
import random
import re
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import grpc
from google.protobuf import message_factory, text_format
from google.protobuf.descriptor import Descriptor, FieldDescriptor, FileDescriptor
from google.protobuf.message import DecodeError, Message
from grpc_health.v1 import health_pb2
from hypothesis import HealthCheck, Phase, given, seed, settings
from hypothesis import strategies as st

from proto import catalog_pb2, common_pb2, data_pb2, querycoord_pb2, querynode_pb2, stream_pb2
from querycoord.common.protocol import parse_leader

COORDINATOR = "coordinator"
QUERY_NODE = "query node"

# Where each service is served: the coordinator serves QueryCoord, Catalog, StreamMgmt (StreamHeartbeat
# included: stream nodes serve nothing) and health; a query node serves QueryNode.
_FILES: tuple[tuple[FileDescriptor, str], ...] = (
    (querycoord_pb2.DESCRIPTOR, COORDINATOR),
    (catalog_pb2.DESCRIPTOR, COORDINATOR),
    (stream_pb2.DESCRIPTOR, COORDINATOR),
    (health_pb2.DESCRIPTOR, COORDINATOR),
    (querynode_pb2.DESCRIPTOR, QUERY_NODE),
)

# Calls that change who leads: fuzzed, but rarely, or the run measures nothing but handovers.
RARE_METHODS = frozenset({"Switchover", "StepBack"})

# gRPC codes that are a proper answer to a hostile request (UNAVAILABLE only from a standby naming the leader,
# see ``classify``). UNAUTHENTICATED / PERMISSION_DENIED are proper once the surfaces check callers.
PROPER_CODES = frozenset({
    grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.NOT_FOUND, grpc.StatusCode.FAILED_PRECONDITION,
    grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.RESOURCE_EXHAUSTED, grpc.StatusCode.OUT_OF_RANGE,
    grpc.StatusCode.ALREADY_EXISTS, grpc.StatusCode.ABORTED, grpc.StatusCode.UNAUTHENTICATED,
    grpc.StatusCode.PERMISSION_DENIED,
})
CRASH_CODES = frozenset({grpc.StatusCode.UNKNOWN, grpc.StatusCode.INTERNAL})

# Largest message a gRPC server accepts by default; the oversized case is just above it.
DEFAULT_MAX_MESSAGE = 4 * 1024 * 1024

INT32 = (-(2**31), 2**31 - 1)
INT64 = (-(2**63), 2**63 - 1)
UINT32 = (0, 2**32 - 1)
UINT64 = (0, 2**64 - 1)
_BOUNDARY_INTS = (0, -1, 1, 2, 7, 100, 255, 256, 4096, 4097, 65535, 65536, 2**31 - 1, -(2**31), 2**31, 2**32,
                  2**53 + 1, 2**63 - 1, -(2**63), 2**64 - 1)
_HOSTILE_TEXT = ("", " ", "\x00", "a\x00b", "\t\n\r", "../../etc/passwd", "a/b", "/", "x" * 256, "é" * 300,
                 "\u202eevil", "\U0001f4a9" * 50, "ﬀ", "\x7f\x1b[2J", "%s%n%x", "{}", "' OR 1=1 --", "name with spaces",
                 "queryCoord-triggerTask/1", "stream/streams/1", "\ufeff", "\ud7ff", "NaN")
_CONTROL = st.characters(min_codepoint=0, max_codepoint=0x1f)
_ANY_CHAR = st.characters(exclude_categories=["Cs"])
_HUGE_SIZES = (1024, 70_000, 300_000, 1_100_000)


# ----- the RPCs -----------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Rpc:
    """One unary method of one service, with its request and response classes and where it is served."""

    service: str  # full name, e.g. querycoord.query.QueryCoord
    method: str
    request: type[Message]
    response: type[Message]
    surface: str  # COORDINATOR or QUERY_NODE

    @property
    def path(self) -> str:
        return f"/{self.service}/{self.method}"

    @property
    def label(self) -> str:
        """``QueryCoord.LoadCollection``: short enough for a table."""
        return f"{self.service.rsplit('.', 1)[-1]}.{self.method}"


def rpcs() -> list[Rpc]:
    """Every unary RPC of every service, from the descriptors (streaming methods, i.e. health Watch, skipped)."""
    out = []
    for file, surface in _FILES:
        for service in file.services_by_name.values():
            for m in service.methods:
                if m.client_streaming or m.server_streaming:
                    continue
                out.append(Rpc(service.full_name, m.name, message_factory.GetMessageClass(m.input_type),
                               message_factory.GetMessageClass(m.output_type), surface))
    return out


# ----- what the cluster really has ----------------------------------------------------------------------------------
@dataclass
class World:
    """Real ids and names the strategies draw from, fed by every decoded answer (``learn``).

    Mutated on the event loop only; the generating thread gets a ``snapshot``.
    """

    collections: dict[int, list[int]] = field(default_factory=dict)  # collection id -> partition ids
    collection_names: list[str] = field(default_factory=list)
    segments: dict[int, tuple[int, int]] = field(default_factory=dict)  # segment id -> (collection, partition)
    channels: dict[int, list[str]] = field(default_factory=dict)  # collection id -> dm channels
    query_nodes: list[int] = field(default_factory=list)
    stream_nodes: list[int] = field(default_factory=list)
    vgroups: list[int] = field(default_factory=list)
    snodes: list[int] = field(default_factory=list)
    streams: dict[int, str] = field(default_factory=dict)
    tasks: list[int] = field(default_factory=list)
    coordinators: list[str] = field(default_factory=list)
    fence_revision: int = 0
    other_ids: list[int] = field(default_factory=list)

    def ids(self) -> list[int]:
        """Every id known, of any kind: a request naming one kind with another kind's id is a good test too."""
        out = [*self.collections, *(p for ps in self.collections.values() for p in ps), *self.segments,
               *self.query_nodes, *self.stream_nodes, *self.vgroups, *self.snodes, *self.streams, *self.tasks,
               *self.other_ids]
        return out[-2000:] or [1]

    def names(self) -> list[str]:
        return [*self.collection_names, *self.streams.values(), *self.coordinators,
                *(c for cs in self.channels.values() for c in cs)][-500:] or ["_default"]

    def snapshot(self) -> World:
        return World({k: list(v) for k, v in self.collections.items()}, list(self.collection_names),
                     dict(self.segments), {k: list(v) for k, v in self.channels.items()}, list(self.query_nodes),
                     list(self.stream_nodes), list(self.vgroups), list(self.snodes), dict(self.streams),
                     list(self.tasks[-200:]), list(self.coordinators), self.fence_revision, list(self.other_ids[-200:]))

    def learn(self, msg: Message) -> None:
        """Take the real things named in an answer: collections, streams, snodes, segments, tasks."""
        name = msg.DESCRIPTOR.full_name
        if name == "querycoord.catalog.CollectionDescription" and msg.collection_id > 0:
            self.collections[msg.collection_id] = [p.partition_id for p in msg.partitions]
            self.channels[msg.collection_id] = list(msg.dm_channels)
            if msg.name and msg.name not in self.collection_names:
                self.collection_names.append(msg.name)
            return
        if name == "querycoord.catalog.CollectionSummary" and msg.collection_id > 0:
            self.collections.setdefault(msg.collection_id, [])
            return
        if name == "querycoord.stream.StreamDef" and msg.id > 0:
            self.streams[msg.id] = msg.name
        elif name == "querycoord.stream.SnodeInfo" and msg.id > 0 and msg.id not in self.snodes:
            self.snodes.append(msg.id)
        elif name == "querycoord.data.SegmentBinlogs" and msg.segment_id > 0:
            self.segments[msg.segment_id] = (msg.collection_id, msg.partition_id)
        elif name == "querycoord.query.TaskInfo" and msg.task_id > 0:
            self.tasks.append(msg.task_id)
        for f, value in msg.ListFields():
            if f.type == FieldDescriptor.TYPE_MESSAGE:
                if f.is_repeated:
                    for v in list(value)[:200]:
                        if isinstance(v, Message):
                            self.learn(v)
                else:
                    self.learn(value)
            elif f.name in ("task_id", "election_revision") and isinstance(value, int) and value > 0:
                (self.tasks if f.name == "task_id" else self.other_ids).append(value)


# ----- strategies from descriptors ------------------------------------------------------------------------------------
def _pick(items: Sequence[Any]) -> st.SearchStrategy[Any]:
    """One of ``items``, as hypothesis picks (it favours the first ones)."""
    return st.sampled_from(list(items))


def _uniform(items: Sequence[Any]) -> st.SearchStrategy[Any]:
    """One of ``items``, uniformly: a plain Random seeded by hypothesis (``sampled_from`` favours the first ones,
    which left some RPCs with a handful of cases in a thousand)."""
    pool = list(items)
    return st.randoms(use_true_random=True).map(lambda r: r.choice(pool))


class MessageStrategies:
    """Hypothesis strategies for any message type, derived from its descriptor, drawing real ids from ``world``."""

    def __init__(self, world: World, max_depth: int = 3):
        self.world = world
        self.max_depth = max_depth
        ids, names = world.ids(), world.names()
        real = _uniform(ids)
        self.ints = {
            FieldDescriptor.CPPTYPE_INT32: self._ints(INT32, real),
            FieldDescriptor.CPPTYPE_INT64: self._ints(INT64, real),
            FieldDescriptor.CPPTYPE_UINT32: self._ints(UINT32, real),
            FieldDescriptor.CPPTYPE_UINT64: self._ints(UINT64, real),
        }
        self.small_text = st.one_of(
            _uniform(_HOSTILE_TEXT), _uniform(names), _uniform(names),
            st.text(_ANY_CHAR, max_size=40), st.text(_CONTROL, min_size=1, max_size=8),
            st.builds(lambda a, b: f"{a}{b}", _pick(names), st.text(_ANY_CHAR, max_size=4)),
        )
        # Huge strings only at the top level of a request: nested in repeated fields they would multiply.
        self.text = st.one_of(self.small_text, st.builds(
            lambda c, n: c * n, st.sampled_from(["x", "é", "\U0001f600", "\x00"]), _pick(_HUGE_SIZES)))
        self.bytes_ = st.one_of(st.binary(max_size=64), st.just(b""), _pick([b"\x00" * 1000, b"\xff" * 70_000]))
        self._cache: dict[tuple[str, int], st.SearchStrategy[Message]] = {}

    @staticmethod
    def _ints(bounds: tuple[int, int], real: st.SearchStrategy[int]) -> st.SearchStrategy[int]:
        lo, hi = bounds
        edges = [v for v in _BOUNDARY_INTS if lo <= v <= hi]
        fitting = real.filter(lambda v: lo <= v <= hi)
        return st.one_of(_uniform(edges), st.integers(lo, hi), fitting, fitting,
                         fitting.map(lambda v: max(lo, min(hi, v + 1))), fitting.map(lambda v: max(lo, min(hi, -v))))

    def scalar(self, f: FieldDescriptor, depth: int = 0) -> st.SearchStrategy[Any]:
        cpp = f.cpp_type
        if cpp in self.ints:
            return self.ints[cpp]
        if cpp == FieldDescriptor.CPPTYPE_BOOL:
            # Without presence, False is "not set": the field is drawn as set or not already.
            return st.booleans() if f.has_presence or f.is_repeated else st.just(True)
        if cpp in (FieldDescriptor.CPPTYPE_DOUBLE, FieldDescriptor.CPPTYPE_FLOAT):
            if cpp == FieldDescriptor.CPPTYPE_FLOAT:
                return st.floats(width=32, allow_nan=True, allow_infinity=True)
            return st.floats(allow_nan=True, allow_infinity=True)
        if cpp == FieldDescriptor.CPPTYPE_ENUM:
            known = [v.number for v in f.enum_type.values]
            return st.one_of(_pick(known), _pick(known), st.integers(*INT32), _pick([-1, max(known) + 1, 2**31 - 1]))
        if f.type == FieldDescriptor.TYPE_BYTES:
            return self.bytes_
        return self.text if depth == 0 else self.small_text

    def value(self, f: FieldDescriptor, depth: int) -> st.SearchStrategy[Any]:
        if f.cpp_type == FieldDescriptor.CPPTYPE_MESSAGE:
            return self.message(f.message_type, depth + 1)
        return self.scalar(f, depth)

    def repeated(self, f: FieldDescriptor, depth: int) -> st.SearchStrategy[list[Any]]:
        """Few items anywhere; many (or many duplicates) only at the top level of a request, so sizes add up
        instead of multiplying."""
        item = self.value(f, depth)
        few = st.lists(item, max_size=6)
        if depth > 0:
            return few
        if f.cpp_type == FieldDescriptor.CPPTYPE_MESSAGE:
            many = st.builds(lambda v, n: [v] * n, self.message(f.message_type, self.max_depth), _pick([50, 300]))
        else:
            many = st.one_of(st.builds(lambda v, n: [v] * n, self.scalar(f, 1), _pick([2, 1000, 100_000])),
                             st.lists(self.scalar(f, 1), min_size=20, max_size=200))
        return st.one_of(few, few, many)

    def message(self, desc: Descriptor, depth: int = 0) -> st.SearchStrategy[Message]:
        key = (desc.full_name, min(depth, self.max_depth))
        if key not in self._cache:
            self._cache[key] = st.deferred(lambda: self._build(desc, depth))
        return self._cache[key]

    def _build(self, desc: Descriptor, depth: int) -> st.SearchStrategy[Message]:
        cls = message_factory.GetMessageClass(desc)
        if depth > self.max_depth:
            return st.just(cls())
        plain: list[FieldDescriptor] = []
        oneofs: list[list[FieldDescriptor]] = []
        for oneof in desc.oneofs:
            synthetic = len(oneof.fields) == 1 and oneof.name == f"_{oneof.fields[0].name}"
            if not synthetic:
                oneofs.append(list(oneof.fields))
        in_oneof = {f.name for group in oneofs for f in group}
        plain = [f for f in desc.fields if f.name not in in_oneof]
        values = {f.name: (self.repeated(f, depth) if f.is_repeated
                           else self.value(f, depth)) for f in desc.fields}

        @st.composite
        def build(draw: Callable[[st.SearchStrategy[Any]], Any]) -> Message:
            msg = cls()
            for f in plain:
                if draw(st.booleans()):
                    _set(msg, f, draw(values[f.name]))
            for group in oneofs:
                chosen = draw(st.none() | _pick(group))
                if chosen is not None:
                    _set(msg, chosen, draw(values[chosen.name]))
            return msg

        return build()


def _set(msg: Message, f: FieldDescriptor, value: Any) -> None:
    """Set field ``f`` of ``msg``; a value the runtime refuses (an out-of-range float to a float field) is dropped."""
    try:
        if f.is_repeated:
            if f.message_type is not None and f.message_type.GetOptions().map_entry:
                target = getattr(msg, f.name)
                for entry in value:
                    k, v = entry.key, entry.value
                    if isinstance(v, Message):
                        target[k].CopyFrom(v)
                    else:
                        target[k] = v
            else:
                getattr(msg, f.name).extend(value)
        elif f.cpp_type == FieldDescriptor.CPPTYPE_MESSAGE:
            getattr(msg, f.name).SetInParent()  # present even when empty: that is a case of its own
            getattr(msg, f.name).CopyFrom(value)
        else:
            setattr(msg, f.name, value)
    except (ValueError, TypeError, OverflowError):
        pass


# ----- cases ----------------------------------------------------------------------------------------------------------
@dataclass
class Case:
    """One request: which RPC, to which target (role and index), what kind of input, and its bytes."""

    rpc: Rpc
    kind: str  # hostile / valid / garbage:<how>
    payload: bytes
    target: str  # "leader" / "standby" / "node0" / "node1"...

    def repro(self, limit: int = 600) -> str:
        """The shortest useful description: text_format (long lists and strings cut) for a well-formed request,
        hex for garbage."""
        if not self.kind.startswith("garbage"):
            try:
                msg = self.rpc.request.FromString(self.payload)
                return f"{self.rpc.request.DESCRIPTOR.name} {{{_describe(msg, limit)}}}"
            except DecodeError:
                pass
        h = self.payload.hex()
        return f"hex {h[:limit]}{' ...' if len(h) > limit else ''} ({len(self.payload)} bytes)"


def _describe(msg: Message, limit: int = 2000) -> str:
    """text_format of ``msg`` with long repeated fields and strings cut (a 100,000-item list prints as 5)."""
    short = type(msg)()
    short.CopyFrom(msg)
    _shorten(short)
    text = text_format.MessageToString(short, as_one_line=True, as_utf8=True)
    return text if len(text) <= limit else text[:limit] + " ..."


def _shorten(msg: Message) -> None:
    for f, value in msg.ListFields():
        if f.is_repeated:
            if len(value) > 5:
                del value[5:]
            if f.cpp_type == FieldDescriptor.CPPTYPE_MESSAGE and not f.message_type.GetOptions().map_entry:
                for v in value:
                    _shorten(v)
        elif f.cpp_type == FieldDescriptor.CPPTYPE_MESSAGE:
            _shorten(value)
        elif isinstance(value, str | bytes) and len(value) > 80:
            setattr(msg, f.name, value[:80])


def _varint(n: int) -> bytes:
    out = bytearray()
    n &= (1 << 64) - 1
    while True:
        b = n & 0x7F
        n >>= 7
        out.append(b | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _tag(number: int, wire: int) -> bytes:
    return _varint((number << 3) | wire)


def _string_fields(desc: Descriptor) -> list[FieldDescriptor]:
    return [f for f in desc.fields if f.type == FieldDescriptor.TYPE_STRING]


class CaseStrategies:
    """Strategies for whole cases over ``rpcs`` and a ``world`` snapshot (see module docstring)."""

    def __init__(self, all_rpcs: Sequence[Rpc], world: World, *, targets: Mapping[str, Sequence[str]]):
        self.rpcs = list(all_rpcs)
        self.world = world
        self.targets = targets
        self.messages = MessageStrategies(world)
        self.weights = [1 if r.method in RARE_METHODS else 12 for r in self.rpcs]

    def target(self, rpc: Rpc) -> st.SearchStrategy[str]:
        return _uniform(self.targets[rpc.surface])

    def hostile(self, rpc: Rpc) -> st.SearchStrategy[Case]:
        return st.builds(lambda m, t: Case(rpc, "hostile", m.SerializeToString(), t),
                         self.messages.message(rpc.request.DESCRIPTOR), self.target(rpc))

    def valid(self, rpc: Rpc) -> st.SearchStrategy[Case]:
        # Valid requests are built by plain code from a seeded Random: hypothesis supplies the seed.
        return st.builds(self._valid_case, st.just(rpc), st.randoms(use_true_random=True), st.data())

    def _valid_case(self, rpc: Rpc, rng: random.Random, data: st.DataObject) -> Case:
        msg = valid_request(rpc, self.world, rng)
        target = data.draw(self.target(rpc))
        return Case(rpc, "valid", msg.SerializeToString(), target)

    def garbage(self, rpc: Rpc, how: str) -> st.SearchStrategy[Case]:
        return st.builds(self._garbage_case, st.just(rpc), st.just(how), st.randoms(use_true_random=True),
                         st.data())

    def _garbage_case(self, rpc: Rpc, how: str, rng: random.Random, data: st.DataObject) -> Case:
        target = data.draw(self.target(rpc))
        base = data.draw(self.messages.message(rpc.request.DESCRIPTOR)).SerializeToString()
        if how == "random":
            payload = rng.randbytes(rng.choice([1, 3, 17, 200, 4000]))
        elif how == "truncated":
            valid = valid_request(rpc, self.world, rng).SerializeToString()
            src = valid if len(valid) > 1 else base
            payload = src[: rng.randrange(len(src))] if len(src) > 1 else b"\x0a"
        elif how == "bitflip":
            src = bytearray(base or valid_request(rpc, self.world, rng).SerializeToString() or b"\x08\x01")
            for _ in range(rng.randint(1, 4)):
                i = rng.randrange(len(src))
                src[i] ^= 1 << rng.randrange(8)
            payload = bytes(src)
        elif how == "wrong_type":
            other = data.draw(_pick([r for r in self.rpcs if r.request is not rpc.request]))
            payload = data.draw(self.messages.message(other.request.DESCRIPTOR)).SerializeToString()
        elif how == "bad_utf8":
            fields = _string_fields(rpc.request.DESCRIPTOR)
            number = fields[0].number if fields else rng.randint(1, 15)
            junk = rng.choice([b"\xff\xfe", b"\xc0\xaf", b"\xed\xa0\x80", b"a\x80b"])
            payload = base + _tag(number, 2) + _varint(len(junk)) + junk
        elif how == "bad_wire":
            payload = base + rng.choice([
                _tag(1, 0) + b"\xff" * 11,  # a varint longer than 10 bytes
                _tag(2, 2) + _varint(2**31),  # a length beyond the message
                _tag(3, 3),  # a group start that never ends
                _tag(4, 4),  # a group end with no start
                _tag(5, 6) + b"\x00",  # wire type 6 does not exist
                b"\x00\x00",  # field number 0
                _tag(536870911, 0) + b"\x01",  # the largest field number, unknown
                _tag(1, 2) + _varint(3) + b"\xff\xff\xff",  # an int field sent as bytes
            ])
        elif how == "oversized":
            payload = b"\x0a" + _varint(DEFAULT_MAX_MESSAGE + 16) + b"\x00" * (DEFAULT_MAX_MESSAGE + 16)
        else:  # "empty"
            payload = b""
        return Case(rpc, f"garbage:{how}", payload, target)

    def case(self, rpc: Rpc, kind: str) -> st.SearchStrategy[Case]:
        """Cases of one RPC and kind (hostile, valid or garbage:<how>)."""
        if kind.startswith("garbage:"):
            return self.garbage(rpc, kind.split(":", 1)[1])
        return {"hostile": self.hostile, "valid": self.valid}[kind](rpc)


# Hostile messages, valid requests about real things, garbage bytes of each kind (the oversized one is rare: it
# is 4 MiB on the wire and only ever answers RESOURCE_EXHAUSTED).
GARBAGE_KINDS = ("random", "truncated", "bitflip", "wrong_type", "bad_utf8", "bad_wire", "empty", "oversized")
CASE_KINDS = ("hostile", "valid", *(f"garbage:{k}" for k in GARBAGE_KINDS))
CASE_WEIGHTS = (50, 30, 3, 3, 3, 3, 3, 3, 1.8, 0.2)


# ----- valid requests -------------------------------------------------------------------------------------------------
def valid_request(rpc: Rpc, w: World, rng: random.Random) -> Message:
    """A well-formed request about real things (a destructive one too: loads, releases, drops), so the fuzzer
    reaches the code behind the validation; RPCs without a recipe get an empty request."""
    cls = rpc.request
    cids = list(w.collections) or [1]
    cid = rng.choice(cids)
    parts = w.collections.get(cid) or [1]
    qnode = rng.choice(w.query_nodes or [1])
    sref = stream_pb2.StreamRef(stream_id=rng.choice(list(w.streams) or [1])) if rng.random() < 0.5 else \
        stream_pb2.StreamRef(name=rng.choice(list(w.streams.values()) or ["s"]))
    n = rng.randrange(1_000_000)
    recipes: dict[str, Callable[[], Message]] = {
        "querycoord.catalog.Catalog.CreateCollection": lambda: catalog_pb2.CreateCollectionRequest(
            collection_name=f"fz_{n}", num_partitions=rng.randint(0, 3), num_dm_channels=rng.randint(0, 2),
            schema=catalog_pb2.CollectionSchema(name=f"fz_{n}", fields=[
                catalog_pb2.FieldSchema(name="pk", data_type=catalog_pb2.DATA_TYPE_INT64, is_primary_key=True),
                catalog_pb2.FieldSchema(name="v", data_type=catalog_pb2.DATA_TYPE_FLOAT_VECTOR, dim=8)])),
        "querycoord.catalog.Catalog.DropCollection": lambda: catalog_pb2.DropCollectionRequest(collection_id=cid),
        "querycoord.catalog.Catalog.DescribeCollection": lambda: catalog_pb2.DescribeCollectionRequest(
            collection_id=cid),
        "querycoord.catalog.Catalog.ShowPartitions": lambda: catalog_pb2.ShowPartitionsRequest(collection_id=cid),
        "querycoord.catalog.Catalog.AddSegments": lambda: catalog_pb2.AddSegmentsRequest(
            collection_id=cid, segments=[_segment(cid, rng.choice(parts), w, rng) for _ in range(rng.randint(1, 3))]),
        "querycoord.catalog.Catalog.GetRecoveryInfo": lambda: catalog_pb2.GetRecoveryInfoRequest(
            collection_id=cid, partition_id=rng.choice(parts), page_size=rng.choice([0, 1, 10])),
        "querycoord.query.QueryCoord.LoadCollection": lambda: querycoord_pb2.LoadCollectionRequest(collection_id=cid),
        "querycoord.query.QueryCoord.ReleaseCollection": lambda: querycoord_pb2.ReleaseCollectionRequest(
            collection_id=cid),
        "querycoord.query.QueryCoord.UpdateLoadConfig": lambda: querycoord_pb2.UpdateLoadConfigRequest(
            collection_ids=[cid], replica_number=rng.randint(1, 3)),
        "querycoord.query.QueryCoord.LoadPartitions": lambda: querycoord_pb2.LoadPartitionsRequest(
            collection_id=cid, partition_ids=rng.sample(parts, rng.randint(1, len(parts)))),
        "querycoord.query.QueryCoord.ReleasePartitions": lambda: querycoord_pb2.ReleasePartitionsRequest(
            collection_id=cid, partition_ids=rng.sample(parts, rng.randint(1, len(parts)))),
        "querycoord.query.QueryCoord.ShowCollections": lambda: querycoord_pb2.ShowCollectionsRequest(
            collection_ids=[cid] if rng.random() < 0.5 else []),
        "querycoord.query.QueryCoord.ShowPartitions": lambda: querycoord_pb2.ShowPartitionsRequest(collection_id=cid),
        "querycoord.query.QueryCoord.GetPartitionStates": lambda: querycoord_pb2.GetPartitionStatesRequest(
            collection_id=cid, partition_ids=parts),
        "querycoord.query.QueryCoord.GetSegmentInfo": lambda: querycoord_pb2.GetSegmentInfoRequest(
            collection_id=cid),
        "querycoord.query.QueryCoord.GetReplicas": lambda: querycoord_pb2.GetReplicasRequest(collection_id=cid),
        "querycoord.query.QueryCoord.LoadBalance": lambda: querycoord_pb2.LoadBalanceRequest(
            source_node_ids=[qnode], collection_id=cid if rng.random() < 0.5 else 0),
        "querycoord.query.QueryCoord.ListTasks": lambda: querycoord_pb2.ListTasksRequest(
            include_children=True, include_finished=rng.random() < 0.5),
        "querycoord.query.QueryCoord.GetTask": lambda: querycoord_pb2.GetTaskRequest(
            task_id=rng.choice(w.tasks or [1])),
        "querycoord.query.QueryCoord.Switchover": lambda: querycoord_pb2.SwitchoverRequest(
            target=rng.choice(["", *w.coordinators])),
        "querycoord.query.QueryCoord.StepBack": lambda: querycoord_pb2.StepBackRequest(requested_by="fuzz"),
        # Any kind may be turned on; only the auto balancer off: a repairing kind left off by a run would leave the
        # checks after it a lost copy nobody repairs (deactivating one is tested on its own, with a warning).
        "querycoord.query.QueryCoord.ActivateChecker": lambda: querycoord_pb2.CheckerRequest(
            name=rng.choice(["segments", "channels", "releases", "replicas", "balance", "nosuch"])),
        "querycoord.query.QueryCoord.DeactivateChecker": lambda: querycoord_pb2.CheckerRequest(
            name=rng.choice(["balance", "nosuch"])),
        "querycoord.stream.StreamMgmt.CreateStream": lambda: stream_pb2.CreateStreamRequest(
            name=f"fz_{n}", source_db="db", source_vgroup_ids=rng.sample(w.vgroups, 1) if w.vgroups else [1],
            num_calc_scan_plans=rng.randint(0, 1), num_calc_subplans=rng.randint(1, 2),
            runner_deploys=rng.randint(1, 2), if_not_exists=rng.random() < 0.3),
        "querycoord.stream.StreamMgmt.DropStream": lambda: stream_pb2.DropStreamRequest(stream=sref),
        "querycoord.stream.StreamMgmt.StopStream": lambda: stream_pb2.StopStreamRequest(stream=sref),
        "querycoord.stream.StreamMgmt.StartStream": lambda: stream_pb2.StartStreamRequest(stream=sref),
        "querycoord.stream.StreamMgmt.ShowStreams": lambda: stream_pb2.ShowStreamsRequest(with_tasks=True),
        "querycoord.stream.StreamMgmt.CreateSnode": lambda: stream_pb2.CreateSnodeRequest(
            node_id=rng.choice(w.stream_nodes or [1])),
        "querycoord.stream.StreamMgmt.DropSnode": lambda: stream_pb2.DropSnodeRequest(
            snode_id=rng.choice(w.snodes or [1])),
        "querycoord.stream.StreamMgmt.StreamHeartbeat": lambda: stream_pb2.HeartbeatRequest(
            node_id=rng.choice(w.stream_nodes or [1]), vgroup_ids=rng.sample(w.vgroups, min(len(w.vgroups), 1)),
            stream_group=0, num_stream_groups=2),
        "querycoord.node.QueryNode.LoadSegments": lambda: querynode_pb2.LoadSegmentsRequest(
            node_id=qnode, collection_id=cid, fence=_fence(w, rng),
            infos=[_load_info(s, w) for s in rng.sample(list(w.segments), min(2, len(w.segments)))]),
        "querycoord.node.QueryNode.ReleaseSegments": lambda: querynode_pb2.ReleaseSegmentsRequest(
            node_id=qnode, collection_id=cid, fence=_fence(w, rng), segment_ids=list(w.segments)[:3]),
        "querycoord.node.QueryNode.ReleaseCollection": lambda: querynode_pb2.ReleaseCollectionRequest(
            node_id=qnode, collection_id=cid, fence=_fence(w, rng)),
        "querycoord.node.QueryNode.GetSegmentInfo": lambda: querynode_pb2.GetSegmentInfoRequest(node_id=qnode),
        "querycoord.node.QueryNode.GetDataDistribution": lambda: querynode_pb2.GetDataDistributionRequest(
            node_id=qnode),
        "grpc.health.v1.Health.Check": lambda: health_pb2.HealthCheckRequest(
            service=rng.choice(["", "querycoord.query.QueryCoord", "nope"])),
    }
    recipe = recipes.get(f"{rpc.service}.{rpc.method}")
    return recipe() if recipe is not None else cls()


def _fence(w: World, rng: random.Random) -> querynode_pb2.CoordFence:
    """No fence or an old one: a node must refuse it (forging the leader's own fence is a question of who may
    call a node, not of input; hostile fences come from the generic strategies)."""
    rev = rng.choice([0, 1, max(0, w.fence_revision - 1)])
    return querynode_pb2.CoordFence(leader_revision=rev)


def _segment(cid: int, pid: int, w: World, rng: random.Random) -> data_pb2.SegmentBinlogs:
    sources = rng.sample([s for s, (c, _) in w.segments.items() if c == cid], 1) if rng.random() < 0.2 and any(
        c == cid for c, _ in w.segments.values()) else []
    return data_pb2.SegmentBinlogs(partition_id=pid, num_rows=rng.randint(1, 1000), mem_size=rng.randint(1, 1 << 20),
                                   binlog_paths=[f"fz/{cid}/{pid}/{rng.randrange(10**6)}"], compaction_from=sources)


def _load_info(segment_id: int, w: World) -> data_pb2.SegmentLoadInfo:
    cid, pid = w.segments[segment_id]
    return data_pb2.SegmentLoadInfo(segment_id=segment_id, collection_id=cid, partition_id=pid, num_rows=10,
                                    mem_size=1024)


def generate(strategies: CaseStrategies, n: int, run_seed: int) -> list[Case]:
    """``n`` cases with seed ``run_seed``: the RPCs picked by a seeded Random (weighted: Switchover and StepBack
    rarely), each RPC's cases drawn by hypothesis (generation only: nothing is shrunk or replayed, the failing
    requests are kept as bytes instead). The RPC is picked outside hypothesis because hypothesis favours the
    first items of a choice: some RPCs got a handful of cases in a thousand."""
    rng = random.Random(run_seed)
    rpcs_ = {r.path: r for r in strategies.rpcs}
    picks = list(zip((r.path for r in rng.choices(strategies.rpcs, weights=strategies.weights, k=n)),
                     rng.choices(CASE_KINDS, weights=CASE_WEIGHTS, k=n), strict=True))
    drawn = {key: _draw(strategies.case(rpcs_[key[0]], key[1]), k, rng.getrandbits(64))
             for key, k in sorted(Counter(picks).items())}
    order = [drawn[key].pop() if drawn[key] else None for key in picks]
    return [c for c in order if c is not None]


def _draw(strategy: st.SearchStrategy[Case], n: int, run_seed: int) -> list[Case]:
    out: list[Case] = []

    @seed(run_seed)
    @settings(max_examples=n, database=None, phases=[Phase.generate], deadline=None, derandomize=False,
              suppress_health_check=list(HealthCheck), report_multiple_bugs=False)
    @given(strategy)
    def collect(case: Case) -> None:
        out.append(case)

    collect()
    while out and len(out) < n:  # hypothesis stops early when it runs out of new inputs (an empty request)
        out += out[: n - len(out)]
    return out[:n]


# ----- answers ----------------------------------------------------------------------------------------------------
@dataclass
class Outcome:
    """How one request was answered: ``kind`` is status / code / crash / unanswered; ``detail`` the status or
    code name; ``reason`` the status reason or gRPC details."""

    kind: str
    detail: str
    reason: str = ""


_TRANSPORT_HINTS = ("failed to connect", "connection refused", "socket closed", "connection reset",
                    "broken pipe", "goaway", "stream removed", "recvmessage", "no connection")


def classify(rpc: Rpc, response: bytes | None, error: grpc.aio.AioRpcError | None) -> Outcome:
    """The outcome of one call (see module docstring)."""
    if error is not None:
        code, details = error.code(), error.details() or ""
        if code == grpc.StatusCode.DEADLINE_EXCEEDED:
            return Outcome("unanswered", code.name, details)
        if code == grpc.StatusCode.UNAVAILABLE:
            low = details.lower()
            if parse_leader(details) is not None or "leader" in low or "standby" in low:
                return Outcome("code", code.name, details)
            return Outcome("unanswered", code.name, details)
        if code in PROPER_CODES:
            return Outcome("code", code.name, details)
        if code in CRASH_CODES:
            return Outcome("crash", code.name, details)
        return Outcome("crash", code.name, details)  # CANCELLED, UNIMPLEMENTED, DATA_LOSS...: not an answer
    assert response is not None
    try:
        msg = rpc.response.FromString(response)
    except DecodeError as exc:
        return Outcome("crash", "UNDECODABLE_RESPONSE", str(exc))
    status = _status_of(msg)
    if status is None:
        return Outcome("crash", "NO_STATUS", _describe(msg)[:200])
    name, reason = status
    if name == "UNEXPECTED_ERROR":
        return Outcome("crash", "status UNEXPECTED_ERROR", reason)
    return Outcome("status", name, reason)


def _status_of(msg: Message) -> tuple[str, str] | None:
    """(code name, reason) of a response's status; health answers carry a serving status instead."""
    if isinstance(msg, health_pb2.HealthCheckResponse):
        return health_pb2.HealthCheckResponse.ServingStatus.Name(msg.status), ""
    if isinstance(msg, health_pb2.HealthListResponse):
        return "SERVING_LIST", ""
    if "status" in msg.DESCRIPTOR.fields_by_name:
        st_ = getattr(msg, "status")  # noqa: B009  (any response type)
        if isinstance(st_, common_pb2.Status):
            try:
                return common_pb2.ErrorCode.Name(st_.error_code), st_.reason
            except ValueError:
                return f"ERROR_CODE_{st_.error_code}", st_.reason
    return None


# ----- sending --------------------------------------------------------------------------------------------------------
@dataclass
class Record:
    case: Case
    outcome: Outcome
    elapsed: float


_DIGITS = re.compile(r"\d+")


@dataclass
class Findings:
    """Distinct failures (crash or unanswered), keyed by RPC, outcome and the reason with numbers blanked; each
    keeps the shortest request that showed it and how often it was seen."""

    seen: dict[tuple[str, str, str], tuple[Record, int]] = field(default_factory=dict)

    def add(self, rec: Record) -> None:
        o = rec.outcome
        key = (rec.case.rpc.label, f"{o.kind} {o.detail}", _DIGITS.sub("N", o.reason.splitlines()[0] if o.reason
                                                                         else "")[:160])
        old = self.seen.get(key)
        if old is None:
            self.seen[key] = (rec, 1)
        else:
            best = rec if len(rec.case.payload) < len(old[0].case.payload) else old[0]
            self.seen[key] = (best, old[1] + 1)

    def render(self) -> list[str]:
        out = []
        for (label, what, _), (rec, count) in sorted(self.seen.items()):
            out.append(f"- {label}: {what} x{count} ({rec.case.kind} to {rec.case.target}): "
                       f"{rec.outcome.reason[:300]!r}\n  request: {rec.case.repro(400)}")
        return out


@dataclass
class Stats:
    """Counts per RPC and outcome, and the records of every failure."""

    per_rpc: dict[str, Counter[str]] = field(default_factory=lambda: defaultdict(Counter))
    kinds: Counter[str] = field(default_factory=Counter)
    requests: int = 0
    findings: Findings = field(default_factory=Findings)

    def add(self, rec: Record) -> None:
        self.requests += 1
        o = rec.outcome
        self.kinds[o.kind] += 1
        c = self.per_rpc[rec.case.rpc.label]
        c["requests"] += 1
        c[o.kind] += 1
        c[f"{o.kind}:{o.detail}"] += 1
        if o.kind in ("crash", "unanswered"):
            self.findings.add(rec)

    @property
    def crashes(self) -> int:
        return self.kinds["crash"]

    @property
    def unanswered(self) -> int:
        return self.kinds["unanswered"]

    def table(self) -> str:
        """Per RPC: requests, answered by status, answered by gRPC code, crashes, unanswered, the codes seen."""
        rows = [f"{'rpc':<36} {'requests':>8} {'status':>7} {'code':>6} {'crash':>6} {'unans':>6}  codes"]
        for label in sorted(self.per_rpc):
            c = self.per_rpc[label]
            codes = ", ".join(f"{k.split(':', 1)[1]}={v}" for k, v in sorted(c.items())
                              if k.startswith(("code:", "crash:", "unanswered:")))
            rows.append(f"{label:<36} {c['requests']:>8} {c['status']:>7} {c['code']:>6} {c['crash']:>6} "
                        f"{c['unanswered']:>6}  {codes}")
        rows.append(f"{'total':<36} {self.requests:>8} {self.kinds['status']:>7} {self.kinds['code']:>6} "
                    f"{self.crashes:>6} {self.unanswered:>6}")
        return "\n".join(rows)


class Fuzzer:
    """Sends cases from ``clients`` concurrent clients to the addresses ``resolve(target)`` names.

    ``resolve`` is asked per call, so "leader" follows a switchover. Each client has its own channels; every
    call has ``deadline`` seconds. Answers feed ``world`` (new ids for later batches) and ``stats``.
    """

    def __init__(self, resolve: Callable[[str], str], world: World, *, clients: int = 6, deadline: float = 20.0,
                 on_record: Callable[[Record], None] | None = None):
        self.resolve = resolve
        self.world = world
        self.clients = clients
        self.deadline = deadline
        self.stats = Stats()
        self.on_record = on_record

    async def run(self, produce: Callable[[World, int], list[Case]], total: int, batch: int = 100) -> Stats:
        """Generate ``total`` cases in batches (``produce(world snapshot, batch index)`` in a thread) while the
        clients send the previous ones."""
        queue: asyncio.Queue[Case | None] = asyncio.Queue(maxsize=2 * batch)

        async def producer() -> None:
            made = 0
            index = 0
            while made < total:
                cases = await asyncio.to_thread(produce, self.world.snapshot(), index)
                index += 1
                for c in cases[: total - made]:
                    await queue.put(c)
                made += min(len(cases), total - made)
                if not cases:
                    break
            for _ in range(self.clients):
                await queue.put(None)

        tasks = [asyncio.create_task(self._client(queue), name=f"fuzz-client-{i}") for i in range(self.clients)]
        try:
            await producer()
            await asyncio.gather(*tasks)
        finally:
            for t in tasks:
                t.cancel()
        return self.stats

    async def _client(self, queue: asyncio.Queue[Case | None]) -> None:
        channels: dict[str, grpc.aio.Channel] = {}
        options = [("grpc.max_send_message_length", 2 * DEFAULT_MAX_MESSAGE),
                   ("grpc.max_receive_message_length", 64 * 1024 * 1024)]
        try:
            while (case := await queue.get()) is not None:
                address = self.resolve(case.target)
                if address not in channels:
                    channels[address] = grpc.aio.insecure_channel(address, options=options)
                rec = await self.send(channels[address], case)
                self.stats.add(rec)
                if self.on_record is not None:
                    self.on_record(rec)
        finally:
            await asyncio.gather(*(ch.close() for ch in channels.values()), return_exceptions=True)

    async def send(self, channel: grpc.aio.Channel, case: Case) -> Record:
        call = channel.unary_unary(case.rpc.path, request_serializer=None, response_deserializer=None)
        t = time.monotonic()
        response: bytes | None = None
        error: grpc.aio.AioRpcError | None = None
        try:
            response = await call(case.payload, timeout=self.deadline)
        except grpc.aio.AioRpcError as exc:
            error = exc
        outcome = classify(case.rpc, response, error)
        if response is not None and outcome.kind == "status":
            try:
                self.world.learn(case.rpc.response.FromString(response))
            except DecodeError:
                pass
        return Record(case, outcome, time.monotonic() - t)


def tracebacks(texts: Iterable[tuple[str, str]]) -> list[tuple[str, str]]:
    """(log name, excerpt) of every Python traceback in ``texts`` ((name, log text) pairs): the header, the last
    frames and the exception line."""
    out = []
    for name, text in texts:
        lines = text.splitlines()
        for i, line in enumerate(lines):
            if "Traceback (most recent call last)" not in line:
                continue
            j = i + 1
            while j < len(lines) and (lines[j].startswith((" ", "\t", "│", "|", "└", "├", ">")) or
                                      lines[j].strip() == "" or lines[j].startswith("During handling")):
                j += 1
            end = min(j + 1, len(lines))
            block = lines[max(0, i - 1):end]
            excerpt = "\n".join([*block[:2], "  ...", *block[-7:]]) if len(block) > 12 else "\n".join(block)
            out.append((name, excerpt))
    return out


__all__ = ["CASE_KINDS", "COORDINATOR", "GARBAGE_KINDS", "QUERY_NODE", "Case", "CaseStrategies", "Findings", "Fuzzer",
           "MessageStrategies", "Outcome", "Record", "Rpc", "Stats", "World", "classify", "generate", "rpcs",
           "tracebacks", "valid_request"]
