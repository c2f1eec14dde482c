"""``HOST:PORT`` addresses, read one way by every process kind.

etcd endpoints are checked here, and so are the coordinator's and the nodes'
listen, advertise and HTTP addresses: those modules import this one, since
``meta`` is the layer they all share (and it imports nothing of theirs). The
port is the text after the last colon, so an IPv6 host is written in
brackets (``[::1]:2379``); the host is kept as written, so
``f"{host}:{port}"`` gives the address back.
"""

from __future__ import annotations

MAX_PORT = 65535
# The hosts a listen address names to take every interface; a client on this machine reaches them at loopback.
WILDCARD_HOSTS = frozenset({"", "0.0.0.0", "::", "[::]"})


def split_address(address: str, *, any_host: bool = False) -> tuple[str, int]:
    """``address`` as (host, port), the port a decimal number from 0 to 65535 (0: any free port).

    The host must be given unless ``any_host`` (a listen address whose empty
    host means every interface). ``ValueError`` says what is wrong.
    """
    host, sep, port = address.rpartition(":")
    if not sep or not (port.isascii() and port.isdigit()) or not (any_host or host.strip("[]")):
        raise ValueError(f"{address!r} is not host:port (e.g. 127.0.0.1:19531, or port 0 for any free port)")
    if int(port) > MAX_PORT:
        raise ValueError(f"{address!r}: port {port} is out of range (0 to {MAX_PORT}; 0: any free port)")
    return host, int(port)


def address_problem(address: str, *, any_host: bool = False) -> str | None:
    """Why ``address`` is not ``HOST:PORT`` (see ``split_address``), or None."""
    try:
        split_address(address, any_host=any_host)
    except ValueError as exc:
        return str(exc)
    return None


def on_port(address: str, port: int) -> str:
    """``address``'s host with another port (``on_port(a, 0)``: any free port of the same host)."""
    return f"{address.rpartition(':')[0]}:{port}"


def local_host(host: str) -> str:
    """Where a client on this machine reaches a server listening on ``host``: loopback for a wildcard host."""
    return "127.0.0.1" if host in WILDCARD_HOSTS else host
