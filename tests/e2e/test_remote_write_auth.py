"""TLS and authentication of ``faultstream receive`` with a real Prometheus (issue 41): Debian's
Prometheus 2.42 writes over TLS (``tls_config: {ca_file}``), one instance with ``basic_auth``
(``password_file``), another with a bearer ``authorization`` (``credentials_file``), to a receiver
configured with the settings that would let it listen beyond the loopback (a certificate, Basic and
bearer credentials from files; it listens on 127.0.0.1 here). Every sample each Prometheus stored
reaches the ECC topic; requests from Python without valid credentials are 401s with a challenge,
counted by reason on the receiver's /metrics, and their bodies never reach Kafka; no secret is in
the receiver's log.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import ssl
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import cramjam
import orjson
import pytest

from stream.inputs.parsers.remote_write import WriteRequest
from tests.services import kafka
from tests.services.pki import Pki, make_pki
from tests.services.prometheus import Service, start_prometheus
from tests.services.worker import ROOT, cli, free_port

pytestmark = [pytest.mark.e2e, pytest.mark.load_tolerant]

PASSWORD = "basic-secret-7c1e"
TOKEN = "bearer-secret-4d2f"
GPUS = 2
#: Each Prometheus scrapes a node of its own: what reached Kafka tells which one wrote it.
NODE_OF = {"basic": "basic0001", "bearer": "bearer0001"}


class Exporter:
    """A node's dcgm-exporter stand-in on a free port: two ECC counters per GPU that move."""

    def __init__(self, node: str) -> None:
        self.scrapes = 0
        exporter = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def do_GET(self) -> None:
                lines = []
                for gpu in range(GPUS):
                    labels = f'gpu="{gpu}",UUID="GPU-{node}-{gpu}",pci_bus_id="00000000:{7 + gpu:02X}:00.0",Hostname="{node}"'
                    lines += [
                        f"DCGM_FI_DEV_ECC_SBE_VOL_TOTAL{{{labels}}} {exporter.scrapes // 2}",
                        f"DCGM_FI_DEV_ECC_DBE_VOL_TOTAL{{{labels}}} 0",
                    ]
                exporter.scrapes += 1
                body = ("\n".join(lines) + "\n").encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.end_headers()
                self.wfile.write(body)

        self.port = free_port()
        self.server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def stop(self) -> None:
        self.server.shutdown()


def prometheus_config(exporter: Exporter, receive_url: str, pki: Pki, credentials: dict[str, Any]) -> dict:
    return {
        "global": {"scrape_interval": "1s", "scrape_timeout": "900ms"},
        "scrape_configs": [
            {"job_name": "dcgm", "static_configs": [{"targets": [f"127.0.0.1:{exporter.port}"]}]}
        ],
        "remote_write": [
            {
                "url": receive_url,
                "tls_config": {"ca_file": str(pki.ca)},
                **credentials,
                "queue_config": {"batch_send_deadline": "1s"},
            }
        ],
    }


def stored_samples(prometheus: Service, node: str) -> set[tuple[int, int]]:
    """``(gpu, ts ms)`` of every scrape of the node's ECC counter Prometheus stored."""
    query = urllib.parse.urlencode({"query": f'DCGM_FI_DEV_ECC_SBE_VOL_TOTAL{{Hostname="{node}"}}[10m]'})
    with urllib.request.urlopen(f"{prometheus.url}/api/v1/query?{query}", timeout=10) as answer:
        found = json.load(answer)["data"]["result"]
    return {
        (int(series["metric"]["gpu"]), round(float(ts) * 1000))
        for series in found
        for ts, _ in series["values"]
    }


def write_body(node: str) -> bytes:
    """A valid remote_write body with one ECC value of ``node``."""
    request = WriteRequest()
    series = request.timeseries.add()
    for name, value in sorted(
        {"__name__": "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "gpu": "0", "Hostname": node}.items()
    ):
        series.labels.add(name=name, value=value)
    series.samples.add(value=5, timestamp=int(time.time() * 1000))
    return bytes(cramjam.snappy.compress_raw(request.SerializeToString()))


def post(url: str, context: ssl.SSLContext, data: bytes, headers: dict[str, str]) -> tuple[int, list[str]]:
    """POST as Prometheus does; the status and the WWW-Authenticate challenges of the answer."""
    request = urllib.request.Request(
        url,
        data=data,
        method="POST",
        headers={"Content-Encoding": "snappy", "Content-Type": "application/x-protobuf", **headers},
    )
    try:
        with urllib.request.urlopen(request, timeout=30, context=context) as answer:
            return answer.status, answer.headers.get_all("WWW-Authenticate") or []
    except urllib.error.HTTPError as error:
        return error.code, error.headers.get_all("WWW-Authenticate") or []


def metric(port: int, name: str, **labels: str) -> float:
    """One sample of the receiver's /metrics."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as answer:
        text = answer.read().decode()
    wanted = name + ("{" + ",".join(f'{k}="{v}"' for k, v in labels.items()) + "}" if labels else "")
    for line in text.splitlines():
        if line.startswith(wanted + " "):
            return float(line.split()[-1])
    raise AssertionError(f"{wanted} is not in the receiver's metrics:\n{text}")


@pytest.fixture
def deployment(bootstrap: str, tmp_path: Path) -> Iterator[dict[str, str]]:
    env = kafka.deployment_env(
        bootstrap, f"rwauth{uuid.uuid4().hex[:6]}", 1, FAULTSTREAM_DATA_DIR=str(tmp_path / "d"),
        FAULTSTREAM_RECEIVE_SETTLE_SECONDS="3",
    )  # fmt: skip
    cli(env, "init-kafka")
    yield env
    kafka.delete_deployment_topics(env)


def test_prometheus_writes_over_tls_with_basic_auth_and_with_a_bearer_token_and_others_get_401s(
    deployment: dict[str, str], tmp_path: Path
) -> None:
    pki = make_pki(tmp_path / "pki")
    secrets = tmp_path / "secrets"
    secrets.mkdir()
    (secrets / "password").write_text(PASSWORD + "\n")
    (secrets / "token").write_text(TOKEN + "\n")
    port, metrics_port = free_port(), free_port()
    # The settings that let the receiver listen beyond the loopback (it stays on 127.0.0.1 here).
    env = {
        **deployment,
        "FAULTSTREAM_RECEIVE_TLS_CERT_FILE": str(pki.server_cert),
        "FAULTSTREAM_RECEIVE_TLS_KEY_FILE": str(pki.server_key),
        "FAULTSTREAM_RECEIVE_BASIC_AUTH_USERNAME": "prometheus",
        "FAULTSTREAM_RECEIVE_BASIC_AUTH_PASSWORD_FILE": str(secrets / "password"),
        "FAULTSTREAM_RECEIVE_BEARER_TOKEN_FILE": str(secrets / "token"),
        "FAULTSTREAM_RECEIVE_METRICS_PORT": str(metrics_port),
    }
    log_path = tmp_path / "receive.log"
    receiver = subprocess.Popen(
        [sys.executable, "-m", "stream.cli", "receive", "--listen", f"127.0.0.1:{port}"],
        env={**os.environ, **env}, cwd=ROOT, stdout=log_path.open("w"), stderr=subprocess.STDOUT,
    )  # fmt: skip
    url = f"https://127.0.0.1:{port}/api/v1/write"
    exporters = {method: Exporter(node) for method, node in NODE_OF.items()}
    prometheuses: dict[str, Service] = {}
    stored: dict[str, set[tuple[int, int]]] = {}
    try:
        deadline = time.monotonic() + 60
        while f"receiving Prometheus remote_write on {url}" not in log_path.read_text():
            assert receiver.poll() is None and time.monotonic() < deadline, log_path.read_text()
            time.sleep(0.2)
        credentials = {
            "basic": {"basic_auth": {"username": "prometheus", "password_file": str(secrets / "password")}},
            "bearer": {"authorization": {"type": "Bearer", "credentials_file": str(secrets / "token")}},
        }
        for method, exporter in exporters.items():
            config = prometheus_config(exporter, url, pki, credentials[method])
            prometheuses[method] = start_prometheus(tmp_path / f"prometheus-{method}", config)

        # Meanwhile, from Python: no credentials, wrong ones, another scheme; each a valid body.
        client = ssl.create_default_context(cafile=str(pki.ca))
        wrong_basic = "Basic " + base64.b64encode(b"prometheus:guess").decode()
        refused = [
            post(url, client, write_body("intruder0001"), headers)
            for headers in (
                {},
                {"Authorization": wrong_basic},
                {"Authorization": f"Bearer {TOKEN}x"},
                {"Authorization": f"Token {TOKEN}"},
            )
        ]
        challenges = ['Basic realm="faultstream receive"', 'Bearer realm="faultstream receive"']
        assert refused == [(401, challenges)] * 4
        untrusting = ssl.create_default_context(cafile=str(pki.other_ca))
        with pytest.raises(urllib.error.URLError, match="CERTIFICATE_VERIFY_FAILED"):
            post(url, untrusting, write_body("intruder0001"), {"Authorization": f"Bearer {TOKEN}"})

        while min(exporter.scrapes for exporter in exporters.values()) < 12:
            assert receiver.poll() is None, log_path.read_text()
            time.sleep(0.5)
        for exporter in exporters.values():
            exporter.stop()
        time.sleep(7)  # the last batches sent (1 s deadline), the last samples settled (3 s)
        for method, prometheus in prometheuses.items():
            stored[method] = stored_samples(prometheus, NODE_OF[method])
            assert len(stored[method]) >= 12 * GPUS, method
            log = prometheus.log()  # no refusal (HTTP status 401) nor certificate error (x509)
            assert "HTTP status" not in log and "x509" not in log, log[-3000:]

        # Counted: the four refusals from Python, none from Prometheus (its requests all passed).
        counted = {
            reason: metric(metrics_port, "faultstream_receive_unauthorized_total", reason=reason)
            for reason in ("no_credentials", "wrong_credentials", "unsupported_scheme")
        }
        assert counted == {"no_credentials": 1, "wrong_credentials": 2, "unsupported_scheme": 1}
        assert metric(metrics_port, "faultstream_receive_requests_total", status="401") == 4
        assert metric(metrics_port, "faultstream_receive_requests_total", status="204") >= 2
    finally:
        for prometheus in prometheuses.values():
            prometheus.stop()
        for exporter in exporters.values():
            exporter.stop()
        receiver.terminate()
        receiver.wait(timeout=30)
    log = log_path.read_text()
    assert "Traceback" not in log, log[-3000:]
    # The first refusal told at once, the three after it (within the log's minute) at the stop.
    assert "answered 401 to 1 request without valid credentials (no_credentials 1;" in log, log[-3000:]
    assert (
        "answered 401 to 3 requests without valid credentials (unsupported_scheme 1, wrong_credentials 2;"
        in log
    )
    assert PASSWORD not in log and TOKEN not in log

    bootstrap, topic = deployment["FAULTSTREAM_KAFKA_BOOTSTRAP"], deployment["FAULTSTREAM_TOPIC_ECC"]
    _, ends = asyncio.run(kafka.consume(bootstrap, topic, 1, 0, 15))
    messages, _ = asyncio.run(kafka.consume(bootstrap, topic, 1, sum(ends.values()), 60))
    samples = [orjson.loads(message.value) for message in messages]
    assert not [s for s in samples if s["node"] == "intruder0001"]  # refused bodies never reach Kafka
    for method, node in NODE_OF.items():
        received = {(s["gpu"], s["ts"]) for s in samples if s["node"] == node}
        assert received == stored[method], method
