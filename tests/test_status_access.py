"""Who may read a secured coordinator's status page: real coordinators configured as in
production (mutual TLS, a principals file: ``test_grpc_security``'s certificates and tokens), their HTTP side over
loopback, plain HTTP on one and HTTPS (``--tls-http``) on the other.

``/status`` and ``/status.json`` need the reader role (a bearer token, Basic with the token as password, or over
HTTPS a client certificate the principals file maps) and a Host that is one of the coordinator's names (DNS
rebinding); ``/healthz``, ``/readyz`` and ``/metrics`` stay open to probes and Prometheus. Development mode is
checked in ``test_status_page`` (no credential, any Host)."""

from __future__ import annotations

import asyncio
import base64
import http.client
import json
import ssl
from pathlib import Path

import pytest

from meta.ops.etcd_server import EtcdCluster
from querycoord.cli import main
from tests import test_grpc_security as secured
from tests.certs import Issued
from tests.spawn import Processes, Spawned

pki = secured.pki  # the certificates and tokens of test_grpc_security (a module-scoped fixture)
HTTP = ("--http-listen", "127.0.0.1:0")
ALLOWED = "status.example"

Answer = tuple[int, http.client.HTTPMessage, str]


def _fetch(address: str, path: str, headers: dict[str, str], tls: ssl.SSLContext | None) -> Answer:
    host, port = address.rsplit(":", 1)
    conn = (http.client.HTTPSConnection(host, int(port), timeout=30, context=tls) if tls is not None
            else http.client.HTTPConnection(host, int(port), timeout=30))
    try:
        conn.request("GET", path, headers=headers)
        resp = conn.getresponse()
        return resp.status, resp.headers, resp.read().decode()
    finally:
        conn.close()


async def fetch(proc: Spawned, path: str, headers: dict[str, str] | None = None, *,
                tls: ssl.SSLContext | None = None) -> Answer:
    return await asyncio.to_thread(_fetch, proc.ready["http_address"], path, headers or {}, tls)


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def client_tls(pki: secured.Pki, cert: Issued | None) -> ssl.SSLContext:
    """A client that verifies the coordinator against the test CA and presents ``cert`` (or none)."""
    context = ssl.create_default_context(cafile=str(pki.ca.ca_file))
    if cert is not None:
        context.load_cert_chain(cert.cert, cert.key)
    return context


async def test_a_secured_coordinators_pages_need_the_reader_role_and_one_of_its_names(
        etcd: EtcdCluster, root_path: str, pki: secured.Pki, tmp_path: Path) -> None:
    config = secured.write_config(tmp_path / "coord.toml", etcd, pki, pki.coordinator)
    async with Processes(etcd, root_path, tmp_path) as procs:
        plain = await procs.coordinator("--config", str(config), *HTTP, "--http-allowed-hosts", ALLOWED,
                                        name="coord-plain")
        await plain.next_event("leader", timeout=60)
        port = plain.ready["http_address"].rsplit(":", 1)[1]
        reader, admin = pki.tokens["reader"], pki.tokens["admin"]

        # No credential: 401 with the challenges a browser and a script understand; nothing of the page.
        for path in ("/status.json", "/", "/status"):
            code, headers, body = await fetch(plain, path)
            assert code == 401, (path, code, body)
            assert any(c.startswith("Basic ") for c in headers.get_all("WWW-Authenticate") or []), headers
            assert "reader role" in body and plain.address not in body, body
        # The reader, by bearer token or by Basic with the token as password (a browser); admin may read too.
        code, headers, body = await fetch(plain, "/status.json", bearer(reader))
        assert code == 200 and headers["Content-Type"] == "application/json", body
        status = json.loads(body)
        assert status["errors"] == {} and status["leader"] == plain.address, status["errors"]
        assert [(c["address"], c["health"]) for c in status["coordinators"]] == [(plain.address, "SERVING")]
        basic = base64.b64encode(f"browser-user:{reader}".encode()).decode()
        code, headers, body = await fetch(plain, "/", {"Authorization": f"Basic {basic}"})
        assert code == 200 and headers["Content-Type"].startswith("text/html"), body[:200]
        assert (await fetch(plain, "/status.json", bearer(admin)))[0] == 200
        # An unknown token, a malformed Basic, a principal whose role may not read (a node).
        assert (await fetch(plain, "/status.json", bearer("not-a-known-token")))[0] == 401
        assert (await fetch(plain, "/status.json", {"Authorization": "Basic %%%"}))[0] == 401
        code, _, body = await fetch(plain, "/status.json", bearer(pki.tokens["node8"]))
        assert code == 403 and "may not read" in body, body

        # Host: a rebound name is refused even with the reader's token; the allowed names and addresses answer.
        code, _, body = await fetch(plain, "/status.json", {**bearer(reader), "Host": f"rebound.example:{port}"})
        assert code == 421 and "rebound.example" in body and plain.address not in body, body
        for host in (f"{ALLOWED}:{port}", f"localhost:{port}", f"127.0.0.1:{port}", f"[::1]:{port}", "LOCALHOST."):
            code, _, body = await fetch(plain, "/status.json", {**bearer(reader), "Host": host})
            assert code == 200, (host, code, body)

        # Probes and the scrape: no credential, any Host.
        for path in ("/healthz", "/readyz", "/metrics"):
            code, _, body = await fetch(plain, path, {"Host": "rebound.example"})
            assert code == 200, (path, code, body)
        code, _, text = await fetch(plain, "/metrics")
        assert 'querycoord_http_refused_total{reason="host"}' in text
        assert 'querycoord_http_refused_total{reason="unauthenticated"}' in text

        # HTTPS (--tls-http): the probes need no client certificate; a certificate mapped to a reading principal
        # (the coordinators') reads, one that names no principal is 401, a node's is 403; a token still works.
        tls = await procs.coordinator("--config", str(config), *HTTP, "--tls-http", name="coord-tls")
        assert (await fetch(tls, "/healthz", tls=client_tls(pki, None)))[0] == 200
        assert (await fetch(tls, "/metrics", tls=client_tls(pki, None)))[0] == 200
        code, _, body = await fetch(tls, "/status.json", tls=client_tls(pki, pki.coordinator))
        assert code == 200 and json.loads(body)["leader"] == plain.address, body
        code, _, body = await fetch(tls, "/status.json", tls=client_tls(pki, pki.user))
        assert code == 401 and "cli-user" in body, body
        code, _, body = await fetch(tls, "/status.json", tls=client_tls(pki, pki.stream_node))
        assert code == 403 and "may not read" in body, body
        assert (await fetch(tls, "/status.json", bearer(reader), tls=client_tls(pki, None)))[0] == 200
        assert (await fetch(tls, "/status.json", tls=client_tls(pki, None)))[0] == 401

    for proc in (plain, tls):
        log = secured.read_log(proc)
        assert "Traceback" not in log, log[-3000:]
        assert all(token not in log for token in pki.tokens.values())
    assert "takes credentials over plaintext HTTP" in secured.read_log(plain)


def test_http_security_settings_that_cannot_work_are_one_error_line(capsys: pytest.CaptureFixture[str]) -> None:
    for bad in ("status example.com", "a/b", "[::1]"):
        assert main(["config", "show", "--etcd-endpoints", "127.0.0.1:2379", "--http-allowed-hosts", bad]) == 2
        _, err = capsys.readouterr()
        assert err.count("\n") == 1 and "--http-allowed-hosts" in err and "Traceback" not in err, err
    # HTTPS serves the process's certificate: without one, coord refuses to start (before anything is bound).
    assert main(["coord", "--etcd-endpoints", "127.0.0.1:2379", "--tls-http"]) == 2
    _, err = capsys.readouterr()
    assert err.count("\n") == 1 and err.startswith("error: --tls-http needs --tls-ca, --tls-cert and --tls-key"), err
