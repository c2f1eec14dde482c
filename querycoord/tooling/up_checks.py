"""What ``up`` and ``coord`` check before starting anything: a listen address they can take, a data dir they can
write; and a free port for etcd's default."""

from __future__ import annotations

import errno
import socket
import tempfile
from pathlib import Path

from meta.address import split_address


def listen_problem(listen: str) -> str | None:
    """Why a coordinator cannot take ``listen`` (malformed, or someone listens there now), or None.

    gRPC binds with SO_REUSEPORT, so a second coordinator on a busy port
    would start "successfully" and share the port with the first one:
    clients would be spread over two unrelated clusters. A plain bind
    (SO_REUSEADDR, not SO_REUSEPORT) fails only if someone listens there now.
    """
    try:
        host, port = split_address(listen)
    except ValueError as exc:
        return f"listen address {exc}"
    host = host.strip("[]")
    if port == 0:
        return None
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # a recently closed port (TIME_WAIT) is free
        try:
            s.bind((host, port))
        except OSError as exc:
            why = exc.strerror or str(exc)
            if exc.errno == errno.EADDRINUSE:
                why += " (another `querycoord up` or coordinator?); stop it or choose another --listen"
            return f"cannot listen on {listen}: {why}"
    return None


def data_dir_problem(path: str | Path, flag: str = "--data-dir") -> str | None:
    """Why ``path`` cannot hold etcd's data and the logs (a file, or not a writable directory), or None.

    Creates the directory: the question is whether this process can, and
    asked this way root's answers are right too (``os.access`` would say yes).
    """
    p = Path(path)
    if p.exists() and not p.is_dir():
        return f"{flag} {p} is a file, not a directory"
    try:
        p.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=p):
            pass
    except OSError as exc:
        return f"{flag} {p} is not a writable directory: {exc.strerror or exc}"
    return None


__all__ = ["data_dir_problem", "listen_problem"]
