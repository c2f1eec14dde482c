"""The leader's world: the coordinator's campaign and takeover (``coordinator``), the observers it runs
(catalog handoff, nodes coming and going), auto balance, etcd's space, the jobs that turn a mutating call into a
trigger, and the planned switchover. The engine it drives is ``task``, ``checkers``, ``querymeta``, ``stream``.
"""
