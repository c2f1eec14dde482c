"""Whether anything listens at etcd's endpoints: a TCP connect per endpoint, answered in milliseconds.

gRPC reports a refused connection as UNAVAILABLE, the same as a server that
is slow to answer, and retries it until the deadline; a one-shot command
would wait its whole timeout to say what the kernel said at once. A refused
connection (RST) and a host name that does not exist are final answers; a
connect that times out (packets dropped) or fails otherwise is not, and is
left to the normal retries.

Skipped when a proxy variable is set: gRPC may reach etcd through the proxy,
where a direct connect would be refused.
"""

from __future__ import annotations

import asyncio
import os
import socket

from meta.address import split_address

_PROXY_VARIABLES = ("grpc_proxy", "https_proxy", "http_proxy")


def _proxied() -> bool:
    return any(os.environ.get(v) or os.environ.get(v.upper()) for v in _PROXY_VARIABLES)


async def _refusal(endpoint: str, timeout: float) -> str | None:
    """Why nothing can listen at ``endpoint`` ("connection refused", "host not found"), or None (it accepts, or
    the answer is not final)."""
    host, port = split_address(endpoint)
    loop = asyncio.get_running_loop()
    try:
        infos = await asyncio.wait_for(loop.getaddrinfo(host.strip("[]"), port, type=socket.SOCK_STREAM), timeout)
    except socket.gaierror as exc:
        return "host not found" if exc.errno == socket.EAI_NONAME else None
    except (OSError, TimeoutError):
        return None
    for family, kind, proto, _, address in infos:
        with socket.socket(family, kind, proto) as sock:
            sock.setblocking(False)
            try:
                await asyncio.wait_for(loop.sock_connect(sock, address), timeout)
            except ConnectionRefusedError:
                continue
            except (OSError, TimeoutError):
                return None
            return None
    return "connection refused" if infos else None


async def refusals(endpoints: list[str] | tuple[str, ...], timeout: float = 1.0) -> dict[str, str] | None:
    """endpoint -> why, when every endpoint gives a final no; None when any may still answer (or a proxy is
    configured)."""
    if _proxied() or not endpoints:
        return None
    reasons = await asyncio.gather(*(_refusal(ep, timeout) for ep in endpoints))
    if any(r is None for r in reasons):
        return None
    return {ep: str(r) for ep, r in zip(endpoints, reasons, strict=True)}


__all__ = ["refusals"]
