"""The exporter-toolkit web configuration (gpuhealth.webconfig): what it reads, and every refusal
naming the file, the line and the field."""

# ruff: noqa: E501 (each case is one line: a file and the error it gets)
from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpuhealth.webconfig import GO_CIPHER_SUITES, NONE, RateLimit, WebConfigError, parse

HASH = "$2y$10$mDwo.lAisC94iLAyP81MCesa29IzH37oigHC/42V2pdJlUprsJPze"

FULL = f"""\
tls_server_config:
  cert_file: /etc/tls/tls.crt
  key_file: /etc/tls/tls.key
  client_auth_type: RequireAndVerifyClientCert
  client_ca_file: /etc/tls/ca.crt
  client_allowed_sans: [prometheus.monitoring.svc]
  min_version: TLS13
  cipher_suites: [TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256]
  prefer_server_cipher_suites: true
http_server_config:
  http2: false
  headers:
    X-Frame-Options: deny
basic_auth_users:
  prometheus: {HASH}
rate_limit:
  interval: 1s
  burst: 20
"""


def test_a_node_exporter_file_reads_whole() -> None:
    config = parse(FULL, "web.yml")
    assert config.tls is not None
    assert (config.tls.cert_file, config.tls.key_file) == ("/etc/tls/tls.crt", "/etc/tls/tls.key")
    assert config.tls.verifies_clients and config.tls.client_ca_file == "/etc/tls/ca.crt"
    assert config.tls.client_allowed_sans == ("prometheus.monitoring.svc",)
    assert (config.tls.min_version, config.tls.max_version) == ("TLS13", "TLS13")
    assert config.tls.ciphers == ("ECDHE-RSA-AES128-GCM-SHA256",)
    assert config.users == {"prometheus": HASH}
    assert config.headers == {"X-Frame-Options": "deny"}
    assert config.rate_limit == RateLimit(1.0, 20)


def test_an_empty_file_is_plain_http_open_and_unlimited() -> None:
    assert parse("", "web.yml") == NONE
    assert parse("# nothing\n", "web.yml") == NONE
    assert parse("rate_limit:\n  interval: 0\n  burst: 0\n", "web.yml").rate_limit is None


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            "tls_server_config:\n  cert_file: a\n  keyfile: b\n",
            "web.yml:3: tls_server_config.keyfile: unknown field",
        ),
        ("basic_auth: {}\n", "web.yml:1: basic_auth: unknown field"),
        ("tls_server_config:\n  cert_file: a\n", "web.yml:2: tls_server_config.key_file: required"),
        (
            "tls_server_config:\n  cert_file: a\n  key_file: b\n  client_auth_type: RequireAnyClientCert\n",
            "web.yml:4: tls_server_config.client_auth_type: RequireAnyClientCert requires a certificate and verifies none",
        ),
        (
            "tls_server_config:\n  cert_file: a\n  key_file: b\n  client_auth_type: RequireAndVerifyClientCert\n",
            "web.yml:4: tls_server_config.client_ca_file: required with",
        ),
        (
            "tls_server_config:\n  cert_file: a\n  key_file: b\n  min_version: TLS11\n",
            "web.yml:4: tls_server_config.min_version: TLS11 is not served",
        ),
        (
            "tls_server_config:\n  cert_file: a\n  key_file: b\n  cipher_suites:\n    - TLS_RSA_WITH_RC4_128_SHA\n",
            "web.yml:5: tls_server_config.cipher_suites[0]: unknown TLS 1.2 suite",
        ),
        (
            "tls_server_config:\n  cert_file: a\n  key_file: b\n  curve_preferences: [X25519]\n",
            "web.yml:4: tls_server_config.curve_preferences: not supported",
        ),
        ("basic_auth_users:\n  alice: hunter2\n", "web.yml:2: basic_auth_users.alice: not a bcrypt hash"),
        (
            "http_server_config:\n  headers:\n    Server: x\n",
            "web.yml:3: http_server_config.headers.Server: 'Server' is not one of",
        ),
        (
            "http_server_config:\n  http2: maybe\n",
            "web.yml:2: http_server_config.http2: expected true or false",
        ),
        ("rate_limit:\n  interval: 1s\n  burst: 0\n", "web.yml:2: rate_limit.burst: at least 1"),
        ("rate_limit:\n  interval: soon\n  burst: 2\n", "web.yml:2: rate_limit.interval:"),
        ("tls_server_config: [a]\n", "web.yml:1: tls_server_config: expected a mapping"),
        ("a: [\n", "web.yml:2: not YAML"),
    ],
)
def test_a_bad_file_is_refused_with_its_line_and_field(text: str, message: str) -> None:
    with pytest.raises(WebConfigError) as caught:
        parse(text, "web.yml")
    assert str(caught.value).startswith(message), str(caught.value)


def test_every_go_suite_name_maps_to_an_openssl_suite_this_python_knows() -> None:
    import ssl

    known = {c["name"] for c in ssl.create_default_context().get_ciphers()} | {
        c["name"] for c in _all_ciphers()
    }
    for go, openssl in GO_CIPHER_SUITES.items():
        assert openssl in known, (go, openssl)


def _all_ciphers() -> list[dict[str, str]]:
    import ssl

    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.set_ciphers("ALL")
    return context.get_ciphers()  # type: ignore[return-value]


@given(
    st.text(
        alphabet=st.characters(categories=("Ll", "Lu", "Nd"), include_characters="_"), min_size=1, max_size=20
    )
)
def test_any_unknown_top_level_field_is_named_on_its_line(name: str) -> None:
    text = f"basic_auth_users: {{}}\n{name}: 1\n"
    if name in ("tls_server_config", "http_server_config", "basic_auth_users", "rate_limit"):
        return
    with pytest.raises(WebConfigError, match=r"^web\.yml:2: "):
        parse(text, "web.yml")
