"""etcd's health and space, as an operator needs them: member status, alarms, compaction, defragmentation.

etcd keeps every revision until it is compacted, and keeps the freed pages
in its file until it is defragmented; once the file reaches the backend
quota etcd raises the NOSPACE alarm and refuses every write until an
operator compacts, defragments and disarms the alarm. That is the most
common way an etcd-backed coordinator goes down, so the steps are here, in
the safe order, rather than in a runbook:

1. compact to ``revision - keep`` (never past what a watcher may still need:
   ``keep`` revisions stay resumable; a watcher further behind re-lists);
2. defragment the members one at a time (a member is unavailable while it
   defragments, so never all at once);
3. disarm NOSPACE, but only once defragmentation left room under the quota
   (disarming a member still at its quota only raises the alarm again at the
   next write).

Each member is asked through a connection of its own: a status or a
defragmentation is per member, and one member down must not hide the others.
etcd before 3.6 reports its quota only on its metrics endpoint (the client
URL's ``/metrics``), so that is where ``backend_quota`` reads it.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import re
import ssl
from collections.abc import Callable
from dataclasses import dataclass, field

import grpc
from etcd3aio.maintenance import AlarmType, MaintenanceService

from meta.client import EtcdClient, connect
from meta.config import EtcdConfig
from meta.errors import ClientClosed, MetaAuthError, MetaError, MetaRefused, MetaUnavailable, NotEtcd
from meta.etcd_pb import AlarmResponse, CompactionRequest, RangeRequest

MIB = 1 << 20
# Revisions kept by `maintain` and by the embedded etcd's auto compaction: watchers up to this far behind resume
# exactly; one further behind re-lists its prefix (meta.watch.Resync), which is correct, only slower.
DEFAULT_KEEP_REVISIONS = 10_000


@dataclass
class MemberStatus:
    """One member as it answers ``Maintenance.Status``; ``error`` set (and the rest zero) when it did not.

    ``leader`` is the raft leader's member id as this member sees it (0: none);
    ``db_size_quota`` 0 when unknown; ``compacted_revision`` is the oldest
    revision this member can still read.
    """

    endpoint: str
    member_id: int = 0
    version: str = ""
    db_size: int = 0
    db_size_in_use: int = 0
    db_size_quota: int = 0
    revision: int = 0
    compacted_revision: int = 0
    raft_term: int = 0
    leader: int = 0
    is_leader: bool = False
    errors: list[str] = field(default_factory=list)
    error: str = ""
    # ``error`` in a few words, for a table cell ("unreachable: connection refused"); ``error`` keeps the whole.
    reason: str = ""

    def as_dict(self) -> dict[str, object]:
        return dataclasses.asdict(self)


@dataclass
class ClusterStatus:
    """Every member, the cluster's alarms, its revision and compacted revision (the members' highest; 0 unknown)."""

    members: list[MemberStatus]
    alarms: list[tuple[int, str]]
    revision: int
    compacted_revision: int

    @property
    def nospace(self) -> bool:
        return any(name == "NOSPACE" for _, name in self.alarms)

    def as_dict(self) -> dict[str, object]:
        return {"members": [m.as_dict() for m in self.members],
                "alarms": [{"member_id": m, "alarm": a} for m, a in self.alarms],
                "revision": self.revision, "compacted_revision": self.compacted_revision}


def short_reason(exc: MetaError) -> str:
    """Why a member did not answer, in a few words (the message itself names every endpoint and what to check)."""
    if isinstance(exc, MetaRefused):
        return "unreachable: " + ", ".join(sorted(set(exc.reasons.values())))
    if isinstance(exc, MetaUnavailable):
        if exc.hint:  # the TLS hints of meta.client: a failed handshake, or a plaintext client closed by TLS
            return "unreachable: connection closed (TLS?)" if "If etcd serves TLS" in exc.hint else \
                "unreachable: TLS handshake failed"
        return f"unreachable: no answer within {exc.elapsed:.1f}s"
    if isinstance(exc, MetaAuthError):
        return "credentials refused"
    if isinstance(exc, NotEtcd):
        return "not etcd (a gRPC server without etcd's API)"
    return type(exc).__name__


def _member_config(config: EtcdConfig, endpoint: str) -> EtcdConfig:
    return dataclasses.replace(config, endpoints=(endpoint,), deadline=config.call_timeout)


async def member_status(config: EtcdConfig, endpoint: str) -> MemberStatus:
    """The status of the member at ``endpoint``; a member that does not answer is reported, not raised."""
    try:
        client = await connect(_member_config(config, endpoint))
    except MetaError as exc:
        return MemberStatus(endpoint, error=str(exc).splitlines()[0], reason=short_reason(exc))
    try:
        maintenance = _maintenance(client, "Maintenance.Status")
        resp = await client.call("Maintenance.Status", lambda t: maintenance.status(timeout=t))
        status = MemberStatus(endpoint, member_id=resp.header.member_id, version=resp.version, db_size=resp.dbSize,
                              db_size_in_use=resp.dbSizeInUse, revision=resp.header.revision,
                              raft_term=resp.raftTerm, leader=resp.leader,
                              is_leader=resp.leader == resp.header.member_id, errors=list(resp.errors))
    except MetaError as exc:
        await client.close()
        return MemberStatus(endpoint, error=str(exc).splitlines()[0], reason=short_reason(exc))
    try:
        # The quota scrape (HTTP) runs beside the reads that find the compacted revision.
        quota = asyncio.ensure_future(backend_quota(config, endpoint)) if not resp.dbSizeQuota else None
        try:
            status.compacted_revision = await compacted_revision(client, status.revision)
        except asyncio.CancelledError:
            if quota is not None:
                quota.cancel()
            raise
        finally:
            if quota is not None and not quota.cancelled():
                status.db_size_quota = await quota
            else:
                status.db_size_quota = resp.dbSizeQuota
        return status
    except MetaError as exc:  # a member without a quorum answers its status but no reads
        status.error = f"answers its status but no reads: {str(exc).splitlines()[0]}"
        status.reason = "answers its status but no reads"
        return status
    finally:
        await client.close()


def _maintenance(client: EtcdClient, operation: str) -> MaintenanceService:
    """The client's maintenance stub; ``ClientClosed`` once the client is closed (its stubs are gone then)."""
    maintenance = client.raw.maintenance
    if maintenance is None or client.closed:
        raise ClientClosed(operation)
    return maintenance


async def alarms(client: EtcdClient) -> list[tuple[int, str]]:
    """Active alarms as (member id, name)."""
    maintenance = _maintenance(client, "Maintenance.Alarm")
    resp = await client.call("Maintenance.Alarm", lambda t: maintenance.alarms(timeout=t))
    names = {t.value: t.name for t in AlarmType}
    return [(a.memberID, names.get(a.alarm, str(a.alarm))) for a in resp.alarms]


async def _range_at(client: EtcdClient, revision: int) -> bool:
    """Whether a read at ``revision`` is still possible (False: compacted away)."""
    req = RangeRequest(key=b"\0", limit=1, revision=revision, keys_only=True)
    try:
        await client.call("Range at revision", lambda t: client.kv.Range(req, metadata=client.metadata, timeout=t))
    except grpc.aio.AioRpcError as exc:
        if exc.code() == grpc.StatusCode.OUT_OF_RANGE and "compacted" in (exc.details() or ""):
            return False
        raise
    return True


async def compacted_revision(client: EtcdClient, revision: int) -> int:
    """The oldest revision still readable (etcd reports it nowhere else): a binary search over reads at revisions.

    About log2(revision) small reads; 1 when nothing was ever compacted.
    """
    lo, hi = 1, max(1, revision)
    if await _range_at(client, lo):
        return 1
    while lo < hi:
        mid = (lo + hi) // 2
        if await _range_at(client, mid):
            hi = mid
        else:
            lo = mid + 1
    return lo


async def cluster_status(config: EtcdConfig) -> ClusterStatus:
    """Every member's status, the alarms and the compacted revision; members that are down are listed with why."""
    members = list(await asyncio.gather(*(member_status(config, ep) for ep in config.endpoints)))
    revision = max((m.revision for m in members), default=0)
    found: list[tuple[int, str]] = []
    if any(not m.error for m in members):
        async with await connect(config) as client:
            found = await alarms(client)
    return ClusterStatus(members, found, revision, max((m.compacted_revision for m in members), default=0))


@dataclass
class SpaceStatus:
    """What the member a client is connected to says of space: db file size, the part in use, the quota (0 when
    this etcd does not report it) and the cluster's alarms as (member id, name)."""

    db_size: int
    db_size_in_use: int
    quota: int
    alarms: list[tuple[int, str]]


_ALARM_IN_ERRORS = re.compile(r"memberID:(\d+) alarm:(\w+)")


async def space_status(client: EtcdClient) -> SpaceStatus:
    """One ``Maintenance.Status`` call: sizes, quota and alarms. A member's status lists the cluster's alarms
    (replicated to every member) among its errors, so this is one cheap local read where ``Maintenance.Alarm``
    would be a raft round (and a WAL write) each time; for a poll every few seconds."""
    maintenance = _maintenance(client, "Maintenance.Status")
    status = await client.call("Maintenance.Status", lambda t: maintenance.status(timeout=t))
    found = [(int(m[1]), m[2]) for e in status.errors if (m := _ALARM_IN_ERRORS.search(e))]
    return SpaceStatus(status.dbSize, status.dbSizeInUse, status.dbSizeQuota, found)


async def backend_quota(config: EtcdConfig, endpoint: str) -> int:
    """The member's backend quota in bytes, read from its metrics (etcd_server_quota_backend_bytes); 0 when it
    cannot be read.

    One plain HTTP/1.0 GET on the event loop (TLS when the config has a CA): a one-shot reader such as
    ``querycoord status`` pays for neither urllib's imports nor a thread for it."""
    try:
        return await asyncio.wait_for(_scrape_quota(config, endpoint), min(config.call_timeout, 5.0))
    except (OSError, ValueError):  # ssl.SSLError and TimeoutError are OSErrors; ValueError: a line past the limit
        return 0


def _tls_context(config: EtcdConfig) -> ssl.SSLContext | None:
    """The TLS context of a metrics scrape (None: plain HTTP), checking the server as the gRPC client does."""
    if config.ca_file is None:
        return None
    context = ssl.create_default_context(cafile=str(config.ca_file))
    if config.cert_file is not None and config.key_file is not None:
        context.load_cert_chain(str(config.cert_file), str(config.key_file))
    if config.tls_server_name:  # the certificate names another host than the endpoint's; the CA still checks it
        context.check_hostname = False
    return context


async def _scrape_quota(config: EtcdConfig, endpoint: str) -> int:
    host, _, port = endpoint.rpartition(":")
    host = host.strip("[]")
    context = _tls_context(config)
    reader, writer = await asyncio.open_connection(host, int(port), ssl=context,
                                                   server_hostname=(config.tls_server_name or host) if context
                                                   else None)
    try:
        # HTTP/1.0: the answer is the body up to the end of the connection, never chunked; no compression asked.
        writer.write(f"GET /metrics HTTP/1.0\r\nHost: {endpoint}\r\nAccept: text/plain\r\n\r\n".encode())
        status = (await reader.readline()).split()
        if len(status) < 2 or status[1] != b"200":
            return 0
        while (await reader.readline()).strip():  # the headers, up to the blank line
            pass
        while line := await reader.readline():
            if line.startswith(b"etcd_server_quota_backend_bytes "):
                return int(float(line.split()[1]))
        return 0
    finally:
        writer.close()
        try:
            await writer.wait_closed()
        except (OSError, ValueError):  # a TLS peer that closed first: nothing left to say
            pass


async def maintain(config: EtcdConfig, *, keep: int = DEFAULT_KEEP_REVISIONS, dry_run: bool = False,
                   say: Callable[[str], None] = print) -> ClusterStatus:
    """Compact, defragment member by member, disarm NOSPACE (see module docstring); returns the status after.

    With ``dry_run`` only says what it would do. Raises ``MetaError`` when a
    member is down: defragmenting the others while one is missing would leave
    the cluster without a quorum member to spare.
    """
    if keep < 0:
        raise ValueError(f"keep must be >= 0, got {keep}")
    before = await cluster_status(config)
    down = [m for m in before.members if m.error]
    if down:
        raise MetaError("; ".join(f"member {m.endpoint} is not answering: {m.error}" for m in down)
                        + ": maintenance needs every member up")
    target = before.revision - keep
    act = "would" if dry_run else "will"
    if target > before.compacted_revision:
        say(f"compact: {act} compact to revision {target} (current {before.revision}, keeping {keep} revisions)")
    else:
        say(f"compact: nothing to do (compacted at {before.compacted_revision}, current {before.revision}, "
            f"keeping {keep} revisions)")
    for m in before.members:
        say(f"defragment: {act} defragment {m.endpoint} (db {m.db_size / MIB:.1f} MiB, in use "
            f"{m.db_size_in_use / MIB:.1f} MiB)")
    if before.nospace:
        say(f"alarm: {act} disarm NOSPACE once the members have room")
    if dry_run:
        return before
    async with await connect(config) as client:
        if target > before.compacted_revision:
            req = CompactionRequest(revision=target, physical=True)
            await client.call("Compact", lambda t: client.kv.Compact(req, metadata=client.metadata, timeout=t))
    for m in before.members:
        await _defragment(config, m.endpoint)
        say(f"defragment: {m.endpoint} done")
    if before.nospace:
        await _disarm_nospace(config, say)
    after = await cluster_status(config)
    for m in after.members:
        say(f"now: {m.endpoint} db {m.db_size / MIB:.1f} MiB, in use {m.db_size_in_use / MIB:.1f} MiB")
    return after


# A member whose defragmented db still fills this much of its quota is full: a handful of writes would raise the
# alarm again, so disarming it only hides the problem for a moment.
FULL_RATIO = 0.95


async def _disarm_nospace(config: EtcdConfig, say: Callable[[str], None]) -> None:
    """Disarm each member's NOSPACE alarm (an alarm belongs to the member that raised it), unless a member is still
    full (``FULL_RATIO`` of its quota) after defragmentation."""
    now = await cluster_status(config)
    full = [m for m in now.members if m.db_size_quota and m.db_size >= FULL_RATIO * m.db_size_quota]
    if full:
        say("alarm: NOSPACE left raised: " + ", ".join(
            f"{m.endpoint} holds {m.db_size / MIB:.1f} MiB of live data, its quota is {m.db_size_quota / MIB:.0f} MiB"
            for m in full) + "; delete data or raise etcd's --quota-backend-bytes, then run maintain again")
        return
    async with await connect(config) as client:
        maintenance = _maintenance(client, "Maintenance.Alarm")
        for member_id in [m for m, name in now.alarms if name == "NOSPACE"]:
            await client.call("Maintenance.Alarm", functools.partial(_deactivate_nospace, maintenance, member_id))
    say("alarm: NOSPACE disarmed")


async def _deactivate_nospace(maintenance: MaintenanceService, member_id: int, timeout: float) -> AlarmResponse:
    return await maintenance.alarm_deactivate(AlarmType.NOSPACE, member_id=member_id, timeout=timeout)


async def _defragment(config: EtcdConfig, endpoint: str) -> None:
    # A defragmentation of a large db takes seconds: give it a deadline of its own.
    member = dataclasses.replace(_member_config(config, endpoint), call_timeout=max(config.call_timeout, 60.0),
                                 deadline=max(config.deadline, 60.0))
    async with await connect(member) as client:
        maintenance = _maintenance(client, "Maintenance.Defragment")
        await client.call("Maintenance.Defragment", lambda t: maintenance.defragment(timeout=t))


__all__ = ["DEFAULT_KEEP_REVISIONS", "MIB", "ClusterStatus", "MemberStatus", "SpaceStatus", "alarms", "backend_quota",
           "cluster_status", "compacted_revision", "maintain", "member_status", "space_status"]
