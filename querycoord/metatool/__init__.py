"""``querycoord meta``: read, check and repair what a deployment keeps in etcd, with or without a coordinator.

The model is Milvus's birdwatcher: when a coordinator is stuck, an operator
reads its keys straight from etcd. Everything here starts from one
``Snapshot`` (every key under the root at one etcd revision), so what is
shown and checked is a consistent state, never keys read at different times.

Modules: ``owners`` (which prefix belongs to whom), ``snapshot`` (the one
read), ``show`` (decoded records per kind, as rows), ``problems`` (what a
check reports and the txn that fixes it), ``check_tasks``, ``check_query``,
``check_streams`` and ``verify`` (the checks), ``repair`` (applying the fixes
under a fence of its own, never beside a live leader).
"""
