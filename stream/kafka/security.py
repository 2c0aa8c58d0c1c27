"""How every Kafka client of faultstream authenticates: one place from settings to client options.

``init-kafka``, ``replay --to``, ``tail``, the worker's checkpoint and progress clients and the Faust
app itself all take their security from :func:`client_options` (aiokafka keyword arguments) or from
:class:`KafkaSecurity` (the Faust worker turns it into ``broker_credentials``), so a setting means
the same everywhere.

Protocols (``FAULTSTREAM_KAFKA_SECURITY_PROTOCOL``):

- ``PLAINTEXT``: no TLS, no authentication (the default, for a laptop or a closed network);
- ``SSL``: TLS; with a client certificate and key, the broker can authenticate the client by it;
- ``SASL_SSL``: TLS plus a SASL login (SCRAM-SHA-512 by default);
- ``SASL_PLAINTEXT``: a SASL login without TLS (the password of PLAIN travels in the clear).

:func:`check_kafka` opens one connection the way the clients will, so a command fails within
seconds with one line naming the cause (wrong password, untrusted certificate, no broker) instead
of retrying silently — aiokafka logs such failures and raises "Unable to bootstrap", and Faust
retries for ever.
"""

from __future__ import annotations

import asyncio
import socket
import ssl
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from stream.settings import Settings, SettingsError

__all__ = [
    "MECHANISMS",
    "PROTOCOLS",
    "KafkaAccessError",
    "KafkaSecurity",
    "check_kafka",
    "client_options",
]

PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
MECHANISMS = ("SCRAM-SHA-512", "SCRAM-SHA-256", "PLAIN")


class KafkaAccessError(Exception):
    """Kafka cannot be reached or refuses us; the message is one line naming the cause.

    ``transient``: nothing answered (no server listening, no answer in time, a name that cannot be
    resolved for now), as while a broker is down or starting; a command may wait and try again
    (:func:`stream.kafka.reachable.wait_for_kafka`). False when an answer refused us (login,
    certificate, protocol) or the address cannot be right (not HOST:PORT, an unknown host name):
    trying again cannot help.
    """

    def __init__(self, message: str, *, transient: bool = False) -> None:
        super().__init__(message)
        self.transient = transient


@dataclass(frozen=True, slots=True)
class KafkaSecurity:
    """The resolved security of the Kafka clients: protocol, SASL login and TLS files.

    Built by :meth:`from_settings`, which validates the combination and reads the password file;
    the password never appears in ``repr`` (nor in any message of this module).
    """

    protocol: str = "PLAINTEXT"
    mechanism: str = "SCRAM-SHA-512"
    username: str = ""
    password: str = field(default="", repr=False)
    cafile: str = ""
    certfile: str = ""
    keyfile: str = ""
    key_password: str = field(default="", repr=False)

    @property
    def uses_tls(self) -> bool:
        """Whether connections are TLS (``SSL`` or ``SASL_SSL``)."""
        return self.protocol in ("SSL", "SASL_SSL")

    @property
    def uses_sasl(self) -> bool:
        """Whether connections log in with SASL."""
        return self.protocol.startswith("SASL_")

    @classmethod
    def from_settings(cls, settings: Settings) -> KafkaSecurity:
        """Validate the ``kafka_*`` security settings and resolve the password.

        Parameters
        ----------
        settings
            The settings; ``kafka_sasl_password_file`` is read here (its content, stripped of the
            trailing newline, is the password) when ``kafka_sasl_password`` is empty.

        Returns
        -------
        KafkaSecurity
            The security every client uses.

        Raises
        ------
        SettingsError
            With the variable to fix: an unknown protocol or mechanism, a SASL protocol without
            a user or password, TLS files that do not exist, a key without its certificate.
        """
        protocol = settings.kafka_security_protocol.strip().upper()
        if protocol not in PROTOCOLS:
            raise SettingsError(
                f"FAULTSTREAM_KAFKA_SECURITY_PROTOCOL={settings.kafka_security_protocol!r}: "
                f"expected one of {', '.join(PROTOCOLS)}"
            )
        mechanism = settings.kafka_sasl_mechanism.strip().upper()
        if mechanism not in MECHANISMS:
            raise SettingsError(
                f"FAULTSTREAM_KAFKA_SASL_MECHANISM={settings.kafka_sasl_mechanism!r}: "
                f"expected one of {', '.join(MECHANISMS)}"
            )
        password = settings.kafka_sasl_password
        if not password and settings.kafka_sasl_password_file:
            path = Path(settings.kafka_sasl_password_file)
            try:
                password = path.read_text().rstrip("\r\n")
            except OSError as exc:
                raise SettingsError(
                    f"FAULTSTREAM_KAFKA_SASL_PASSWORD_FILE: cannot read {path} ({exc.strerror})"
                ) from None
        security = cls(
            protocol=protocol,
            mechanism=mechanism,
            username=settings.kafka_sasl_username,
            password=password,
            cafile=settings.kafka_ssl_cafile,
            certfile=settings.kafka_ssl_certfile,
            keyfile=settings.kafka_ssl_keyfile,
            key_password=settings.kafka_ssl_key_password,
        )
        security._validate()
        return security

    def _validate(self) -> None:
        if self.uses_sasl and not self.username:
            raise SettingsError(
                f"FAULTSTREAM_KAFKA_SECURITY_PROTOCOL={self.protocol} needs FAULTSTREAM_KAFKA_SASL_USERNAME"
            )
        if self.uses_sasl and not self.password:
            raise SettingsError(
                f"FAULTSTREAM_KAFKA_SECURITY_PROTOCOL={self.protocol} needs a password: "
                "FAULTSTREAM_KAFKA_SASL_PASSWORD or FAULTSTREAM_KAFKA_SASL_PASSWORD_FILE"
            )
        files = {
            "FAULTSTREAM_KAFKA_SSL_CAFILE": self.cafile,
            "FAULTSTREAM_KAFKA_SSL_CERTFILE": self.certfile,
            "FAULTSTREAM_KAFKA_SSL_KEYFILE": self.keyfile,
        }
        given = [name for name, path in files.items() if path]
        if given and not self.uses_tls:
            raise SettingsError(
                f"{given[0]} is set but FAULTSTREAM_KAFKA_SECURITY_PROTOCOL={self.protocol} does not use "
                "TLS: set it to SSL or SASL_SSL"
            )
        for name, path in files.items():
            if path and not Path(path).is_file():
                raise SettingsError(f"{name}={path}: no such file")
        if self.keyfile and not self.certfile:
            raise SettingsError("FAULTSTREAM_KAFKA_SSL_KEYFILE is set without FAULTSTREAM_KAFKA_SSL_CERTFILE")

    def ssl_context(self) -> ssl.SSLContext | None:
        """The TLS context of the clients, or None without TLS.

        It verifies the broker's certificate and host name against ``cafile`` (the system's
        trusted CAs when empty) and presents the client certificate when one is configured.

        Raises
        ------
        SettingsError
            When a file is not a certificate or key, or the key does not match the certificate
            (or its password is wrong).
        """
        if not self.uses_tls:
            return None
        try:
            context = ssl.create_default_context(cafile=self.cafile or None)
        except ssl.SSLError as exc:
            raise SettingsError(
                f"FAULTSTREAM_KAFKA_SSL_CAFILE={self.cafile}: not a PEM CA certificate ({exc.reason or exc})"
            ) from None
        if self.certfile:
            try:
                context.load_cert_chain(
                    self.certfile, self.keyfile or None, password=self.key_password or None
                )
            except ssl.SSLError as exc:
                raise SettingsError(
                    f"FAULTSTREAM_KAFKA_SSL_CERTFILE={self.certfile} / FAULTSTREAM_KAFKA_SSL_KEYFILE="
                    f"{self.keyfile or '(in the certificate file)'}: cannot load the client certificate "
                    f"and key ({exc.reason or exc})"
                ) from None
        return context

    def describe(self) -> str:
        """How we connect, for messages: ``SASL_SSL (SCRAM-SHA-512 as user faultstream)``."""
        if self.uses_sasl:
            return f"{self.protocol} ({self.mechanism} as user {self.username})"
        if self.certfile:
            return f"{self.protocol} (client certificate {Path(self.certfile).name})"
        return self.protocol


def client_options(settings: Settings, security: KafkaSecurity | None = None) -> dict[str, Any]:
    """The keyword arguments every aiokafka client (producer, consumer, admin) gets: bootstrap
    servers and security.

    Parameters
    ----------
    settings
        The settings (``kafka_bootstrap`` and the ``kafka_*`` security settings).
    security
        Already resolved security, to share one TLS context; by default resolved from ``settings``.

    Returns
    -------
    dict
        ``bootstrap_servers``, ``security_protocol`` and, as needed, ``ssl_context`` and the SASL
        mechanism, user and password.
    """
    security = security or KafkaSecurity.from_settings(settings)
    options: dict[str, Any] = {
        "bootstrap_servers": settings.kafka_bootstrap,
        **_security_options(security),
    }
    return options


def _security_options(security: KafkaSecurity) -> dict[str, Any]:
    options: dict[str, Any] = {"security_protocol": security.protocol}
    context = security.ssl_context()
    if context is not None:
        options["ssl_context"] = context
    if security.uses_sasl:
        options.update(
            sasl_mechanism=security.mechanism,
            sasl_plain_username=security.username,
            sasl_plain_password=security.password,
        )
    return options


def _first_line(text: str) -> str:
    return " ".join(text.split()) or "no reason given"


async def check_kafka(settings: Settings, timeout_s: float = 15.0) -> KafkaSecurity:
    """Open one connection to a bootstrap server the way the clients will (TLS handshake, SASL
    login), then close it.

    Parameters
    ----------
    settings
        The settings.
    timeout_s
        How long each bootstrap server gets.

    Returns
    -------
    KafkaSecurity
        The security that worked.

    Raises
    ------
    KafkaAccessError
        One line: which servers, how we connected, and why it failed — the broker refused the
        login, its certificate is not trusted, it closed the connection (a TLS listener reached
        without TLS, a missing client certificate), or nothing answered in time.
    SettingsError
        When the security settings themselves are wrong.
    """
    # Imported here: the command line imports this module for KafkaAccessError, and aiokafka is
    # heavy for `faultstream --help`.
    from aiokafka.conn import create_conn
    from aiokafka.errors import KafkaError

    security = KafkaSecurity.from_settings(settings)
    options = _security_options(security)
    reasons = []
    transient = True  # until an answer refuses us, or an address cannot be right
    for server in (part.strip() for part in settings.kafka_bootstrap.split(",")):
        if not server:
            continue
        host, _, port = server.rpartition(":")
        if not host or not port.isdigit():
            raise SettingsError(f"FAULTSTREAM_KAFKA_BOOTSTRAP: {server!r} is not HOST:PORT")
        try:
            conn = await asyncio.wait_for(
                create_conn(host, int(port), request_timeout_ms=int(timeout_s * 1000), **options),
                timeout_s,
            )
        except TimeoutError:
            reasons.append(f"{server}: no answer within {timeout_s:.0f} s")
        except ssl.SSLCertVerificationError as exc:
            transient = False
            reasons.append(
                f"{server}: the broker's certificate is not trusted ({exc.verify_message}; "
                "check FAULTSTREAM_KAFKA_SSL_CAFILE)"
            )
        except ssl.SSLError as exc:
            transient = False
            reasons.append(f"{server}: TLS failed ({_first_line(exc.reason or str(exc))})")
        except KafkaError as exc:
            transient = False
            reasons.append(f"{server}: {_explain(exc, security)}")
        except socket.gaierror as exc:
            # A name that does not resolve now (EAI_AGAIN) may later; an unknown one is a typo.
            transient = transient and exc.errno == socket.EAI_AGAIN
            reasons.append(f"{server}: {_first_line(exc.strerror or str(exc))} (the host name)")
        except ConnectionResetError:
            transient = False
            # A TLS hello to a plaintext listener: the broker drops the connection without a word.
            hint = "is it a TLS listener?" if security.uses_tls else "is it a TLS or SASL listener?"
            reasons.append(
                f"{server}: the broker reset the connection ({hint} "
                "check FAULTSTREAM_KAFKA_SECURITY_PROTOCOL)"
            )
        except OSError as exc:
            reasons.append(f"{server}: {_first_line(exc.strerror or str(exc) or type(exc).__name__)}")
        else:
            conn.close()
            return security
    raise KafkaAccessError(
        f"cannot use Kafka over {security.describe()}: {'; '.join(reasons)}", transient=transient
    )


def _explain(exc: Exception, security: KafkaSecurity) -> str:
    name = type(exc).__name__
    # aiokafka's str() is "[Error 58] SaslAuthenticationFailed: <the broker's message>": keep the message.
    text = _first_line(str(exc.args[0]) if exc.args else str(exc))
    if name.startswith("SaslAuthenticationFailed"):
        return f"the broker refused the login of user {security.username!r} ({text})"
    if name.startswith("UnsupportedSaslMechanism"):
        return f"{text} (set FAULTSTREAM_KAFKA_SASL_MECHANISM)"
    if name == "KafkaConnectionError" and "closed" in text.lower():
        hint = (
            f"does the listener speak {security.protocol}? does it require a client certificate?"
            if security.uses_tls
            else "is it a TLS or SASL listener? set FAULTSTREAM_KAFKA_SECURITY_PROTOCOL"
        )
        return f"the broker closed the connection ({hint})"
    return f"{name}: {text}"
