"""Catalog segment records read in bulk: many records parsed in one protobuf call, and listed per DM channel."""

from __future__ import annotations

from operator import attrgetter

from google.protobuf.message import DecodeError

from proto import catalog_pb2, data_pb2


def parse_binlogs(values: list[bytes]) -> list[data_pb2.SegmentBinlogs]:
    """Parse catalog segment records, all in one call to the protobuf library.

    Why: a message made and parsed per record cost twice the parse itself (a recovery read of a whole
    collection parses every segment). The records are framed as the ``binlogs`` field of one
    ``GetRecoveryInfoResponse`` (tag and length in front of each) and parsed at once: the messages are the ones
    parsing each record gives (a length-delimited field is parsed as a message of its own). A record that does not
    parse is parsed again alone, so the error is the one it always was (``parse_each``).
    """
    if len(values) < 2:
        return parse_each(values)
    out: list[data_pb2.SegmentBinlogs] = []
    for start in range(0, len(values), PARSE_CHUNK):
        out += _parse_framed(values[start:start + PARSE_CHUNK])
    return out


def _parse_framed(values: list[bytes]) -> list[data_pb2.SegmentBinlogs]:
    """``parse_binlogs`` of up to ``PARSE_CHUNK`` records, framed and parsed as one message."""
    framed: list[bytes] = [b""] * (2 * len(values))
    framed[::2] = map(_FRAME_HEADS.__getitem__, map(len, values))  # head before each record, all in C
    framed[1::2] = values
    response = catalog_pb2.GetRecoveryInfoResponse()
    try:
        response.ParseFromString(b"".join(framed))
    except DecodeError:
        return parse_each(values)
    return list(response.binlogs)


def parse_each(values: list[bytes]) -> list[data_pb2.SegmentBinlogs]:
    """``parse_binlogs`` one message per record."""
    out = []
    for value in values:
        seg = data_pb2.SegmentBinlogs()
        seg.ParseFromString(value)
        out.append(seg)
    return out


# Records parsed as one message: the framed copy stays small, and far from protobuf's 2 GiB message limit.
PARSE_CHUNK = 8192
# Field 3 (``binlogs``) of GetRecoveryInfoResponse, length-delimited: the tag byte of each framed record.
_BINLOGS_TAG = bytes([(catalog_pb2.GetRecoveryInfoResponse.BINLOGS_FIELD_NUMBER << 3) | 2])


class _FrameHeads(dict[int, bytes]):
    """Tag and base-128 varint length in front of a framed record, by record length; each made on first use
    (the records of a catalog have few distinct lengths), and forgotten past 65,536 of them."""

    def __missing__(self, length: int) -> bytes:
        out = bytearray(_BINLOGS_TAG)
        n = length
        while n >= 0x80:
            out.append((n & 0x7F) | 0x80)
            n >>= 7
        out.append(n)
        head = bytes(out)
        if len(self) >= 65536:
            self.clear()
        self[length] = head
        return head


# The heads ``_parse_framed`` puts in front of records, by record length.
_FRAME_HEADS = _FrameHeads()


def add_flushed(channels: list[data_pb2.VChannelInfo], binlogs: list[data_pb2.SegmentBinlogs]) -> None:
    """List each segment of ``binlogs`` in its insert channel's ``flushed_segment_ids`` (in order; a channel
    that is not one of ``channels`` is skipped): collected per channel, then added with one call each."""
    by_name = {c.channel_name: c for c in channels}
    ids: dict[str, list[int]] = {name: [] for name in by_name}
    for segment_id, name in zip(map(_SEGMENT_ID, binlogs), map(_INSERT_CHANNEL, binlogs), strict=True):
        found = ids.get(name)
        if found is not None:
            found.append(segment_id)
    for name, ch in by_name.items():
        ch.flushed_segment_ids.extend(ids[name])


_SEGMENT_ID = attrgetter("segment_id")
_INSERT_CHANNEL = attrgetter("insert_channel")
