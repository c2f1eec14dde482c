"""``querycoord collection create|load|release|show``."""

from __future__ import annotations

import argparse
import time
from typing import Any

from querycoord import draw
from querycoord.actions import (
    COLLECTION_HEADERS,
    MIB,
    Refusal,
    collection_rows,
    create_collection,
    describe,
    follow_load,
    load,
    partition_ids,
    release,
)
from querycoord.cli.common import client_command
from querycoord.client import QueryCoordClient


async def _collection_create(c: QueryCoordClient, args: argparse.Namespace) -> int:
    t0 = time.monotonic()
    desc, n = await create_collection(c, args.name, partitions=args.partitions, segments=args.segments,
                                      channels=args.channels, segment_mb=args.segment_mb, rows=args.rows)
    print(f"created collection {desc.name} (id {desc.collection_id}): {len(desc.partitions)} partitions, "
          f"{len(desc.dm_channels)} DM channels, {n:,} segments of {draw.mib(int(args.segment_mb * MIB))} "
          f"in {time.monotonic() - t0:.1f}s")
    return 0


async def _collection_load(c: QueryCoordClient, args: argparse.Namespace) -> int:
    desc = await describe(c, args.collection)
    pids = partition_ids(desc, args.partitions)
    what = f"{desc.name} (id {desc.collection_id})" + (f" partitions {pids}" if pids else "")
    t0 = time.monotonic()
    task_id = await load(c, desc, pids)
    if task_id == 0:
        print(f"{what} is already loaded")
        return 0
    if args.no_wait:
        print(f"load of {what} queued as task #{task_id}; follow it with `querycoord tasks --task {task_id}`")
        return 0
    bar = draw.ProgressBar(f"loading {desc.name}")
    try:
        pct = await follow_load(c, desc.collection_id, task_id, bar)
    except Refusal:
        bar.finish("failed")
        raise
    bar.finish(f"task #{task_id}")
    if pct < 100:
        print(f"load task #{task_id} of {what} ended with the collection {pct}% in memory; "
              f"see `querycoord tasks --task {task_id}`")
        return 1
    print(f"loaded {what} in {time.monotonic() - t0:.1f}s (task #{task_id})")
    return 0


async def _collection_release(c: QueryCoordClient, args: argparse.Namespace) -> int:
    desc = await describe(c, args.collection)
    pids = partition_ids(desc, args.partitions)
    what = f"{desc.name} (id {desc.collection_id})" + (f" partitions {pids}" if pids else "")
    t0 = time.monotonic()
    task_id = await release(c, desc, pids)
    if task_id == 0:
        print(f"{what} was not loaded: nothing to release")
    else:
        print(f"released {what} in {time.monotonic() - t0:.1f}s (task #{task_id})")
    return 0


async def _collection_show(c: QueryCoordClient, args: argparse.Namespace) -> int:
    rows = await collection_rows(c, args.collections)
    if not rows:
        print("no collections; create one with `querycoord collection create NAME`")
        return 0
    print("\n".join(draw.table(COLLECTION_HEADERS, rows, right=(0, 2, 3, 5, 6))))
    return 0


def add_parsers(sub: Any, client: list[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("collection", help="create, load, release and show collections")
    csub = p.add_subparsers(dest="action", required=True, metavar="ACTION")
    q = csub.add_parser("create", parents=client, help="create a collection with synthetic sealed segments")
    q.add_argument("name")
    q.add_argument("--partitions", type=int, default=1, help="number of partitions (default 1)")
    q.add_argument("--segments", type=int, default=0, help="sealed segments spread over the partitions (default 0)")
    q.add_argument("--channels", type=int, default=2, help="DM channels (default 2)")
    q.add_argument("--segment-mb", type=float, default=1.0, help="memory size of each segment in MiB (default 1)")
    q.add_argument("--rows", type=int, default=0, help="rows per segment (default: derived from the size)")
    q.set_defaults(func=client_command(_collection_create))

    q = csub.add_parser("load", parents=client, help="load a collection (or partitions), with a progress bar")
    q.add_argument("collection", help="collection id or name")
    q.add_argument("--partitions", nargs="+", help="partition ids or names (default: the whole collection)")
    q.add_argument("--no-wait", action="store_true", help="return once the load is queued")
    q.set_defaults(func=client_command(_collection_load))

    q = csub.add_parser("release", parents=client, help="release a collection (or partitions)")
    q.add_argument("collection", help="collection id or name")
    q.add_argument("--partitions", nargs="+", help="partition ids or names (default: the whole collection)")
    q.set_defaults(func=client_command(_collection_release))

    q = csub.add_parser("show", parents=client, help="collections and their load state")
    q.add_argument("collections", nargs="*", help="collection ids or names (default: all)")
    q.set_defaults(func=client_command(_collection_show))
