"""stream/receive/security.py: the Authorization header as Prometheus sends it, the settings read at
start (files, secrets), the listen rule, the refusal log. The served endpoint (401s before the body
is read, the counters, TLS) is tested in test_endpoint.py and, with a real Prometheus, in
tests/e2e/test_remote_write_auth.py."""

from __future__ import annotations

import base64
import logging
from pathlib import Path

import pytest

from stream.cli.main import main
from stream.receive.security import (
    ReceiveSecurity,
    RefusalLog,
    basic_credentials,
    listen_address,
    split_authorization,
)
from stream.settings import Settings, SettingsError
from tests.services.pki import Pki, make_pki

PASSWORD = "pa:ss wörd"  # a colon, a space and a non-ASCII letter: all allowed in a Basic password
TOKEN = "tok-3f9a.b_c~"


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("receive-pki"))


@pytest.fixture
def secrets(tmp_path: Path) -> Path:
    (tmp_path / "password").write_text(f"  {PASSWORD}\n")  # surrounding whitespace: stripped
    (tmp_path / "token").write_text(f"{TOKEN}\n")
    return tmp_path


def basic(user: str, password: str) -> str:
    """What Go's ``req.SetBasicAuth`` (Prometheus' ``basic_auth``) sends."""
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


def security(secrets: Path, **changes: str) -> ReceiveSecurity:
    values = {
        "receive_basic_auth_username": "prometheus",
        "receive_basic_auth_password_file": str(secrets / "password"),
        "receive_bearer_token_file": str(secrets / "token"),
        **changes,
    }
    return ReceiveSecurity.from_settings(Settings(**values))


# -- the header ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("header", "parts"),
    [
        ("Basic dTpw", ("basic", "dTpw")),
        ("BASIC dTpw", ("basic", "dTpw")),  # the scheme is case-insensitive
        ("Bearer  tok ", ("bearer", "tok")),
        ("Bearer", None),
        ("", None),
        (None, None),
        ("   ", None),
    ],
)
def test_the_authorization_header_is_split_into_scheme_and_credentials(
    header: str | None, parts: tuple[str, str] | None
) -> None:
    assert split_authorization(header) == parts


def test_basic_credentials_split_at_the_first_colon_and_refuse_what_is_not_user_colon_password() -> None:
    encoded = base64.b64encode(f"prometheus:{PASSWORD}".encode()).decode()
    assert basic_credentials(encoded) == (b"prometheus", PASSWORD.encode())
    assert basic_credentials(base64.b64encode(b":").decode()) == (b"", b"")
    assert basic_credentials(base64.b64encode(b"no colon").decode()) is None
    assert basic_credentials("not base64!") is None
    assert basic_credentials("dTp") is None  # truncated
    assert basic_credentials("dépassé") is None  # not ASCII


def test_a_request_passes_with_either_configured_method_and_is_refused_with_the_reason_otherwise(
    secrets: Path,
) -> None:
    both = security(secrets)
    assert both.methods == ("basic", "bearer")
    assert both.refusal(basic("prometheus", PASSWORD)) is None
    assert both.refusal(f"Bearer {TOKEN}") is None
    assert both.refusal(f"bearer {TOKEN}") is None
    assert both.refusal(None) == "no_credentials"
    assert both.refusal("") == "no_credentials"
    assert both.refusal("Digest username=prometheus") == "unsupported_scheme"
    assert both.refusal("Bearer") == "unsupported_scheme"  # no credentials after the scheme
    assert both.refusal(basic("prometheus", PASSWORD + "x")) == "wrong_credentials"
    assert both.refusal(basic("prometheus", PASSWORD[:-1])) == "wrong_credentials"
    assert both.refusal(basic("Prometheus", PASSWORD)) == "wrong_credentials"  # the user, exactly
    assert both.refusal(basic("prometheus", "")) == "wrong_credentials"
    assert both.refusal("Basic " + base64.b64encode(b"prometheus").decode()) == "wrong_credentials"
    assert both.refusal("Basic %%%") == "wrong_credentials"
    assert both.refusal(f"Bearer {TOKEN}x") == "wrong_credentials"
    assert both.refusal(f"Bearer {TOKEN[:-1]}") == "wrong_credentials"
    assert both.refusal("Bearer tök") == "wrong_credentials"  # non-ASCII bytes: compared, refused


def test_only_the_configured_method_is_taken(secrets: Path) -> None:
    bearer_only = security(secrets, receive_basic_auth_username="", receive_basic_auth_password_file="")
    assert bearer_only.methods == ("bearer",)
    assert bearer_only.refusal(f"Bearer {TOKEN}") is None
    assert bearer_only.refusal(basic("prometheus", PASSWORD)) == "unsupported_scheme"
    assert bearer_only.challenges() == ['Bearer realm="faultstream receive"']
    basic_only = security(secrets, receive_bearer_token_file="")
    assert basic_only.refusal(basic("prometheus", PASSWORD)) is None
    assert basic_only.refusal(f"Bearer {TOKEN}") == "unsupported_scheme"
    assert basic_only.challenges() == ['Basic realm="faultstream receive"']


def test_without_a_method_every_request_passes() -> None:
    nothing = ReceiveSecurity.from_settings(Settings())
    assert (nothing.uses_tls, nothing.authenticates, nothing.challenges()) == (False, False, [])
    assert nothing.refusal(None) is None
    assert nothing.refusal("Bearer anything") is None


# -- the settings read at start -------------------------------------------------------------------


def test_secrets_never_show_in_the_repr_nor_the_description(secrets: Path, pki: Pki) -> None:
    configured = security(
        secrets, receive_tls_cert_file=str(pki.server_cert), receive_tls_key_file=str(pki.server_key)
    )
    assert configured.basic_password == PASSWORD.encode()  # stripped of the file's whitespace
    assert configured.bearer_token == TOKEN.encode()
    shown = repr(configured) + configured.describe()
    assert PASSWORD not in shown and TOKEN not in shown
    assert configured.describe() == "TLS, Basic as user prometheus or a bearer token"


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        (
            {"receive_bearer_token_file": "/nonexistent/token"},
            "FAULTSTREAM_RECEIVE_BEARER_TOKEN_FILE=/nonexistent/token: cannot read it (No such file or directory)",
        ),
        (
            {"receive_basic_auth_password_file": "/nonexistent/password"},
            "FAULTSTREAM_RECEIVE_BASIC_AUTH_PASSWORD_FILE=/nonexistent/password: cannot read it",
        ),
        (
            {"receive_tls_cert_file": "/nonexistent/cert.pem"},
            "FAULTSTREAM_RECEIVE_TLS_CERT_FILE=/nonexistent/cert.pem: cannot read it",
        ),
        (
            {"receive_basic_auth_password_file": ""},
            "FAULTSTREAM_RECEIVE_BASIC_AUTH_USERNAME is set without FAULTSTREAM_RECEIVE_BASIC_AUTH_PASSWORD_FILE",
        ),
        (
            {"receive_basic_auth_username": ""},
            "FAULTSTREAM_RECEIVE_BASIC_AUTH_PASSWORD_FILE is set without FAULTSTREAM_RECEIVE_BASIC_AUTH_USERNAME",
        ),
        ({"receive_basic_auth_username": "a:b"}, "a Basic user name cannot hold a colon"),
    ],
)
def test_a_setting_that_cannot_be_used_is_one_line_naming_it(
    secrets: Path, changes: dict[str, str], message: str
) -> None:
    with pytest.raises(SettingsError) as refused:
        security(secrets, **changes)
    assert message in str(refused.value)
    assert "\n" not in str(refused.value)


def test_an_unreadable_or_empty_secret_file_and_an_unusable_certificate_are_refused(
    secrets: Path, pki: Pki
) -> None:
    with pytest.raises(SettingsError, match=r"_BEARER_TOKEN_FILE=.*: cannot read it \(Is a directory\)"):
        security(secrets, receive_bearer_token_file=str(secrets))
    (secrets / "empty").write_text("\n")
    with pytest.raises(SettingsError, match=r"_BASIC_AUTH_PASSWORD_FILE=.*empty: the file is empty"):
        security(secrets, receive_basic_auth_password_file=str(secrets / "empty"))
    with pytest.raises(SettingsError, match="cannot load the certificate and its key"):
        security(secrets, receive_tls_cert_file=str(secrets / "token"))  # not PEM
    with pytest.raises(SettingsError, match="cannot load the certificate and its key"):
        security(secrets, receive_tls_cert_file=str(pki.ca))  # a certificate without its key
    with pytest.raises(SettingsError, match="_TLS_KEY_FILE is set without FAULTSTREAM_RECEIVE_TLS_CERT_FILE"):
        security(secrets, receive_tls_key_file=str(pki.server_key))
    served = security(
        secrets, receive_tls_cert_file=str(pki.server_cert), receive_tls_key_file=str(pki.server_key)
    )
    assert served.uses_tls and served.ssl_context() is not None


# -- the listen rule ------------------------------------------------------------------------------


def test_the_loopback_needs_neither_tls_nor_authentication() -> None:
    for address, expected in [
        ("127.0.0.1:9201", ("127.0.0.1", 9201)),
        ("127.8.0.1:9201", ("127.8.0.1", 9201)),
        ("[::1]:9201", ("::1", 9201)),
        ("localhost:9201", ("localhost", 9201)),
    ]:
        assert listen_address(address) == expected
        assert listen_address(address, ReceiveSecurity()) == expected


def test_beyond_the_loopback_both_tls_and_authentication_are_needed_and_the_missing_one_is_named() -> None:
    tls = "TLS (FAULTSTREAM_RECEIVE_TLS_CERT_FILE"
    auth = "authentication (FAULTSTREAM_RECEIVE_BASIC_AUTH_USERNAME"
    cases = [
        (ReceiveSecurity(), [tls, auth]),
        (ReceiveSecurity(tls_cert_file="cert.pem"), [auth]),
        (ReceiveSecurity(bearer_token=b"t"), [tls]),
        (ReceiveSecurity(basic_username="u", basic_password=b"p"), [tls]),
    ]
    for address in ("0.0.0.0:9201", "[::]:9201", "10.1.2.3:9201", "gpu-gateway.example:9201"):
        for configured, missing in cases:
            with pytest.raises(SettingsError) as refused:
                listen_address(address, configured)
            message = str(refused.value)
            assert "is not a loopback address" in message and "\n" not in message
            assert [what for what in (tls, auth) if what in message] == missing, message
    for configured in (
        ReceiveSecurity(tls_cert_file="cert.pem", bearer_token=b"t"),
        ReceiveSecurity(tls_cert_file="cert.pem", basic_username="u", basic_password=b"p"),
    ):
        assert listen_address("0.0.0.0:9201", configured) == ("0.0.0.0", 9201)
        assert listen_address("[::]:9201", configured) == ("::", 9201)


@pytest.mark.parametrize("address", ["9201", ":9201", "127.0.0.1:", "127.0.0.1:port", "127.0.0.1:70000"])
def test_an_address_that_is_not_host_port_is_refused(address: str) -> None:
    with pytest.raises(SettingsError, match="is not HOST:PORT"):
        listen_address(address)


def test_the_command_refuses_an_open_address_without_tls_and_authentication_before_anything_else(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], secrets: Path, pki: Pki
) -> None:
    monkeypatch.setenv("FAULTSTREAM_KAFKA_BOOTSTRAP", "127.0.0.1:1")  # never reached: refused first
    monkeypatch.setenv("FAULTSTREAM_RECEIVE_BEARER_TOKEN_FILE", str(secrets / "token"))
    assert main(["receive", "--listen", "0.0.0.0:9201"]) == 2
    error = capsys.readouterr().err
    assert error.startswith("faultstream: error: receive: 0.0.0.0 is not a loopback address")
    assert "missing: TLS (" in error and "authentication (" not in error and error.count("\n") == 1
    monkeypatch.setenv("FAULTSTREAM_RECEIVE_TLS_CERT_FILE", str(pki.server_cert))
    monkeypatch.setenv("FAULTSTREAM_RECEIVE_TLS_KEY_FILE", str(secrets / "missing.key"))
    assert main(["receive", "--listen", "0.0.0.0:9201"]) == 2
    error = capsys.readouterr().err
    assert "FAULTSTREAM_RECEIVE_TLS_KEY_FILE=" in error and "cannot read it" in error
    assert TOKEN not in error


def test_the_command_accepts_an_open_address_with_tls_and_authentication(
    monkeypatch: pytest.MonkeyPatch, secrets: Path, pki: Pki
) -> None:
    import stream.kafka.reachable
    import stream.receive.server

    started: list[tuple[str, int, ReceiveSecurity]] = []

    async def kafka_is_there(*_: object) -> None:
        pass

    # Nothing binds: the command gets as far as serving, with the address and security it checked.
    monkeypatch.setattr(stream.kafka.reachable, "wait_for_kafka", kafka_is_there)
    monkeypatch.setattr(
        stream.receive.server,
        "run_receiver",
        lambda _settings, host, port, sec: started.append((host, port, sec)),
    )
    monkeypatch.setenv("FAULTSTREAM_RECEIVE_TLS_CERT_FILE", str(pki.server_cert))
    monkeypatch.setenv("FAULTSTREAM_RECEIVE_TLS_KEY_FILE", str(pki.server_key))
    monkeypatch.setenv("FAULTSTREAM_RECEIVE_BEARER_TOKEN_FILE", str(secrets / "token"))
    assert main(["receive", "--listen", "0.0.0.0:9201"]) == 0
    [(host, port, served)] = started
    assert (host, port, served.uses_tls, served.methods) == ("0.0.0.0", 9201, True, ("bearer",))


# -- the refusal log ------------------------------------------------------------------------------


def test_refusals_are_logged_at_most_every_interval_with_their_count_and_never_a_credential(
    caplog: pytest.LogCaptureFixture,
) -> None:
    now = [100.0]
    log = RefusalLog(every_seconds=60, clock=lambda: now[0])
    with caplog.at_level(logging.WARNING, logger="faultstream.receive"):
        log.refused("wrong_credentials", "10.0.0.7")  # the first: at once
        now[0] += 1
        log.refused("no_credentials", "10.0.0.8")
        log.refused("wrong_credentials", "10.0.0.9")
        log.flush()  # too early: held
        now[0] += 59
        log.flush()  # the interval has passed: one line for the two held back
        now[0] += 120
        log.flush()  # nothing held: nothing said
        log.refused("unsupported_scheme", "10.0.0.7")  # at once: the last line is old
        log.refused("no_credentials", "10.0.0.7")
        log.flush(stopping=True)  # held, told at the stop
    lines = [record.getMessage() for record in caplog.records]
    assert lines == [
        "answered 401 to 1 request without valid credentials (wrong_credentials 1; the last from 10.0.0.7)",
        "answered 401 to 2 requests without valid credentials (no_credentials 1, wrong_credentials 1; "
        "the last from 10.0.0.9)",
        "answered 401 to 1 request without valid credentials (unsupported_scheme 1; the last from 10.0.0.7)",
        "answered 401 to 1 request without valid credentials (no_credentials 1; the last from 10.0.0.7)",
    ]
