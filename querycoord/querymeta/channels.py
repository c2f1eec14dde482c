"""Channels of a loaded collection: DM channel watches (which node of each replica watches a DM channel), delta
channels, and the query channels derived from the collection id.

A ``DmChannelWatchInfo`` lists every copy of a watch (replica, node) like a segment record does, and is saved
like one: beside a load's segment saves (its record claimed, rule 2 of ``core``), possibly in several txns
(rule 5). Milvus kept watches only in memory and lost them on restart; here they are persisted. Delta channels
are replaced as a set in one txn, stored stripped (rule 6: ``records.stored_delta_channel``).
"""

from __future__ import annotations

from collections.abc import Iterable

from . import keys
from .copies import copies, copy_message, view_of, with_copy, without_node
from .core import MetaCore, check_id
from .errors import CollectionNotLoaded
from .records import DmChannelWatchInfo, VChannelInfo, stored_delta_channel
from .replicas import with_replica


class Channels:
    """Reads and writes of the DM channel watches and the delta channels."""

    def __init__(self, core: MetaCore):
        self._core = core

    # ===== DM channels: reads ==========================================================
    def dm_channels_of(self, collection_id: int) -> list[DmChannelWatchInfo]:
        """DM channel watches of a collection, by channel name."""
        channels = self._core.index.dm_channels.get(collection_id, {})
        return [copy_message(channels[c]) for c in sorted(channels)]

    def get_dm_channel(self, collection_id: int, channel: str) -> DmChannelWatchInfo | None:
        watch = self._core.index.dm_channels.get(collection_id, {}).get(channel)
        return copy_message(watch) if watch is not None else None

    def dm_channel_copies(self, collection_id: int) -> dict[str, dict[int, int]]:
        """Each recorded DM channel of the collection: replica id -> watching node."""
        return {name: copies(w) for name, w in self._core.index.dm_channels.get(collection_id, {}).items()}

    def channels_on_node(self, node_id: int) -> list[DmChannelWatchInfo]:
        """DM channel watches recorded on the node, by (collection, channel): views of one watch each."""
        index = self._core.index
        out = []
        for c, ch in sorted(index.dm_channels_by_node.get(node_id, ())):
            watch = index.dm_channels[c][ch]
            replica = next((r for r, n in copies(watch).items() if n == node_id), 0)
            out.append(view_of(watch, replica))
        return out

    def channel_count_by_node(self) -> dict[int, int]:
        """Number of DM channel watches per node (the "fewest channels" allocation reads it)."""
        return {n: len(c) for n, c in self._core.index.dm_channels_by_node.items()}

    # ===== DM channels: writes =========================================================
    async def save_dm_channel_watch(self, watches: Iterable[DmChannelWatchInfo]) -> int:
        """Insert or replace DM channel watches (by collection and channel); return the txns used.

        The collection, and any partition ids listed, must be loaded. Packed
        like segments (node facts, rule 5), in practice one txn.
        """
        to_save = [copy_message(w) for w in watches]
        seen: set[tuple[int, str]] = set()
        for w in to_save:
            check_id("collection", w.collection_id)
            if not w.dm_channel:
                raise ValueError(f"a DM channel watch of collection {w.collection_id} has no channel name")
            if (w.collection_id, w.dm_channel) in seen:
                raise ValueError(f"DM channel {w.dm_channel} of collection {w.collection_id} appears twice")
            seen.add((w.collection_id, w.dm_channel))
        core = self._core

        async def body() -> int:
            index = core.index
            for w in to_save:
                if w.collection_id not in index.collections:
                    raise CollectionNotLoaded(w.collection_id)
                for pid in w.partition_ids:
                    core.require_partition(w.collection_id, pid)
            merged = [with_copy(index.dm_channels.get(w.collection_id, {}).get(w.dm_channel),
                                with_replica(index, w)) for w in to_save]
            return await core.commit("save_dm_channel_watch", [core.put_dm_channel(w) for w in merged], atomic=False)

        # Shared, each watch's record claimed: saved beside a load's segment saves, not after them (``locks``).
        return await core.guarded(lambda: {w.collection_id for w in to_save}, body, claims=seen)

    async def remove_dm_channels(self, collection_id: int, channels: Iterable[str]) -> int:
        """Remove DM channel watches of a collection by name (unknown names ignored); return the txns used."""
        names = list(dict.fromkeys(channels))
        core = self._core

        async def body() -> int:
            known = core.index.dm_channels.get(collection_id, {})
            mutations = [core.drop_dm_channel(known[n]) for n in names if n in known]
            return await core.commit("remove_dm_channels", mutations, atomic=False)

        return await core.guarded(lambda: [collection_id], body)

    async def remove_dm_channel_copies(self, node_id: int, collection_id: int, channels: Iterable[str]) -> int:
        """Remove the node's copy from the collection's named DM channel watches (a watch left with no copy goes;
        unknown names and watches without a copy there are ignored); return the txns used."""
        names = list(dict.fromkeys(channels))
        core = self._core

        async def body() -> int:
            known = core.index.dm_channels.get(collection_id, {})
            mutations = []
            for name in names:
                watch = known.get(name)
                if watch is None or node_id not in copies(watch).values():
                    continue
                left = without_node(watch, node_id)
                mutations.append(core.put_dm_channel(left) if left is not None else core.drop_dm_channel(watch))
            return await core.commit("remove_dm_channel_copies", mutations, atomic=False)

        return await core.guarded(lambda: [collection_id], body)

    # ===== delta and query channels ====================================================
    def get_delta_channels(self, collection_id: int) -> list[VChannelInfo]:
        """Delta channels of a collection, by name (as stored: stripped)."""
        channels = self._core.index.delta_channels.get(collection_id, {})
        return [copy_message(channels[c]) for c in sorted(channels)]

    async def set_delta_channels(self, collection_id: int, infos: Iterable[VChannelInfo]) -> None:
        """Replace the collection's delta channels with ``infos`` in one txn (stale ones removed).

        Stale channels are deleted key by key, not by a range delete: etcd
        refuses a txn that puts a key inside a range it also deletes.
        """
        to_save = [stored_delta_channel(i) for i in infos]
        names: set[str] = set()
        for info in to_save:
            if info.collection_id != collection_id:
                raise ValueError(
                    f"delta channel {info.channel_name!r} belongs to collection {info.collection_id}, "
                    f"not {collection_id}"
                )
            if not info.channel_name:
                raise ValueError(f"a delta channel of collection {collection_id} has no channel name")
            if info.channel_name in names:
                raise ValueError(f"delta channel {info.channel_name} of collection {collection_id} appears twice")
            names.add(info.channel_name)
        core = self._core

        async def body() -> None:
            if collection_id not in core.index.collections:
                raise CollectionNotLoaded(collection_id)
            mutations = [core.put_delta_channel(i) for i in to_save]
            stale = set(core.index.delta_channels.get(collection_id, {})) - names
            mutations.extend(core.drop_delta_channel(collection_id, n) for n in sorted(stale))
            await core.commit("set_delta_channels", mutations, atomic=True)

        await core.guarded(lambda: [collection_id], body)

    @staticmethod
    def query_channels(collection_id: int) -> tuple[str, str]:
        """(query channel, query result channel) of a collection: derived from the id, not stored."""
        return keys.query_channels(collection_id)
