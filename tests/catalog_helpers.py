"""The catalog's follower for tests that compare what it followed with what the catalog holds."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

from meta.kv import MetaKV
from querycoord.catalog.targets import CatalogTargets


@contextlib.asynccontextmanager
async def followed_catalog(kv: MetaKV) -> AsyncIterator[CatalogTargets]:
    """A ``CatalogTargets`` started and caught up with everything the catalog under ``kv`` holds; stopped on exit."""
    targets = CatalogTargets(kv)
    targets.start()
    try:
        await targets.catch_up(15)
        yield targets
    finally:
        await targets.stop()
