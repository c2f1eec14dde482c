"""Streams against the snodes they name, and the stream name index.

Every stream's main snode exists (``StreamStore.drop_snode`` moves a
snode's streams to its replica in the txn that removes it), every name key
names a stream, and every checkpoint or recalculation record belongs to a
stream (a drop removes them; a drop racing a leader's commit can leave one).
A stream left on a dropped snode is moved, as the drop would have, to an
existing snode; with none left it cannot be repaired here.
"""

from __future__ import annotations

from google.protobuf.message import DecodeError

from meta.txn import absent, modified_at, put
from proto import stream_pb2
from querycoord.stream.checkpoint_store import CHECKPOINTS_PREFIX
from querycoord.stream.recalc_store import RECALCS_PREFIX
from querycoord.stream.store import NAMES_PREFIX, SNODES_PREFIX, STREAMS_PREFIX, snode_key, stream_key

from .problems import Fix, Found, Problem, delete_fix
from .snapshot import Snapshot


def decode_streams(snap: Snapshot, found: Found | None = None) -> tuple[
        dict[int, stream_pb2.StreamDef], dict[int, stream_pb2.SnodeInfo]]:
    """(streams by id, snodes by id); records that do not decode for their key are reported (with ``found``)."""
    streams: dict[int, stream_pb2.StreamDef] = {}
    snodes: dict[int, stream_pb2.SnodeInfo] = {}
    for prefix, cls, out, key_of in ((STREAMS_PREFIX, stream_pb2.StreamDef, streams, stream_key),
                                     (SNODES_PREFIX, stream_pb2.SnodeInfo, snodes, snode_key)):
        for item in snap.under(prefix):
            try:
                rec = cls.FromString(item.value)
            except DecodeError:
                rec = None
            if rec is None or rec.id <= 0 or key_of(rec.id) != item.key:
                if found is not None:
                    found.add(Problem("corrupt-stream-record", (item.key,), f"not a {cls.__name__} for its key"))
                continue
            out[rec.id] = rec
    return streams, snodes


def check_streams(snap: Snapshot, found: Found) -> None:
    streams, snodes = decode_streams(snap, found)
    usable = sorted(sid for sid, s in snodes.items() if not s.dropping)
    for sid, sdef in sorted(streams.items()):
        if sdef.main_snode_id in snodes:
            continue
        kv = snap.get(stream_key(sid))
        assert kv is not None
        fix = None
        if usable:
            target = snodes[usable[0]]
            moved = stream_pb2.StreamDef()
            moved.CopyFrom(sdef)
            moved.main_snode_id = target.id
            target_kv = snap.get(snode_key(target.id))
            assert target_kv is not None
            compares = [modified_at(kv.key, kv.mod_revision), modified_at(target_kv.key, target_kv.mod_revision)]
            if sdef.main_snode_id > 0:
                compares.append(absent(snode_key(sdef.main_snode_id)))
            fix = Fix(f"move stream {sdef.name} to snode {target.id}", (put(kv.key, moved.SerializeToString()),),
                      tuple(compares))
        found.add(Problem("stream-on-dropped-snode", (kv.key,),
                          f"stream {sdef.name} (id {sid}) runs on snode {sdef.main_snode_id}, which does not exist"
                          + ("" if usable else "; no snode exists to move it to: create one, then repair again"),
                          fix))
    for item in snap.under(NAMES_PREFIX):
        raw = item.value.decode(errors="replace")
        if not raw.isdigit() or int(raw) not in streams:
            found.add(Problem("stream-name-without-stream", (item.key,),
                              f"name {item.key[len(NAMES_PREFIX):]!r} names stream {raw[:20]!r}, which does not exist",
                              delete_fix("delete the name key", [item])))
    _check_stream_records(snap, found, streams)


def _check_stream_records(snap: Snapshot, found: Found, streams: dict[int, stream_pb2.StreamDef]) -> None:
    """Checkpoint (``stream/checkpoints/<stream>``) and recalculation (``stream/recalcs/<stream>/<id>``) records
    of a stream that does not exist."""
    for prefix, what in ((CHECKPOINTS_PREFIX, "checkpoint"), (RECALCS_PREFIX, "recalculation")):
        for item in snap.under(prefix):
            owner = item.key[len(prefix):].split("/", 1)[0]
            if owner.isdigit() and int(owner) in streams:
                continue
            found.add(Problem("stream-record-without-stream", (item.key,),
                              f"{what} record of stream {owner[:20]!r}, which does not exist",
                              delete_fix(f"delete the {what} record", [item])))


__all__ = ["check_streams", "decode_streams"]
