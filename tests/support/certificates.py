"""Self-signed certificates for TLS tests, made with the `openssl` command (the `cryptography`
package is only the real control plane's dev dependency). Each pair is valid for 127.0.0.1
and localhost for a day."""

from __future__ import annotations

import shutil
import socket
import ssl
import subprocess
from pathlib import Path

import pytest


def self_signed(
    directory: Path, name: str, common_name: str = "gpuhealth-test", dns: tuple[str, ...] = ()
) -> tuple[Path, Path]:
    """(certificate, key) PEM files written under `directory`, valid for `dns` names too; the test
    is skipped without openssl."""
    if shutil.which("openssl") is None:
        pytest.skip("the openssl command is not installed")
    cert, key = directory / f"{name}.crt", directory / f"{name}.key"
    names = ",".join(["IP:127.0.0.1", "DNS:localhost", *(f"DNS:{d}" for d in dns)])
    subprocess.run(
        [
            "openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
            "-nodes", "-days", "1", "-subj", f"/CN={common_name}",
            "-addext", f"subjectAltName={names}",
            "-keyout", str(key), "-out", str(cert),
        ],
        check=True, capture_output=True, timeout=30,
    )  # fmt: skip
    return cert, key


def der(cert: Path) -> bytes:
    """The certificate's DER bytes, to compare with what a server presents."""
    return ssl.PEM_cert_to_DER_cert(cert.read_text())


def presented(host: str, port: int) -> bytes:
    """The DER certificate a TLS server presents on a new handshake (not verified)."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    with socket.create_connection((host, port), timeout=10) as raw, context.wrap_socket(raw) as tls:
        certificate = tls.getpeercert(binary_form=True)
    assert certificate is not None
    return certificate
