"""Who may write to ``faultstream receive``: TLS, HTTP authentication and the listen rule.

The endpoint takes authentication as Prometheus' ``remote_write`` sends it:

- ``basic_auth: {username, password_file}``: ``Authorization: Basic base64(user:password)``;
- ``authorization: {type: Bearer, credentials_file}``: ``Authorization: Bearer <token>``.

The password and the token are read from files (mounted secrets), stripped of surrounding
whitespace as Prometheus strips its own ``password_file`` and ``credentials_file``; they are
compared in constant time and never appear in a ``repr`` or a message. Both methods may be
configured at once (a request passes with either), which lets a site move from one to the other.

A request without valid credentials is answered 401 with a ``WWW-Authenticate`` challenge before
its body is read (:mod:`stream.receive.server`), counted by reason (:data:`REFUSAL_REASONS`) and
logged at most every :attr:`RefusalLog.every_seconds`.

The listen rule (:func:`listen_address`): the loopback needs nothing; any other address is refused
unless both TLS and an authentication method are configured, so the endpoint is never open
beyond the host by default.
"""

from __future__ import annotations

import base64
import binascii
import hmac
import ipaddress
import logging
import ssl
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from stream.settings import Settings, SettingsError

__all__ = [
    "REFUSAL_REASONS",
    "ReceiveSecurity",
    "RefusalLog",
    "basic_credentials",
    "is_loopback",
    "listen_address",
    "split_authorization",
]

_log = logging.getLogger("faultstream.receive")

#: The realm named in the ``WWW-Authenticate`` challenges.
REALM = "faultstream receive"
#: Why a request was refused (the ``reason`` label of the refusal counter):
#: no ``Authorization`` header; a scheme that is not a configured method (or a header that is not
#: ``<scheme> <credentials>``); credentials of a configured method that do not match.
REFUSAL_REASONS = ("no_credentials", "unsupported_scheme", "wrong_credentials")

_TLS_CERT = "FAULTSTREAM_RECEIVE_TLS_CERT_FILE"
_TLS_KEY = "FAULTSTREAM_RECEIVE_TLS_KEY_FILE"
_BASIC_USER = "FAULTSTREAM_RECEIVE_BASIC_AUTH_USERNAME"
_BASIC_PASSWORD = "FAULTSTREAM_RECEIVE_BASIC_AUTH_PASSWORD_FILE"
_BEARER = "FAULTSTREAM_RECEIVE_BEARER_TOKEN_FILE"


def split_authorization(header: str | None) -> tuple[str, str] | None:
    """An ``Authorization`` header as ``(scheme in lower case, credentials)``; None when there is
    none or it is not ``<scheme> <credentials>`` (the scheme is case-insensitive: RFC 9110).

    >>> split_authorization("Basic dTpw"), split_authorization("bearer  abc "), split_authorization("Bearer")
    (('basic', 'dTpw'), ('bearer', 'abc'), None)
    """
    if not header:
        return None
    scheme, _, credentials = header.strip().partition(" ")
    credentials = credentials.strip()
    if not scheme or not credentials:
        return None
    return scheme.lower(), credentials


def basic_credentials(credentials: str) -> tuple[bytes, bytes] | None:
    """The ``(user, password)`` of Basic credentials (``base64(user:password)``, split at the first
    colon: a password may hold colons, a user may not); None when they are not that.

    >>> basic_credentials("cHJvbWV0aGV1czpzM2M6cmV0")  # prometheus:s3c:ret
    (b'prometheus', b's3c:ret')
    >>> basic_credentials("bm8gY29sb24="), basic_credentials("!!")  # "no colon", not base64
    (None, None)
    """
    try:
        decoded = base64.b64decode(credentials.encode("ascii"), validate=True)
    except (UnicodeEncodeError, binascii.Error):
        return None
    user, colon, password = decoded.partition(b":")
    return (user, password) if colon else None


def is_loopback(host: str) -> bool:
    """Whether ``host`` is the loopback (``localhost``, 127.0.0.0/8, ``::1``).

    >>> [is_loopback(h) for h in ("localhost", "127.0.0.2", "::1", "0.0.0.0", "10.1.2.3", "gpu-gw")]
    [True, True, True, False, False, False]
    """
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a host name other than localhost: it may resolve to anything


@dataclass(frozen=True, slots=True)
class ReceiveSecurity:
    """The endpoint's resolved TLS files and credentials (:meth:`from_settings` reads them).

    The expected password and token are bytes (as they come in a request) and kept out of the
    ``repr``.
    """

    tls_cert_file: str = ""
    tls_key_file: str = ""
    basic_username: str = ""
    basic_password: bytes = field(default=b"", repr=False)
    bearer_token: bytes = field(default=b"", repr=False)

    @property
    def uses_tls(self) -> bool:
        """Whether the endpoint serves HTTPS."""
        return bool(self.tls_cert_file)

    @property
    def methods(self) -> tuple[str, ...]:
        """The configured authentication schemes, in lower case (``basic``, ``bearer``)."""
        configured = {"basic": bool(self.basic_password), "bearer": bool(self.bearer_token)}
        return tuple(scheme for scheme, given in configured.items() if given)

    @property
    def authenticates(self) -> bool:
        """Whether a request must bring credentials."""
        return bool(self.methods)

    @classmethod
    def from_settings(cls, settings: Settings) -> ReceiveSecurity:
        """Validate the ``receive_tls_*``, ``receive_basic_auth_*`` and ``receive_bearer_token_file``
        settings and read the secret files.

        Raises
        ------
        SettingsError
            One line naming the variable: a file that is missing or unreadable, an empty secret
            file, a Basic user without its password file (or the other way round), a key without
            its certificate.
        """
        tls_files = {_TLS_CERT: settings.receive_tls_cert_file, _TLS_KEY: settings.receive_tls_key_file}
        for name, path in tls_files.items():
            if path:
                _check_readable(name, path)
        if settings.receive_tls_key_file and not settings.receive_tls_cert_file:
            raise SettingsError(f"{_TLS_KEY} is set without {_TLS_CERT}")
        username = settings.receive_basic_auth_username
        password_file = settings.receive_basic_auth_password_file
        if bool(username) != bool(password_file):
            given, missing = (_BASIC_USER, _BASIC_PASSWORD) if username else (_BASIC_PASSWORD, _BASIC_USER)
            raise SettingsError(f"{given} is set without {missing}: Basic authentication needs both")
        if ":" in username:
            raise SettingsError(f"{_BASIC_USER}: a Basic user name cannot hold a colon")
        security = cls(
            tls_cert_file=settings.receive_tls_cert_file,
            tls_key_file=settings.receive_tls_key_file,
            basic_username=username,
            basic_password=_read_secret(_BASIC_PASSWORD, password_file) if password_file else b"",
            bearer_token=(
                _read_secret(_BEARER, settings.receive_bearer_token_file)
                if settings.receive_bearer_token_file
                else b""
            ),
        )
        security.ssl_context()  # a certificate or key that cannot be loaded: refused at start
        return security

    def ssl_context(self) -> ssl.SSLContext | None:
        """The server's TLS context (TLS 1.2 at least), or None without TLS.

        Raises
        ------
        SettingsError
            When the files are not a PEM certificate and its key (or the key does not match).
        """
        if not self.uses_tls:
            return None
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        try:
            context.load_cert_chain(self.tls_cert_file, self.tls_key_file or None)
        except ssl.SSLError as exc:
            key = self.tls_key_file or "(in the certificate file)"
            raise SettingsError(
                f"{_TLS_CERT}={self.tls_cert_file} / {_TLS_KEY}={key}: cannot load the certificate "
                f"and its key ({exc.reason or exc})"
            ) from None
        return context

    def refusal(self, authorization: str | None) -> str | None:
        """Why a request with this ``Authorization`` header is refused (one of
        :data:`REFUSAL_REASONS`), or None when it may write (always, without a method configured)."""
        if not self.authenticates:
            return None
        if authorization is None or not authorization.strip():
            return "no_credentials"
        parts = split_authorization(authorization)
        if parts is None or parts[0] not in self.methods:
            return "unsupported_scheme"
        scheme, credentials = parts
        # The header as the bytes that came (aiohttp decodes them as UTF-8, keeping the others).
        given = credentials.encode("utf-8", "surrogateescape")
        if scheme == "bearer":
            matches = hmac.compare_digest(given, self.bearer_token)
        else:
            pair = basic_credentials(credentials)
            user, password = pair if pair is not None else (b"", b"")
            # Both compared, always: the time taken says nothing of which one differs.
            user_matches = hmac.compare_digest(user, self.basic_username.encode())
            password_matches = hmac.compare_digest(password, self.basic_password)
            matches = pair is not None and user_matches & password_matches
        return None if matches else "wrong_credentials"

    def challenges(self) -> list[str]:
        """The ``WWW-Authenticate`` values of a 401: one per configured method."""
        return [f'{scheme.capitalize()} realm="{REALM}"' for scheme in self.methods]

    def describe(self) -> str:
        """How the endpoint is protected, for the start-up line (no secret)."""
        auth = {"basic": f"Basic as user {self.basic_username}", "bearer": "a bearer token"}
        methods = " or ".join(auth[scheme] for scheme in self.methods) or "no authentication"
        return f"{'TLS' if self.uses_tls else 'no TLS'}, {methods}"


def _check_readable(variable: str, path: str) -> None:
    try:
        with open(path, "rb"):
            pass
    except OSError as exc:
        raise SettingsError(f"{variable}={path}: cannot read it ({exc.strerror})") from None


def _read_secret(variable: str, path: str) -> bytes:
    """A secret file's content without surrounding whitespace (as Prometheus reads its own)."""
    try:
        secret = Path(path).read_bytes().strip()
    except OSError as exc:
        raise SettingsError(f"{variable}={path}: cannot read it ({exc.strerror})") from None
    if not secret:
        raise SettingsError(f"{variable}={path}: the file is empty")
    return secret


def listen_address(text: str, security: ReceiveSecurity | None = None) -> tuple[str, int]:
    """``HOST:PORT`` of ``--listen``: the loopback always; another address only with both TLS and
    an authentication method configured in ``security``.

    >>> listen_address("127.0.0.1:9201"), listen_address("[::1]:9201"), listen_address("localhost:80")
    (('127.0.0.1', 9201), ('::1', 9201), ('localhost', 80))
    >>> listen_address("0.0.0.0:9201", ReceiveSecurity(tls_cert_file="cert.pem", bearer_token=b"t"))
    ('0.0.0.0', 9201)
    >>> listen_address("0.0.0.0:9201", ReceiveSecurity(bearer_token=b"t"))  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    stream.settings.SettingsError: receive: 0.0.0.0 is not a loopback address, ... missing: TLS (...)
    """
    host, sep, port = text.rpartition(":")
    host = host.strip("[]")
    if not sep or not port.isdigit() or not host or int(port) > 65535:
        raise SettingsError(f"receive: {text!r} is not HOST:PORT")
    if not is_loopback(host):
        security = security or ReceiveSecurity()
        needed = {
            f"TLS ({_TLS_CERT}, {_TLS_KEY})": security.uses_tls,
            f"authentication ({_BASIC_USER} and {_BASIC_PASSWORD}, or {_BEARER})": security.authenticates,
        }
        missing = [what for what, configured in needed.items() if not configured]
        if missing:
            raise SettingsError(
                f"receive: {host} is not a loopback address, and beyond the loopback the endpoint needs "
                f"both TLS and authentication; missing: {' and '.join(missing)}"
            )
    return host, int(port)


class RefusalLog:
    """Logs refused requests at most every ``every_seconds``: the first at once, the next ones
    counted and told in one line when the interval has passed (by :meth:`refused` or
    :meth:`flush`, which the server's timer calls) and at the stop. Never a credential: the
    reasons, and the address of the last peer refused."""

    def __init__(self, every_seconds: float = 60.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.every_seconds = every_seconds
        self._clock = clock
        self._last_line = -float("inf")
        self._pending: Counter[str] = Counter()
        self._last_peer = ""

    def refused(self, reason: str, peer: str) -> None:
        """Count one refusal; log if the last line is old enough."""
        self._pending[reason] += 1
        self._last_peer = peer
        self.flush()

    def flush(self, *, stopping: bool = False) -> None:
        """Log the refusals counted since the last line, if any and if it is old enough (or the
        receiver is ``stopping``: nothing counted goes untold)."""
        now = self._clock()
        if not self._pending or (now - self._last_line < self.every_seconds and not stopping):
            return
        total = sum(self._pending.values())
        reasons = ", ".join(f"{reason} {n}" for reason, n in sorted(self._pending.items()))
        _log.warning(
            "answered 401 to %d request%s without valid credentials (%s; the last from %s)",
            total, "" if total == 1 else "s", reasons, self._last_peer or "an unknown peer",
        )  # fmt: skip
        self._pending.clear()
        self._last_line = now
