"""How readers find ``up``'s cluster: etcd on etcdctl's default port when it is free, and an ``export`` line.

Readers of etcd given no endpoints try ``127.0.0.1:2379`` as etcdctl does, so
``up`` starts its etcd there when it can. When the port is taken (another
etcd), it takes a free one and says so; either way it prints one ``export``
line naming its etcd endpoints, meta root and coordinator address (what the
commands read from ``QUERYCOORD_ETCD_ENDPOINTS``, ``QUERYCOORD_ROOT`` and
``QUERYCOORD_ADDRESS``), and writes the same line to ``<data-dir>/env``, so
``source DIR/env`` in another terminal reaches this cluster.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping
from pathlib import Path

from querycoord.tooling.up_checks import listen_problem

DEFAULT_ETCD_PORT = 2379
ENV_FILE = "env"


def etcd_port(requested: int | None) -> tuple[int, bool]:
    """The client port to start etcd on (0: a free one) and whether that is because the default is taken.

    ``requested`` None: the default port when free. A port asked for
    explicitly must be free (``ValueError`` otherwise); 0 is any free port.
    """
    if requested is None:
        if listen_problem(f"127.0.0.1:{DEFAULT_ETCD_PORT}") is None:
            return DEFAULT_ETCD_PORT, False
        return 0, True
    if requested and listen_problem(f"127.0.0.1:{requested}") is not None:
        raise ValueError(f"--etcd-port {requested}: 127.0.0.1:{requested} is taken by another process (another "
                         f"etcd or `querycoord up`?); stop it, choose another port, or give 0 for any free port")
    return requested, False


def default_taken_note(endpoints: list[str]) -> str:
    """The one line that says etcd is not where readers look by default."""
    return (f"note: 127.0.0.1:{DEFAULT_ETCD_PORT} (etcd's default port) is taken; this cluster's etcd listens on "
            f"{','.join(endpoints)}: the export line below tells the commands")


def export_line(variables: Mapping[str, str]) -> str:
    """``export A=1 B=2``, each value quoted for a POSIX shell."""
    return "export " + " ".join(f"{k}={shlex.quote(v)}" for k, v in variables.items())


def write_env_file(data_dir: Path, variables: Mapping[str, str]) -> Path:
    """``<data_dir>/env``: a comment and the export line; returns its path."""
    path = Path(data_dir) / ENV_FILE
    path.write_text("# querycoord up: `source` this file to reach the cluster (status, meta, nodes, ...)\n"
                    f"{export_line(variables)}\n")
    return path


__all__ = ["DEFAULT_ETCD_PORT", "ENV_FILE", "default_taken_note", "etcd_port", "export_line", "write_env_file"]
