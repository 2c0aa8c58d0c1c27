"""The HTTP side of ``faultstream receive``: ``POST /api/v1/write`` (Prometheus remote_write v1).

The endpoint answers 204 once a request's values are safe in Kafka, 400 with the reason for a
body that is not a snappy ``WriteRequest``, 413 for a body past ``receive_max_body_bytes``, and
503 when Kafka did not take the values (Prometheus sends the request again). With authentication
configured, a request without valid credentials is a 401 with a ``WWW-Authenticate`` challenge,
answered before its body is read (:mod:`stream.receive.security`: TLS, credentials, and the rule
that keeps the endpoint on the loopback unless both TLS and authentication are configured).

Metrics (``receive_metrics_port`` on ``metrics_host``): ``faultstream_receive_requests_total{status}``
and ``faultstream_receive_unauthorized_total{reason}``.
"""

from __future__ import annotations

import asyncio
import logging
import signal
from collections.abc import Awaitable, Callable

from aiohttp import web
from aiokafka import AIOKafkaProducer
from aiokafka.errors import KafkaError
from multidict import CIMultiDict
from prometheus_client import CollectorRegistry, Counter, start_http_server

from stream.inputs.ecc_assembly import EccAssembly
from stream.kafka.security import client_options
from stream.receive.security import REFUSAL_REASONS, ReceiveSecurity, RefusalLog
from stream.receive.service import Receiver
from stream.settings import Settings

__all__ = ["ReceiveMetrics", "build_web_app", "run_receiver"]

_log = logging.getLogger("faultstream.receive")

#: How often gatherings that have settled are sent out.
_SETTLE_EVERY_SECONDS = 0.5


class ReceiveMetrics:
    """The receiver's Prometheus metrics (its own registry, served on ``receive_metrics_port``)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter(
            "faultstream_receive_requests",
            "Requests answered, by HTTP status (204 taken, 400 not a WriteRequest, 401 refused, "
            "413 too large, 503 Kafka did not take them).",
            ["status"],
            registry=self.registry,
        )
        self.unauthorized = Counter(
            "faultstream_receive_unauthorized",
            "Requests refused with a 401 (their body not read), by reason: no_credentials, "
            "unsupported_scheme, wrong_credentials.",
            ["reason"],
            registry=self.registry,
        )
        for reason in REFUSAL_REASONS:  # every reason shows from the start, at 0
            self.unauthorized.labels(reason)


_Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def build_web_app(
    receiver: Receiver,
    max_body: int,
    security: ReceiveSecurity | None = None,
    metrics: ReceiveMetrics | None = None,
    refusal_log: RefusalLog | None = None,
) -> web.Application:
    """The aiohttp application of the endpoint."""
    security = security or ReceiveSecurity()
    metrics = metrics or ReceiveMetrics()
    refusal_log = refusal_log or RefusalLog()
    challenges = CIMultiDict(("WWW-Authenticate", challenge) for challenge in security.challenges())

    @web.middleware
    async def authenticate(request: web.Request, handler: _Handler) -> web.StreamResponse:
        # Before any handler: a refused request's body is never read, let alone sent to Kafka.
        reason = security.refusal(request.headers.get("Authorization"))
        if reason is not None:
            metrics.unauthorized.labels(reason).inc()
            refusal_log.refused(reason, request.remote or "")
            response: web.StreamResponse = web.Response(
                status=401, text="valid credentials are needed", headers=challenges
            )
        else:
            try:
                response = await handler(request)
            except web.HTTPException as exc:  # the router's 404 and 405
                metrics.requests.labels(str(exc.status)).inc()
                raise
        metrics.requests.labels(str(response.status)).inc()
        return response

    async def write(request: web.Request) -> web.Response:
        if request.content_length is not None and request.content_length > max_body:
            return web.Response(status=413, text=f"the body is over {max_body:,} bytes")
        try:
            body = await request.read()
        except web.HTTPRequestEntityTooLarge:
            return web.Response(status=413, text=f"the body is over {max_body:,} bytes")
        try:
            answer = await receiver.receive(body)
        except KafkaError as exc:
            _log.warning(
                "Kafka did not take a request's values (%r): answered 503, Prometheus sends it again", exc
            )
            return web.Response(status=503, text="Kafka did not take the values; send them again")
        return web.Response(status=answer.status, text=answer.reason or None)

    app = web.Application(client_max_size=max_body, middlewares=[authenticate])
    app.router.add_post("/api/v1/write", write)
    return app


async def serve(settings: Settings, host: str, port: int, security: ReceiveSecurity) -> None:
    """Run until SIGTERM or SIGINT."""
    metrics = ReceiveMetrics()
    if settings.receive_metrics_port:
        start_http_server(
            settings.receive_metrics_port, addr=settings.metrics_host, registry=metrics.registry
        )
        _log.info(
            "receive: metrics on http://%s:%d/metrics", settings.metrics_host, settings.receive_metrics_port
        )
    options = client_options(settings)
    producer = AIOKafkaProducer(acks="all", linger_ms=5, max_request_size=8 * 1024 * 1024, **options)
    await producer.start()
    try:
        receiver = Receiver(
            settings, producer, EccAssembly(settings.cluster, settings.receive_settle_seconds)
        )
        taken = await receiver.restore(options)
        if taken:
            _log.warning("took up %d saved requests of samples not sent before the last stop", taken)
        refusal_log = RefusalLog()
        app = build_web_app(receiver, settings.receive_max_body_bytes, security, metrics, refusal_log)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, host, port, ssl_context=security.ssl_context())
        await site.start()
        scheme = "https" if security.uses_tls else "http"
        shown_host = f"[{host}]" if ":" in host else host
        _log.warning(
            "receiving Prometheus remote_write on %s://%s:%d/api/v1/write (%s)",
            scheme, shown_host, port, security.describe(),
        )  # fmt: skip
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        while not stop.is_set() and not receiver.failed.is_set():
            try:
                await asyncio.wait_for(stop.wait(), timeout=_SETTLE_EVERY_SECONDS)
            except TimeoutError:
                await receiver.settle()
                refusal_log.flush()  # refusals held back by the log's interval
        await runner.cleanup()
        refusal_log.flush(stopping=True)
        await receiver.drain()
        if receiver.failed.is_set():
            raise SystemExit(1)
    finally:
        await producer.stop()


def run_receiver(settings: Settings, host: str, port: int, security: ReceiveSecurity) -> None:
    """``faultstream receive``: serve until stopped (``host``, ``port`` and ``security`` checked by
    :func:`stream.receive.security.listen_address` and :meth:`ReceiveSecurity.from_settings`)."""
    logging.getLogger("faultstream").setLevel(logging.INFO)
    asyncio.run(serve(settings, host, port, security))
