"""stream/receive/server.py's application served over TLS on 127.0.0.1 with a stand-in receiver
(no Kafka): a request without valid credentials is a 401 with the challenges, counted by reason,
and never reaches the receiver; valid Basic or bearer credentials reach it; a client that does not
trust the server's CA does not connect."""

from __future__ import annotations

import asyncio
import base64
import ssl
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from stream.receive.security import ReceiveSecurity, RefusalLog
from stream.receive.server import ReceiveMetrics, build_web_app
from stream.receive.service import Answer
from stream.settings import Settings
from tests.services.pki import Pki, make_pki

TOKEN = "a-bearer-token"
PASSWORD = "a password"


class StandInReceiver:
    """Takes every body (204) and keeps it, as the real one would send it to Kafka."""

    def __init__(self) -> None:
        self.bodies: list[bytes] = []

    async def receive(self, body: bytes) -> Answer:
        self.bodies.append(body)
        return Answer(204)


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("endpoint-pki"))


def served_security(pki: Pki, folder: Path) -> ReceiveSecurity:
    (folder / "password").write_text(PASSWORD + "\n")
    (folder / "token").write_text(TOKEN + "\n")
    settings = Settings(
        receive_tls_cert_file=str(pki.server_cert),
        receive_tls_key_file=str(pki.server_key),
        receive_basic_auth_username="prometheus",
        receive_basic_auth_password_file=str(folder / "password"),
        receive_bearer_token_file=str(folder / "token"),
    )
    return ReceiveSecurity.from_settings(settings)


async def exchange(
    security: ReceiveSecurity, trusted_ca: Path, requests: list[tuple[str, dict[str, str]]]
) -> tuple[list[tuple[int, list[str]]], StandInReceiver, ReceiveMetrics]:
    """Serve the application on a free loopback port, send each ``(method, headers)`` with a body,
    return each answer's status and challenges."""
    receiver = StandInReceiver()
    metrics = ReceiveMetrics()
    app = build_web_app(receiver, 1024 * 1024, security, metrics, RefusalLog())  # type: ignore[arg-type]
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=security.ssl_context())
    await site.start()
    port = runner.addresses[0][1]
    client_tls = ssl.create_default_context(cafile=str(trusted_ca))
    answers = []
    try:
        async with aiohttp.ClientSession() as session:
            for method, headers in requests:
                async with session.request(
                    method, f"https://127.0.0.1:{port}/api/v1/write", data=b"the body", headers=headers,
                    ssl=client_tls,
                ) as answer:  # fmt: skip
                    answers.append((answer.status, answer.headers.getall("WWW-Authenticate", [])))
    finally:
        await runner.cleanup()
    return answers, receiver, metrics


def counted(metrics: ReceiveMetrics, name: str, **labels: str) -> Any:
    return metrics.registry.get_sample_value(f"faultstream_receive_{name}_total", labels)


def test_refused_requests_are_401s_counted_by_reason_that_never_reach_the_receiver(
    pki: Pki, tmp_path: Path
) -> None:
    security = served_security(pki, tmp_path)
    good_basic = "Basic " + base64.b64encode(f"prometheus:{PASSWORD}".encode()).decode()
    bad_basic = "Basic " + base64.b64encode(b"prometheus:guess").decode()
    answers, receiver, metrics = asyncio.run(
        exchange(
            security,
            pki.ca,
            [
                ("POST", {}),
                ("POST", {"Authorization": f"Bearer {TOKEN}-not"}),
                ("POST", {"Authorization": bad_basic}),
                ("POST", {"Authorization": "Negotiate abc"}),
                ("POST", {"Authorization": f"Bearer {TOKEN}"}),
                ("POST", {"Authorization": good_basic}),
                ("GET", {"Authorization": f"Bearer {TOKEN}"}),  # authenticated, but not a write
            ],
        )
    )
    challenges = ['Basic realm="faultstream receive"', 'Bearer realm="faultstream receive"']
    assert answers == [(401, challenges)] * 4 + [(204, []), (204, []), (405, [])]
    assert receiver.bodies == [b"the body", b"the body"]  # the two authenticated writes only
    assert counted(metrics, "unauthorized", reason="no_credentials") == 1
    assert counted(metrics, "unauthorized", reason="wrong_credentials") == 2
    assert counted(metrics, "unauthorized", reason="unsupported_scheme") == 1
    assert counted(metrics, "requests", status="401") == 4
    assert counted(metrics, "requests", status="204") == 2
    assert counted(metrics, "requests", status="405") == 1


def test_a_client_that_does_not_trust_the_server_s_ca_does_not_connect(pki: Pki, tmp_path: Path) -> None:
    security = served_security(pki, tmp_path)
    with pytest.raises(aiohttp.ClientConnectorCertificateError):
        asyncio.run(exchange(security, pki.other_ca, [("POST", {"Authorization": f"Bearer {TOKEN}"})]))
