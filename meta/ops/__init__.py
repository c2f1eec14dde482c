"""Operations tooling for etcd, built on the ``meta`` library: what runs, watches and repairs etcd itself.

* ``etcd_server``: find an etcd binary and run an embedded member or a
  3-member cluster on loopback (``EtcdCluster``), for development, tests,
  drills and the demo; production runs its own etcd;
* ``child``: ``ChildProcess``, the one way the tooling starts a child
  process (JSON events on stdout, a log file, dies with its parent);
* ``etcd_roles``: least privilege, the users and roles of a deployment
  (``apply_roles``, ``enable_auth``);
* ``maintenance``: etcd as an operator sees it: member status, alarms,
  compaction, defragmentation (``maintain``).

The core library (every other module of ``meta``) never imports this
package, not even for type hints: ``scripts/check_imports.py`` fails when
one does. What is here may import the library freely.
"""
