"""Makes a test's ``kv`` the elected leader, so that it can write as the coordinator does: through ``kv.fenced``."""

from __future__ import annotations

from meta.fence import Fence
from meta.kv import MetaKV

LEADER_KEY = "election/leader"


async def leader_fence(kv: MetaKV) -> Fence:
    """A fence on the leader key as it now stands: fenced writes are refused once the key is re-created."""
    await kv.save(LEADER_KEY, "me")
    item = await kv.get_kv(LEADER_KEY)
    assert item is not None
    return Fence(kv.abs_key(LEADER_KEY).decode(), item.create_revision)
