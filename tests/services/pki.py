"""A test CA and a server certificate it signed, made with openssl (as tests/services/kafka/start.sh
--secure makes the secured broker's): for servers of faultstream that tests reach over TLS on
127.0.0.1 (``faultstream receive``)."""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Pki:
    """The files of :func:`make_pki`."""

    folder: Path

    @property
    def ca(self) -> Path:
        """The CA that signed the server's certificate: what clients trust (Prometheus' ``ca_file``)."""
        return self.folder / "ca.pem"

    @property
    def other_ca(self) -> Path:
        """A CA that signed nothing here: a client trusting only it must refuse the server."""
        return self.folder / "other-ca.pem"

    @property
    def server_cert(self) -> Path:
        return self.folder / "server.pem"

    @property
    def server_key(self) -> Path:
        return self.folder / "server.key"


def make_pki(folder: Path) -> Pki:
    """Make, in ``folder``, a CA, another CA, and a server certificate and key signed by the first for
    127.0.0.1 and localhost (clients check the host name), valid two days."""
    folder.mkdir(parents=True, exist_ok=True)

    def openssl(*args: str) -> None:
        subprocess.run(["openssl", *args], cwd=folder, check=True, capture_output=True, timeout=60)

    for name, subject in (("ca", "faultstream test CA"), ("other-ca", "some other CA")):
        openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-sha256", "-days", "2",
                "-subj", f"/CN={subject}", "-keyout", f"{name}.key", "-out", f"{name}.pem")  # fmt: skip
    (folder / "server.ext").write_text(
        "subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\n"
    )
    openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=127.0.0.1", "-keyout", "server.key",
            "-out", "server.csr")  # fmt: skip
    openssl("x509", "-req", "-sha256", "-days", "2", "-in", "server.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
            "-CAcreateserial", "-extfile", "server.ext", "-out", "server.pem")  # fmt: skip
    for leftover in ("server.csr", "server.ext", "ca.key", "other-ca.key", "ca.srl"):
        (folder / leftover).unlink(missing_ok=True)
    return Pki(folder)
