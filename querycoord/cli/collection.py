"""``querycoord collection create|load|resize|release|drop|show`` and ``querycoord replicas``."""

from __future__ import annotations

import argparse
import re
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from proto import catalog_pb2, common_pb2
from querycoord.cli.common import (
    add_output_option,
    client_command,
    emit,
    non_negative_int,
    positive_float,
    positive_int,
)
from querycoord.cli.describe_cmd import add_describe_parser
from querycoord.cli.watch import add_watch_option
from querycoord.common.wording import plural
from querycoord.console import draw
from querycoord.console.actions import (
    COLLECTION_HEADERS,
    MIB,
    Refusal,
    check,
    collection_records,
    collection_table_rows,
    create_collection,
    describe,
    follow_load,
    get_replicas,
    load,
    partition_ids,
    release,
)
from querycoord.console.resize import RESIZE, follow_resize, task_summary, update_load_config
from querycoord.net.client import QueryCoordClient

# ``actions.load`` / ``actions.release``: one request for a collection or some of its partitions; the task id.
Send = Callable[[QueryCoordClient, catalog_pb2.CollectionDescription, Sequence[int]], Awaitable[int]]


async def _collection_create(c: QueryCoordClient, args: argparse.Namespace) -> int:
    t0 = time.monotonic()
    desc, n = await create_collection(c, args.name, partitions=args.partitions, segments=args.segments,
                                      channels=args.channels, segment_mb=args.segment_mb, rows=args.rows)
    print(f"created collection {desc.name} (id {desc.collection_id}): {plural(len(desc.partitions), 'partition')}, "
          f"{plural(len(desc.dm_channels), 'DM channel')}, {plural(n, 'segment')} of "
          f"{draw.mib(round(args.segment_mb * MIB))} "
          f"in {time.monotonic() - t0:.1f}s")
    return 0


async def _send(c: QueryCoordClient, args: argparse.Namespace, send: Send) -> tuple[
        catalog_pb2.CollectionDescription, str, int, float]:
    """Send ``load`` or ``release`` for the collection (or partitions) ``args`` name: the collection, how messages
    name what was asked, the task id (0: nothing to do) and when it was sent."""
    desc = await describe(c, args.collection)
    pids = partition_ids(desc, args.partitions)
    what = f"{desc.name} (id {desc.collection_id})" + (f" partitions {pids}" if pids else "")
    t0 = time.monotonic()
    return desc, what, await send(c, desc, pids), t0


async def _collection_load(c: QueryCoordClient, args: argparse.Namespace) -> int:
    async def send(c: QueryCoordClient, desc: catalog_pb2.CollectionDescription, pids: Sequence[int]) -> int:
        return await load(c, desc, pids, replicas=args.replicas)

    desc, what, task_id, t0 = await _send(c, args, send)
    if task_id == 0:
        print(f"{what} is already loaded")
        return 0
    if args.replicas is not None and not args.partitions:
        kind, summary = await task_summary(c, task_id)
        if kind == RESIZE:  # loaded with another number: resized in place
            return await _follow_resize(c, args, desc, what, task_id, summary, t0)
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
    copies = "" if args.replicas is None else f" with {args.replicas} replica{'s' if args.replicas > 1 else ''}"
    print(f"loaded {what}{copies} in {time.monotonic() - t0:.1f}s (task #{task_id})")
    return 0


async def _collection_resize(c: QueryCoordClient, args: argparse.Namespace) -> int:
    desc = await describe(c, args.collection)
    what = f"{desc.name} (id {desc.collection_id})"
    t0 = time.monotonic()
    task_id = await update_load_config(c, desc, args.replicas)
    if task_id == 0:
        print(f"{what} already has {args.replicas} replica{'s' if args.replicas > 1 else ''}")
        return 0
    _kind, summary = await task_summary(c, task_id)
    return await _follow_resize(c, args, desc, what, task_id, summary, t0)


async def _follow_resize(c: QueryCoordClient, args: argparse.Namespace, desc: catalog_pb2.CollectionDescription,
                         what: str, task_id: int, summary: str, t0: float) -> int:
    """Say that ``task_id`` resizes the collection and, unless ``--no-wait``, follow it to its end."""
    m = re.search(r"(\d+) -> (\d+) replicas", summary)
    print(f"resizing {what} from {m.group(1)} to {plural(int(m.group(2)), 'replica')} (task #{task_id})" if m
          else f"{what}: {summary} (task #{task_id})")
    if args.no_wait:
        print(f"follow it with `querycoord tasks --task {task_id}`")
        return 0
    bar = draw.ProgressBar(f"resizing {desc.name}")
    try:
        number = await follow_resize(c, desc.collection_id, task_id, bar)
    except Refusal:
        bar.finish("failed")
        raise
    bar.finish(f"task #{task_id}")
    print(f"resized {what} to {number} replica{'s' if number > 1 else ''} in {time.monotonic() - t0:.1f}s "
          f"(task #{task_id})")
    return 0


async def _collection_release(c: QueryCoordClient, args: argparse.Namespace) -> int:
    _, what, task_id, t0 = await _send(c, args, release)
    if task_id == 0:
        print(f"{what} was not loaded: nothing to release")
    else:
        print(f"released {what} in {time.monotonic() - t0:.1f}s (task #{task_id})")
    return 0


async def _collection_drop(c: QueryCoordClient, args: argparse.Namespace) -> int:
    desc = await describe(c, args.collection)
    resp = await c.catalog("DropCollection", catalog_pb2.DropCollectionRequest(collection_id=desc.collection_id))
    check(resp, f"drop collection {desc.name}")
    print(f"dropped collection {desc.name} (id {desc.collection_id}) with its partitions and segments")
    return 0


async def _collection_show(c: QueryCoordClient, args: argparse.Namespace) -> int:
    records = await collection_records(c, args.collections)
    for r in records:  # each loaded collection's replicas (GetReplicas); None when not loaded
        replicas = await get_replicas(c, r["id"]) if r["load_type"] is not None else None
        r["replicas"] = None if replicas is None else draw.replica_records(replicas)

    def render() -> list[str]:
        if not records:
            return ["no collections; create one with `querycoord collection create NAME`"]
        lines = draw.table(COLLECTION_HEADERS, collection_table_rows(records), right=(0, 2, 3, 5, 6))
        replicas = [x for r in records for x in r["replicas"] or ()]
        if replicas:
            lines += ["", *draw.table(("COLLECTION", *draw.REPLICA_HEADERS),
                                      draw.replica_rows(replicas, collection=True), right=(0, 1, 3, 4, 5))]
        return lines

    emit(args, records, render)
    return 0


async def _replicas(c: QueryCoordClient, args: argparse.Namespace) -> int:
    desc = await describe(c, args.collection)
    replicas = await get_replicas(c, desc.collection_id)
    if replicas is None:
        raise Refusal(f"collection {desc.name} (id {desc.collection_id}) is not loaded; "
                      f"`querycoord collection load {desc.name} --replicas N` loads N copies", common_pb2.NOT_FOUND)
    records = draw.replica_records(replicas)

    def render() -> list[str]:
        return draw.table(draw.REPLICA_HEADERS, draw.replica_rows(records), right=(0, 2, 3, 4))

    emit(args, records, render)
    return 0


def _targeted(csub: Any, name: str, help_: str, client: list[argparse.ArgumentParser]) -> argparse.ArgumentParser:
    """A sub-command acting on one collection (``load``, ``release``), optionally on some of its partitions."""
    q = csub.add_parser(name, parents=client, help=help_)
    q.add_argument("collection", help="collection id or name")
    q.add_argument("--partitions", nargs="+", help="partition ids or names (default: the whole collection)")
    return q


def add_parsers(sub: Any, client: list[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("collection", help="create, load, release, drop and show collections")
    csub = p.add_subparsers(dest="action", required=True, metavar="ACTION")
    q = csub.add_parser("create", parents=client, help="create a collection with synthetic sealed segments")
    q.add_argument("name")
    q.add_argument("--partitions", type=positive_int, default=1, help="number of partitions (default 1)")
    q.add_argument("--segments", type=non_negative_int, default=0,
                   help="sealed segments spread over the partitions (default 0)")
    q.add_argument("--channels", type=positive_int, default=2, help="DM channels (default 2)")
    q.add_argument("--segment-mb", type=positive_float, default=1.0,
                   help="memory size of each segment in MiB (default 1)")
    q.add_argument("--rows", type=non_negative_int, default=0,
                   help="rows per segment (default 0: derived from the size)")
    q.set_defaults(func=client_command(_collection_create))

    q = _targeted(csub, "load", "load a collection (or partitions), with a progress bar", client)
    q.add_argument("--no-wait", action="store_true", help="return once the load is queued")
    q.add_argument("--replicas", type=positive_int, metavar="N",
                   help="in-memory copies, each on its own query nodes (default: 1 for a new load, else the "
                        "number the collection is loaded with; another number resizes a loaded collection)")
    q.set_defaults(func=client_command(_collection_load))

    q = csub.add_parser("resize", parents=client,
                        help="resize a loaded collection in place to N replicas (UpdateLoadConfig)")
    q.add_argument("collection", help="collection id or name")
    q.add_argument("--replicas", type=positive_int, metavar="N", required=True,
                   help="in-memory copies, each on its own query nodes")
    q.add_argument("--wait", dest="no_wait", action="store_false",
                   help="follow the resize to its end with a progress bar (the default)")
    q.add_argument("--no-wait", dest="no_wait", action="store_true", help="return once the resize is queued")
    q.set_defaults(func=client_command(_collection_resize), no_wait=False)

    q = _targeted(csub, "release", "release a collection (or partitions)", client)
    q.set_defaults(func=client_command(_collection_release))

    q = csub.add_parser("drop", parents=client,
                        help="drop a collection from the catalog with its partitions and segments (release it first)")
    q.add_argument("collection", help="collection id or name")
    q.set_defaults(func=client_command(_collection_drop))

    q = csub.add_parser("show", parents=client, help="collections and their load state, with their replicas")
    q.add_argument("collections", nargs="*", help="collection ids or names (default: all)")
    add_output_option(q)
    add_watch_option(q)
    q.set_defaults(func=client_command(_collection_show))
    add_describe_parser(csub, client)

    q = sub.add_parser("replicas", parents=client,
                       help="the replicas of a loaded collection: nodes, in-memory %%, segments, DM channels")
    q.add_argument("collection", help="collection id or name")
    add_output_option(q)
    add_watch_option(q)
    q.set_defaults(func=client_command(_replicas))
