"""A private certificate authority and what it signs, for one control plane on loopback.

Everything is generated fresh into the control plane's work directory (never committed):
- a CA (`ca.crt`), trusted by every component and by clients for TLS and client certificates;
- serving certificates for 127.0.0.1 and localhost (the apiserver, the controller-manager's
  and the scheduler's secure ports);
- client certificates whose subject is the identity the apiserver authenticates (CN = user,
  O = groups): the admin in `system:masters`, `system:kube-controller-manager`,
  `system:kube-scheduler`;
- the service-account key pair: the apiserver signs tokens with the private key and verifies
  them with the public one; the controller-manager's token controller signs with it too.

Keys are ECDSA P-256: generated in about a millisecond (RSA-2048 takes ~50 ms each), and every
component accepts them (service-account tokens are then ES256).
"""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path

try:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
except ImportError as exc:  # a dev dependency: the control plane is test and demo tooling
    raise ImportError(
        "the real control plane needs the `cryptography` package: pip install -e '.[dev]'"
    ) from exc

VALIDITY = datetime.timedelta(days=7)
"""Long enough for any run; the work directory is thrown away after it."""
LOOPBACK_NAMES = ("localhost",)
LOOPBACK_ADDRESSES = ("127.0.0.1",)


@dataclass(frozen=True)
class KeyPair:
    """A certificate and its private key as files (PEM)."""

    cert: Path
    key: Path


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def _write(path: Path, data: bytes, *, private: bool) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    path.chmod(0o600 if private else 0o644)
    return path


def _name(common_name: str, organizations: tuple[str, ...] = ()) -> x509.Name:
    attributes = [x509.NameAttribute(NameOID.ORGANIZATION_NAME, o) for o in organizations]
    return x509.Name([*attributes, x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


class CertificateAuthority:
    """A self-signed CA that signs serving and client certificates into `directory`."""

    def __init__(self, directory: Path, *, now: datetime.datetime | None = None) -> None:
        self.directory = directory
        self._now = now or datetime.datetime.now(datetime.UTC)
        self._key = _key()
        self._name = _name("gpuhealth-controlplane-ca")
        self._cert = (
            self._builder(self._name, self._key.public_key())
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=True,
                    key_cert_sign=True,
                    crl_sign=True,
                    content_commitment=False,
                    key_encipherment=False,
                    data_encipherment=False,
                    key_agreement=False,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )
            .sign(self._key, hashes.SHA256())
        )
        self.pair = KeyPair(
            _write(directory / "ca.crt", self._cert.public_bytes(serialization.Encoding.PEM), private=False),
            _write(directory / "ca.key", _key_pem(self._key), private=True),
        )

    @property
    def cert_pem(self) -> bytes:
        return self._cert.public_bytes(serialization.Encoding.PEM)

    def _builder(self, subject: x509.Name, public_key: ec.EllipticCurvePublicKey) -> x509.CertificateBuilder:
        return (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(self._name)
            .public_key(public_key)
            .serial_number(x509.random_serial_number())
            .not_valid_before(self._now - datetime.timedelta(minutes=5))  # clock skew between processes
            .not_valid_after(self._now + VALIDITY)
        )

    def _issue(
        self, stem: str, subject: x509.Name, usage: x509.ObjectIdentifier, extra: list[x509.ExtensionType]
    ) -> KeyPair:
        key = _key()
        builder = self._builder(subject, key.public_key()).add_extension(
            x509.BasicConstraints(ca=False, path_length=None), critical=True
        )
        builder = builder.add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
        for extension in extra:
            builder = builder.add_extension(extension, critical=False)
        cert = builder.sign(self._key, hashes.SHA256()).public_bytes(serialization.Encoding.PEM)
        return KeyPair(
            _write(self.directory / f"{stem}.crt", cert, private=False),
            _write(self.directory / f"{stem}.key", _key_pem(key), private=True),
        )

    def serving(self, stem: str, common_name: str, *, dns: tuple[str, ...] = ()) -> KeyPair:
        """A TLS serving certificate for loopback (127.0.0.1, localhost) and `dns`."""
        names: list[x509.GeneralName] = [x509.DNSName(n) for n in (*LOOPBACK_NAMES, *dns)]
        names += [x509.IPAddress(ipaddress.ip_address(a)) for a in LOOPBACK_ADDRESSES]
        return self._issue(
            stem, _name(common_name), ExtendedKeyUsageOID.SERVER_AUTH, [x509.SubjectAlternativeName(names)]
        )

    def client(self, stem: str, user: str, groups: tuple[str, ...] = ()) -> KeyPair:
        """A client certificate the apiserver authenticates as `user` in `groups`."""
        return self._issue(stem, _name(user, groups), ExtendedKeyUsageOID.CLIENT_AUTH, [])


@dataclass(frozen=True)
class ServiceAccountKeys:
    """The key pair that signs (private) and verifies (public) service-account tokens."""

    private: Path
    public: Path


def service_account_keys(directory: Path) -> ServiceAccountKeys:
    key = _key()
    public = key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    return ServiceAccountKeys(
        _write(directory / "sa.key", _key_pem(key), private=True),
        _write(directory / "sa.pub", public, private=False),
    )
