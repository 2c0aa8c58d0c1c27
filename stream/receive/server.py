"""The HTTP side of ``faultstream receive``: ``POST /api/v1/write`` (Prometheus remote_write v1).

The endpoint answers 204 once a request's values are safe in Kafka, 400 with the reason for a
body that is not a snappy ``WriteRequest``, 413 for a body past ``receive_max_body_bytes``, and
503 when Kafka did not take the values (Prometheus sends the request again). It listens on the
loopback only: it has no TLS nor authentication of its own yet, so a non-loopback address is
refused at start (put a TLS proxy that authenticates Prometheus in front of it).
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import signal

from aiohttp import web
from aiokafka import AIOKafkaProducer
from aiokafka.errors import KafkaError

from stream.inputs.ecc_assembly import EccAssembly
from stream.kafka.security import client_options
from stream.receive.service import Receiver
from stream.settings import Settings, SettingsError

__all__ = ["listen_address", "run_receiver"]

_log = logging.getLogger("faultstream.receive")

#: How often gatherings that have settled are sent out.
_SETTLE_EVERY_SECONDS = 0.5


def listen_address(text: str) -> tuple[str, int]:
    """``HOST:PORT`` of ``--listen``, on the loopback only.

    >>> listen_address("127.0.0.1:9201"), listen_address("[::1]:9201"), listen_address("localhost:80")
    (('127.0.0.1', 9201), ('::1', 9201), ('localhost', 80))
    >>> listen_address("0.0.0.0:9201")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    stream.settings.SettingsError: receive: 0.0.0.0 is not a loopback address: ...
    """
    host, sep, port = text.rpartition(":")
    host = host.strip("[]")
    if not sep or not port.isdigit() or not host:
        raise SettingsError(f"receive: {text!r} is not HOST:PORT")
    loopback = host == "localhost"
    if not loopback:
        try:
            loopback = ipaddress.ip_address(host).is_loopback
        except ValueError:
            loopback = False
    if not loopback:
        raise SettingsError(
            f"receive: {host} is not a loopback address: the endpoint has no TLS nor authentication of its "
            "own yet; listen on 127.0.0.1 and put a TLS proxy that authenticates Prometheus in front of it"
        )
    return host, int(port)


def build_web_app(receiver: Receiver, max_body: int) -> web.Application:
    """The aiohttp application of the endpoint."""

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

    app = web.Application(client_max_size=max_body)
    app.router.add_post("/api/v1/write", write)
    return app


async def serve(settings: Settings, host: str, port: int) -> None:
    """Run until SIGTERM or SIGINT."""
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
        runner = web.AppRunner(build_web_app(receiver, settings.receive_max_body_bytes), access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, host, port)
        await site.start()
        _log.warning("receiving Prometheus remote_write on http://%s:%d/api/v1/write", host, port)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        while not stop.is_set() and not receiver.failed.is_set():
            try:
                await asyncio.wait_for(stop.wait(), timeout=_SETTLE_EVERY_SECONDS)
            except TimeoutError:
                await receiver.settle()
        await runner.cleanup()
        await receiver.drain()
        if receiver.failed.is_set():
            raise SystemExit(1)
    finally:
        await producer.stop()


def run_receiver(settings: Settings, listen: str) -> None:
    """``faultstream receive``: serve until stopped."""
    host, port = listen_address(listen)
    logging.getLogger("faultstream").setLevel(logging.INFO)
    asyncio.run(serve(settings, host, port))
