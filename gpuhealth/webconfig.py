"""The web configuration file of Prometheus' exporter-toolkit (`--web.config.file`), read as its servers do.

node-exporter, Prometheus and Alertmanager take TLS and basic authentication from one YAML file
(docs/operations.md, "Endpoints tenants cannot read"); gpuhealth's exporter and responder take
the same file, so an operator writes it once. What is read (the toolkit's own keys):

    tls_server_config:
      cert_file / key_file (or cert / key inline, PEM)
      client_auth_type     NoClientCert (default), VerifyClientCertIfGiven, RequireAndVerifyClientCert
      client_ca_file (or client_ca inline)
      client_allowed_sans  the client certificate must carry one of these SANs
      min_version / max_version   TLS12 (default min), TLS13
      cipher_suites        Go's names of TLS 1.2 suites (TLS 1.3's are not configurable)
      prefer_server_cipher_suites  accepted; the server's order is always preferred here
    http_server_config:
      http2                accepted (aiohttp serves HTTP/1.1 only: false changes nothing)
      headers              the response headers the toolkit allows (below)
    basic_auth_users:      user: bcrypt hash
    rate_limit:            interval (a duration), burst

A key the toolkit does not know is an error, as there (its YAML is read strictly), and so is a
setting this server cannot honour as written (`RequestClientCert` and `RequireAnyClientCert`,
which ask for a certificate without verifying it; `curve_preferences`; TLS 1.0/1.1): refusing
at start beats serving weaker than the file says. Every error names the file, the line and the
field. Parsing is pure; serving it is `gpuhealth.web_guard`'s.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import yaml

from gpuhealth.durations import DurationError, parse_duration

ALLOWED_HEADERS = frozenset(
    {
        "Strict-Transport-Security",
        "X-Content-Type-Options",
        "X-Frame-Options",
        "X-XSS-Protection",
        "Content-Security-Policy",
    }
)
"""The response headers `http_server_config.headers` may set (the toolkit's list)."""

CLIENT_AUTH_TYPES = ("NoClientCert", "VerifyClientCertIfGiven", "RequireAndVerifyClientCert")
REFUSED_CLIENT_AUTH = {
    "RequestClientCert": "asks for a certificate and verifies none",
    "RequireAnyClientCert": "requires a certificate and verifies none",
}
TLS_VERSIONS = ("TLS12", "TLS13")
REFUSED_VERSIONS = ("TLS10", "TLS11")

GO_CIPHER_SUITES = {
    "TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256": "ECDHE-ECDSA-AES128-GCM-SHA256",
    "TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384": "ECDHE-ECDSA-AES256-GCM-SHA384",
    "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256": "ECDHE-RSA-AES128-GCM-SHA256",
    "TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384": "ECDHE-RSA-AES256-GCM-SHA384",
    "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256": "ECDHE-ECDSA-CHACHA20-POLY1305",
    "TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256": "ECDHE-RSA-CHACHA20-POLY1305",
    "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305": "ECDHE-ECDSA-CHACHA20-POLY1305",
    "TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305": "ECDHE-RSA-CHACHA20-POLY1305",
    "TLS_ECDHE_ECDSA_WITH_AES_128_CBC_SHA": "ECDHE-ECDSA-AES128-SHA",
    "TLS_ECDHE_ECDSA_WITH_AES_256_CBC_SHA": "ECDHE-ECDSA-AES256-SHA",
    "TLS_ECDHE_RSA_WITH_AES_128_CBC_SHA": "ECDHE-RSA-AES128-SHA",
    "TLS_ECDHE_RSA_WITH_AES_256_CBC_SHA": "ECDHE-RSA-AES256-SHA",
    "TLS_RSA_WITH_AES_128_GCM_SHA256": "AES128-GCM-SHA256",
    "TLS_RSA_WITH_AES_256_GCM_SHA384": "AES256-GCM-SHA384",
}
"""Go's `crypto/tls` names of the TLS 1.2 suites Go serves, to OpenSSL's names of the same suites."""

_BCRYPT = re.compile(r"^\$2[abxy]?\$\d{2}\$[./A-Za-z0-9]{53}$")

_SECTIONS = ("tls_server_config", "http_server_config", "basic_auth_users", "rate_limit")
_TLS_KEYS = (
    "cert",
    "key",
    "cert_file",
    "key_file",
    "client_auth_type",
    "client_ca",
    "client_ca_file",
    "client_allowed_sans",
    "min_version",
    "max_version",
    "cipher_suites",
    "curve_preferences",
    "prefer_server_cipher_suites",
)
_HTTP_KEYS = ("http2", "headers")
_RATE_KEYS = ("interval", "burst")


class WebConfigError(ValueError):
    """The file cannot be served as written: `<file>:<line>: <field>: <reason>`."""


@dataclass(frozen=True)
class TlsServerConfig:
    cert_file: str = ""
    key_file: str = ""
    cert: str = ""
    """Inline PEM (instead of `cert_file`)."""
    key: str = ""
    client_auth_type: str = "NoClientCert"
    client_ca_file: str = ""
    client_ca: str = ""
    client_allowed_sans: tuple[str, ...] = ()
    min_version: str = "TLS12"
    max_version: str = "TLS13"
    ciphers: tuple[str, ...] = ()
    """OpenSSL's names of the configured TLS 1.2 suites (empty: OpenSSL's defaults)."""

    @property
    def verifies_clients(self) -> bool:
        return self.client_auth_type != "NoClientCert"


@dataclass(frozen=True)
class RateLimit:
    interval_seconds: float
    """Time between two tokens of the bucket; 0 turns the limit off."""
    burst: int


@dataclass(frozen=True)
class WebConfig:
    """One reading of the file; the empty file (or none) is plain HTTP, open, unlimited."""

    tls: TlsServerConfig | None = None
    users: Mapping[str, str] = field(default_factory=dict)
    """User name to bcrypt hash; empty: no authentication."""
    headers: Mapping[str, str] = field(default_factory=dict)
    rate_limit: RateLimit | None = None


NONE = WebConfig()


def parse(text: str, source: str) -> WebConfig:
    """The configuration `text` (read from `source`, named in errors) says; WebConfigError if bad."""
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = mark.line + 1 if mark is not None else 1
        problem = getattr(exc, "problem", None) or str(exc)
        raise WebConfigError(f"{source}:{line}: not YAML: {problem}") from None
    if root is None:
        return NONE
    reader = _Reader(source)
    top = reader.mapping(root, "", _SECTIONS)
    tls = _tls(reader, top["tls_server_config"]) if "tls_server_config" in top else None
    users = _users(reader, top["basic_auth_users"]) if "basic_auth_users" in top else {}
    headers: dict[str, str] = {}
    if "http_server_config" in top:
        http = reader.mapping(top["http_server_config"], "http_server_config", _HTTP_KEYS)
        if "http2" in http:
            reader.boolean(http["http2"], "http_server_config.http2")
        if "headers" in http:
            headers = _headers(reader, http["headers"])
    rate = _rate(reader, top["rate_limit"]) if "rate_limit" in top else None
    return WebConfig(tls, users, headers, rate)


def load(path: str) -> WebConfig:
    """The file at `path`; WebConfigError naming it when it cannot be read or is bad."""
    try:
        with open(path, encoding="utf-8") as handle:
            text = handle.read()
    except (OSError, UnicodeDecodeError) as exc:
        raise WebConfigError(f"{path}: cannot read the web configuration: {exc}") from None
    return parse(text, path)


def _tls(reader: _Reader, node: yaml.Node) -> TlsServerConfig:
    where = "tls_server_config"
    keys = reader.mapping(node, where, _TLS_KEYS)
    text = {k: reader.string(v, f"{where}.{k}") for k, v in keys.items() if k in _STRING_TLS_KEYS}
    if "curve_preferences" in keys:
        reader.fail(keys["curve_preferences"], f"{where}.curve_preferences", "not supported here; remove it")
    if "prefer_server_cipher_suites" in keys:
        reader.boolean(keys["prefer_server_cipher_suites"], f"{where}.prefer_server_cipher_suites")
    for inline, named in (("cert", "cert_file"), ("key", "key_file"), ("client_ca", "client_ca_file")):
        if text.get(inline) and text.get(named):
            reader.fail(keys[inline], f"{where}.{inline}", f"give {inline} or {named}, not both")
    if not (text.get("cert") or text.get("cert_file")):
        reader.fail(node, f"{where}.cert_file", "required (or cert, inline)")
    if not (text.get("key") or text.get("key_file")):
        reader.fail(node, f"{where}.key_file", "required (or key, inline)")
    auth = text.get("client_auth_type", "NoClientCert")
    if auth in REFUSED_CLIENT_AUTH:
        reader.fail(
            keys["client_auth_type"],
            f"{where}.client_auth_type",
            f"{auth} {REFUSED_CLIENT_AUTH[auth]}; use RequireAndVerifyClientCert or VerifyClientCertIfGiven",
        )
    if auth not in CLIENT_AUTH_TYPES:
        reader.fail(keys["client_auth_type"], f"{where}.client_auth_type", _one_of(auth, CLIENT_AUTH_TYPES))
    has_ca = bool(text.get("client_ca") or text.get("client_ca_file"))
    if auth != "NoClientCert" and not has_ca:
        reader.fail(keys["client_auth_type"], f"{where}.client_ca_file", f"required with {auth}")
    versions = {}
    for name, default in (("min_version", "TLS12"), ("max_version", "TLS13")):
        value = text.get(name, default)
        if value in REFUSED_VERSIONS:
            reader.fail(keys[name], f"{where}.{name}", f"{value} is not served here (TLS12 at least)")
        if value not in TLS_VERSIONS:
            reader.fail(keys[name], f"{where}.{name}", _one_of(value, TLS_VERSIONS))
        versions[name] = value
    if versions["min_version"] > versions["max_version"]:
        reader.fail(keys["max_version"], f"{where}.max_version", "below min_version")
    sans: tuple[str, ...] = ()
    if "client_allowed_sans" in keys:
        sans = reader.strings(keys["client_allowed_sans"], f"{where}.client_allowed_sans")
        if sans and auth == "NoClientCert":
            reader.fail(
                keys["client_allowed_sans"], f"{where}.client_allowed_sans", "needs client verification"
            )
    ciphers: list[str] = []
    if "cipher_suites" in keys:
        for i, (name, item) in enumerate(_items(reader, keys["cipher_suites"], f"{where}.cipher_suites")):
            if name not in GO_CIPHER_SUITES:
                reader.fail(item, f"{where}.cipher_suites[{i}]", f"unknown TLS 1.2 suite {name!r}")
            ciphers.append(GO_CIPHER_SUITES[name])
    return TlsServerConfig(
        cert_file=text.get("cert_file", ""),
        key_file=text.get("key_file", ""),
        cert=text.get("cert", ""),
        key=text.get("key", ""),
        client_auth_type=auth,
        client_ca_file=text.get("client_ca_file", ""),
        client_ca=text.get("client_ca", ""),
        client_allowed_sans=sans,
        min_version=versions["min_version"],
        max_version=versions["max_version"],
        ciphers=tuple(ciphers),
    )


_STRING_TLS_KEYS = frozenset(
    {"cert", "key", "cert_file", "key_file", "client_auth_type", "client_ca", "client_ca_file"}
    | {"min_version", "max_version"}
)


def _users(reader: _Reader, node: yaml.Node) -> dict[str, str]:
    if not isinstance(node, yaml.MappingNode):
        reader.fail(node, "basic_auth_users", "expected a mapping of user name to bcrypt hash")
    users: dict[str, str] = {}
    for key, value in node.value:
        user = reader.string(key, "basic_auth_users")
        where = f"basic_auth_users.{user}"
        if user in users:
            reader.fail(key, where, "given twice")
        if not user or ":" in user:
            reader.fail(key, where, "a user name is not empty and holds no ':'")
        hashed = reader.string(value, where)
        if not _BCRYPT.match(hashed):
            reader.fail(value, where, "not a bcrypt hash ($2y$<cost>$...): passwords are stored hashed")
        users[user] = hashed
    return users


def _headers(reader: _Reader, node: yaml.Node) -> dict[str, str]:
    where = "http_server_config.headers"
    if not isinstance(node, yaml.MappingNode):
        reader.fail(node, where, "expected a mapping of header to value")
    headers: dict[str, str] = {}
    for key, value in node.value:
        name = reader.string(key, where)
        if name not in ALLOWED_HEADERS:
            reader.fail(key, f"{where}.{name}", _one_of(name, sorted(ALLOWED_HEADERS)))
        text = reader.string(value, f"{where}.{name}")
        if "\n" in text or "\r" in text:
            reader.fail(value, f"{where}.{name}", "a header value is one line")
        headers[name] = text
    return headers


def _rate(reader: _Reader, node: yaml.Node) -> RateLimit | None:
    keys = reader.mapping(node, "rate_limit", _RATE_KEYS)
    interval = 0.0
    if "interval" in keys:
        text = reader.string(keys["interval"], "rate_limit.interval")
        try:
            interval = parse_duration(text) if text not in ("0", "") else 0.0
        except DurationError as exc:
            reader.fail(keys["interval"], "rate_limit.interval", str(exc))
    burst = 0
    if "burst" in keys:
        raw = keys["burst"]
        if not (isinstance(raw, yaml.ScalarNode) and raw.tag.endswith(":int")):
            reader.fail(raw, "rate_limit.burst", "expected a whole number")
        burst = int(raw.value)
        if burst < 0:
            reader.fail(raw, "rate_limit.burst", "expected 0 or more")
    if interval <= 0:
        return None
    if burst < 1:
        reader.fail(node, "rate_limit.burst", "at least 1 with an interval (no request could pass)")
    return RateLimit(interval, burst)


def _items(reader: _Reader, node: yaml.Node, where: str) -> list[tuple[str, yaml.Node]]:
    if not isinstance(node, yaml.SequenceNode):
        reader.fail(node, where, "expected a list")
    return [(reader.string(item, f"{where}[{i}]"), item) for i, item in enumerate(node.value)]


def _one_of(value: str, allowed: Any) -> str:
    return f"{value!r} is not one of {', '.join(allowed)}"


class _Reader:
    """Typed reads of YAML nodes, each failure naming the file, the node's line and the field."""

    def __init__(self, source: str) -> None:
        self.source = source

    def fail(self, node: yaml.Node, where: str, reason: str) -> Any:
        raise WebConfigError(f"{self.source}:{node.start_mark.line + 1}: {where}: {reason}")

    def mapping(self, node: yaml.Node, where: str, allowed: tuple[str, ...]) -> dict[str, yaml.Node]:
        name = where or "the file"
        if not isinstance(node, yaml.MappingNode):
            self.fail(node, name, "expected a mapping")
        out: dict[str, yaml.Node] = {}
        for key, value in node.value:
            text = self.string(key, name)
            path = f"{where}.{text}" if where else text
            if text not in allowed:
                self.fail(key, path, f"unknown field (expected one of: {', '.join(allowed)})")
            if text in out:
                self.fail(key, path, "given twice")
            out[text] = value
        return out

    def string(self, node: yaml.Node, where: str) -> str:
        if not isinstance(node, yaml.ScalarNode) or node.tag.endswith(":null"):
            self.fail(node, where, "expected a string")
        return str(node.value)

    def strings(self, node: yaml.Node, where: str) -> tuple[str, ...]:
        return tuple(name for name, _ in _items(self, node, where))

    def boolean(self, node: yaml.Node, where: str) -> bool:
        if not (isinstance(node, yaml.ScalarNode) and node.tag.endswith(":bool")):
            self.fail(node, where, "expected true or false")
        return bool(node.value.lower() == "true")
