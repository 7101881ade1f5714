"""The demo behind TLS and basic auth (`gpuhealth demo --web-config`): its files and its clients' settings.

One self-signed certificate for loopback (127.0.0.1, localhost), one user with a random password
stored bcrypt-hashed in an exporter-toolkit web configuration (`docs/web-config.md`): every
exporter and responder serves it with `--web.config.file`; Prometheus scrapes both jobs with the
fields the web-config component ships for a plain scrape config (`scheme`, `tls_config`,
`basic_auth` with a `password_file`); the webhook front reaches the responders over HTTPS,
checking the certificate. The kubelet-style readiness checks ask `/readyz` over HTTPS (open
without a password, as the manifests' probes are).
"""

from __future__ import annotations

import datetime
import ipaddress
import secrets
import ssl
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import bcrypt

USERNAME = "prometheus"


@dataclass(frozen=True)
class WebFiles:
    web_config: Path
    certificate: Path
    password_file: Path

    def argv(self) -> list[str]:
        return ["--web.config.file", str(self.web_config)]

    def scrape_fields(self) -> dict[str, Any]:
        """A Prometheus job's fields to scrape a target serving this configuration."""
        return {
            "scheme": "https",
            "tls_config": {"ca_file": str(self.certificate)},
            "basic_auth": {"username": USERNAME, "password_file": str(self.password_file)},
        }

    def client_context(self) -> ssl.SSLContext:
        """TLS for a client of the demo's services: their certificate trusted, its address checked."""
        return ssl.create_default_context(cafile=str(self.certificate))


def write(folder: Path) -> WebFiles:
    """The certificate, its key, the password and the web configuration, written under `folder`."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    folder.mkdir(parents=True, exist_ok=True)
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "gpuhealth-demo")])
    now = datetime.datetime.now(datetime.UTC)
    certificate = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName(
                [x509.IPAddress(ipaddress.ip_address("127.0.0.1")), x509.DNSName("localhost")]
            ),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = folder / "tls.crt", folder / "tls.key"
    cert_path.write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    key_path.chmod(0o600)
    password = secrets.token_urlsafe(24)
    password_file = folder / "password"
    password_file.write_text(password + "\n")
    password_file.chmod(0o600)
    hashed = bcrypt.hashpw(password.encode(), bcrypt.gensalt(rounds=8)).decode()
    web = folder / "web.yml"
    web.write_text(
        f"tls_server_config:\n  cert_file: {cert_path}\n  key_file: {key_path}\n"
        f"basic_auth_users:\n  {USERNAME}: {hashed}\n"
    )
    return WebFiles(web, cert_path, password_file)
