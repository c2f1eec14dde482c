"""Create the etcd users and roles of least privilege for one deployment: the same as ``querycoord etcd roles``.

    python scripts/etcd_roles.py --etcd-endpoints HOST:2379 --etcd-user root \
        --etcd-password-file /etc/querycoord/etcd-root --root querycoord \
        --querynodes 1,2,3 --streamnodes 10,11 --password-dir /etc/querycoord/etcd-users [--dry-run]

Passwords come from files (``--password-dir``, ``--etcd-password-file``) or
``$QUERYCOORD_ETCD_PASSWORD``, never from the command line. See README,
"etcd least privilege", and ``meta/ops/etcd_roles.py`` for the roles.
"""

from __future__ import annotations

import sys

from querycoord.cli import main

if __name__ == "__main__":
    sys.exit(main(["etcd", "roles", *sys.argv[1:]]))
