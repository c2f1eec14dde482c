"""Load progress from what nodes hold: a partition that lost segments stops claiming 100 %, and each replica's
percentage is what its nodes report."""

from __future__ import annotations

from loguru import logger

from querycoord.common.partition_state import IN_MEMORY, PARTIAL
from querycoord.querymeta import QueryMeta


def _pct(held: int, total: int) -> int:
    return 100 if total == 0 else held * 100 // total


async def set_progress(meta: QueryMeta, cid: int, parts: dict[int, tuple[int, int]],
                       replicas: dict[int, tuple[int, int]]) -> int:
    """Write the partitions' states and percentages (``parts``: partition -> (held, total)) where they changed,
    and the replicas' percentages (``replicas``: replica -> (held, total)); returns how many partitions changed."""
    changed = await _set_partitions(meta, cid, parts)
    await meta.set_replica_percentages(cid, {r: _pct(h, t) for r, (h, t) in replicas.items()})
    return changed


async def _set_partitions(meta: QueryMeta, cid: int, parts: dict[int, tuple[int, int]]) -> int:
    info = meta.get_collection(cid)
    if info is None:
        return 0
    states: dict[int, tuple[int, int]] = {}
    for p in info.partitions:
        if p.partition_id not in parts:
            continue
        pct = _pct(*parts[p.partition_id])
        state = IN_MEMORY if pct == 100 else PARTIAL
        if (p.state, p.in_memory_percentage) != (state, pct):
            states[p.partition_id] = (state, pct)
    if states:
        await meta.set_partition_states(cid, states)  # type: ignore[arg-type]
        logger.info("checker: collection {}: load progress corrected from the nodes: {}", cid, states)
    return len(states)
