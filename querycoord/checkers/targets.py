"""The target: what each loaded collection should hold (its loaded partitions' sealed segments and DM channels),
read from the followed copy of a local catalog when it is current, else from the catalog itself."""

from __future__ import annotations

from collections.abc import Iterable

from loguru import logger

from meta.errors import MetaError
from querycoord.catalog.targets import CatalogTargets
from querycoord.common.target import Target, TargetSegment
from querycoord.task.model import TaskEnv

# How long a pass waits for the catalog copy to reach etcd's revision before it reads the catalog instead.
TARGETS_CATCH_UP = 5.0


class TargetReader:
    """Reads targets for a pass (``targets``: the followed catalog copy, None for a remote catalog)."""

    def __init__(self, env: TaskEnv, targets: CatalogTargets | None):
        self.env = env
        self.targets = targets
        self._no_target: set[int] = set()  # collections the catalog lacks (logged once each)

    async def read(self, cids: Iterable[int]) -> dict[int, Target]:
        """The targets of ``cids``; a collection the catalog lacks (or one of its loaded partitions) is left out.
        None asked (every loaded collection owned by a trigger: a takeover's first pass with nodes down): nothing is
        read, and the copy is not brought up to date for it."""
        cids = list(cids)
        if not cids:
            return {}
        if self.targets is not None:
            try:
                await self.targets.catch_up(TARGETS_CATCH_UP)
            except (TimeoutError, MetaError) as exc:
                logger.info("checker: the catalog copy is not current ({}); reading the catalog",
                            exc or "it did not catch up in time")
            else:
                return self._from_copy(self.targets, cids)
        return await self._from_catalog(cids)

    def _from_copy(self, targets: CatalogTargets, cids: Iterable[int]) -> dict[int, Target]:
        out: dict[int, Target] = {}
        for cid in cids:
            target = targets.target(cid, self.env.meta.partition_ids(cid))
            if target is None:
                if cid not in self._no_target:
                    logger.warning("checker: collection {} is loaded but the catalog lacks it or one of "
                                   "its loaded partitions; it is left alone", cid)
                self._no_target.add(cid)
                continue
            self._no_target.discard(cid)
            out[cid] = target
        return out

    async def _from_catalog(self, cids: Iterable[int]) -> dict[int, Target]:
        env = self.env
        out: dict[int, Target] = {}
        for cid in cids:
            target = Target()
            for pid in env.meta.partition_ids(cid):
                chans, binlogs = await env.broker.get_recovery_info(cid, pid)
                part = target.partitions.setdefault(pid, {})
                for b in binlogs:
                    part[b.segment_id] = target.segments[b.segment_id] = TargetSegment(
                        b.segment_id, pid, tuple(b.compaction_from), b.mem_size)
                target.channels.update(c.channel_name for c in chans)
            out[cid] = target
        return out
