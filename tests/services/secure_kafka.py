"""A real Kafka broker with secured listeners, for the security tests.

`start()` runs ``tests/services/kafka/start.sh --secure`` into a folder of its own: a fresh
single-node KRaft broker with, beside its PLAINTEXT listener, a SASL_SSL listener (SCRAM-SHA-512,
the user created at format time) and an SSL listener that requires a client certificate, with a
CA and certificates made by openssl and keytool for this run. `SecureBroker.stop()` stops it by
the PID in its folder (``stop.sh``). The session fixture ``secure_kafka`` in tests/conftest.py
starts one per test session and fails the tests that use it when it cannot. A SASL_PLAINTEXT
listener (the same SCRAM user, no TLS) completes the set of protocols.
"""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent / "kafka"


@dataclass(frozen=True)
class SecureBroker:
    """Where the secured test broker listens and the files its clients need."""

    run_dir: Path
    #: PLAINTEXT listener: for checking what the secured clients wrote, with plain test helpers.
    plaintext: str
    #: SASL_SSL listener (SCRAM-SHA-512).
    sasl_ssl: str
    #: SSL listener requiring a client certificate signed by the test CA.
    ssl: str
    #: SASL_PLAINTEXT listener (SCRAM-SHA-512, no TLS).
    sasl_plaintext: str
    tls_dir: Path

    @property
    def ca(self) -> Path:
        """The CA that signed the broker's and the client's certificates."""
        return self.tls_dir / "ca.pem"

    @property
    def other_ca(self) -> Path:
        """A CA that signed nothing the broker has: trusting only it, clients must refuse the broker."""
        return self.tls_dir / "other-ca.pem"

    @property
    def user(self) -> str:
        return (self.tls_dir / "scram-user").read_text().strip()

    @property
    def password_file(self) -> Path:
        return self.tls_dir / "scram-password"

    def sasl_env(self, **extra: str) -> dict[str, str]:
        """FAULTSTREAM_* variables of a client of the SASL_SSL listener (password from its file)."""
        return {
            "FAULTSTREAM_KAFKA_BOOTSTRAP": self.sasl_ssl,
            "FAULTSTREAM_KAFKA_SECURITY_PROTOCOL": "SASL_SSL",
            "FAULTSTREAM_KAFKA_SASL_MECHANISM": "SCRAM-SHA-512",
            "FAULTSTREAM_KAFKA_SASL_USERNAME": self.user,
            "FAULTSTREAM_KAFKA_SASL_PASSWORD_FILE": str(self.password_file),
            "FAULTSTREAM_KAFKA_SSL_CAFILE": str(self.ca),
            **extra,
        }

    def cert_env(self, **extra: str) -> dict[str, str]:
        """FAULTSTREAM_* variables of a client of the SSL listener, with the client certificate."""
        return {
            "FAULTSTREAM_KAFKA_BOOTSTRAP": self.ssl,
            "FAULTSTREAM_KAFKA_SECURITY_PROTOCOL": "SSL",
            "FAULTSTREAM_KAFKA_SSL_CAFILE": str(self.ca),
            "FAULTSTREAM_KAFKA_SSL_CERTFILE": str(self.tls_dir / "client.pem"),
            "FAULTSTREAM_KAFKA_SSL_KEYFILE": str(self.tls_dir / "client.key"),
            **extra,
        }

    def sasl_plaintext_env(self, **extra: str) -> dict[str, str]:
        """FAULTSTREAM_* variables of a client of the SASL_PLAINTEXT listener (no TLS settings)."""
        env = self.sasl_env(FAULTSTREAM_KAFKA_BOOTSTRAP=self.sasl_plaintext, **extra)
        env["FAULTSTREAM_KAFKA_SECURITY_PROTOCOL"] = "SASL_PLAINTEXT"
        del env["FAULTSTREAM_KAFKA_SSL_CAFILE"]
        return env

    def stop(self) -> None:
        """Stop the broker by the PID in its folder and remove the folder."""
        subprocess.run([str(HERE / "stop.sh"), str(self.run_dir)], check=False, timeout=60)


def start(run_dir: Path) -> SecureBroker:
    """Start a secured broker in ``run_dir``; RuntimeError with start.sh's output if it fails."""
    result = subprocess.run(
        [str(HERE / "start.sh"), "--secure", str(run_dir)],
        capture_output=True, text=True, timeout=300, check=False, env=dict(os.environ),
    )  # fmt: skip
    if result.returncode != 0:
        raise RuntimeError(
            f"tests/services/kafka/start.sh --secure failed (exit {result.returncode}):\n{result.stderr[-4000:]}"
        )
    values = dict(line.split("=", 1) for line in result.stdout.splitlines() if "=" in line)
    return SecureBroker(
        run_dir=Path(values["KAFKA_RUN_DIR"]),
        plaintext=values["KAFKA_BOOTSTRAP"],
        sasl_ssl=values["KAFKA_SASL_SSL_BOOTSTRAP"],
        ssl=values["KAFKA_SSL_BOOTSTRAP"],
        sasl_plaintext=values["KAFKA_SASL_PLAINTEXT_BOOTSTRAP"],
        tls_dir=Path(values["KAFKA_TLS_DIR"]),
    )
