"""Endpoints behind a web configuration (gpuhealth.web_guard): basic auth with bcrypt, refusals
counted by reason, probes open, the rate limit, headers, TLS, and a changed file applied on the
next request (a bad change refused, the previous configuration kept)."""

from __future__ import annotations

import base64
import collections
import ssl
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import bcrypt
import pytest
from aiohttp import web

from gpuhealth.http import ServerSettings, add_probes, start_site
from gpuhealth.web_guard import guard_app
from gpuhealth.webconfig import WebConfigError
from tests.support.certificates import self_signed

ALICE = bcrypt.hashpw(b"wonderland", bcrypt.gensalt(rounds=4)).decode()
BOB = bcrypt.hashpw(b"builder", bcrypt.gensalt(rounds=4)).decode()


class Served:
    def __init__(
        self, path: Path, port: int, scheme: str, refused: collections.Counter[str], failed: list[int]
    ):
        self.path, self.port, self.scheme, self.refused, self.failed = path, port, scheme, refused, failed

    def url(self, path: str) -> str:
        return f"{self.scheme}://127.0.0.1:{self.port}{path}"


async def serve(tmp_path: Path, text: str) -> tuple[Served, web.AppRunner]:
    path = tmp_path / "web.yml"
    path.write_text(text)
    app = web.Application()

    async def metrics(_: web.Request) -> web.Response:
        return web.Response(text="up 1\n")

    app.router.add_get("/metrics", metrics)
    add_probes(app, ready=lambda: True, not_ready="-")
    refused: collections.Counter[str] = collections.Counter()
    failed: list[int] = []
    guard = guard_app(
        app,
        str(path),
        on_refused=lambda reason: refused.update([reason]),
        on_reload_failed=lambda: failed.append(1),
    )
    runner = await start_site(app, ServerSettings(host="127.0.0.1", port=0), ssl_context=guard.ssl_context)
    scheme = "https" if guard.ssl_context is not None else "http"
    return Served(path, runner.addresses[0][1], scheme, refused, failed), runner


@pytest.fixture
async def users(tmp_path: Path) -> AsyncIterator[Served]:
    served, runner = await serve(
        tmp_path,
        f"basic_auth_users:\n  alice: {ALICE}\n"
        "http_server_config:\n  headers:\n    X-Content-Type-Options: nosniff\n",
    )
    try:
        yield served
    finally:
        await runner.cleanup()


def basic(user: str, password: str) -> dict[str, str]:
    return {"Authorization": "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()}


async def status(url: str, auth: dict[str, str] | None = None, context: ssl.SSLContext | None = None) -> int:
    async with (
        aiohttp.ClientSession() as session,
        session.get(url, headers=auth, ssl=context or False) as response,
    ):
        return response.status


async def test_a_user_with_the_right_password_is_served_and_nobody_else(users: Served) -> None:
    async with aiohttp.ClientSession() as session:
        async with session.get(users.url("/metrics"), headers=basic("alice", "wonderland")) as ok:
            assert ok.status == 200 and await ok.text() == "up 1\n"
            assert ok.headers["X-Content-Type-Options"] == "nosniff"
        async with session.get(users.url("/metrics")) as anonymous:
            assert anonymous.status == 401
            assert anonymous.headers["WWW-Authenticate"] == 'Basic realm="gpuhealth"'
    assert await status(users.url("/metrics"), basic("alice", "rabbit")) == 401
    assert await status(users.url("/metrics"), {"Authorization": "Bearer alice"}) == 401
    assert await status(users.url("/metrics"), basic("mallory", "wonderland")) == 401
    assert users.refused == {"unauthorized": 4}


async def test_the_probes_answer_without_credentials(users: Served) -> None:
    assert await status(users.url("/healthz")) == 200
    assert await status(users.url("/readyz")) == 200
    assert users.refused == {}


async def test_a_changed_file_applies_to_the_next_request_and_a_bad_one_is_refused(users: Served) -> None:
    alice, bob = basic("alice", "wonderland"), basic("bob", "builder")
    assert await status(users.url("/metrics"), alice) == 200
    users.path.write_text(f"basic_auth_users:\n  bob: {BOB}\n")  # alice revoked, bob added
    assert await status(users.url("/metrics"), alice) == 401
    assert await status(users.url("/metrics"), bob) == 200
    users.path.write_text("basic_auth_users:\n  bob: plain-text\n")  # broken: bob stays, nobody opens it
    assert await status(users.url("/metrics"), bob) == 200
    assert await status(users.url("/metrics")) == 401
    assert users.failed == [1]


async def test_the_rate_limit_refuses_beyond_its_burst(tmp_path: Path) -> None:
    served, runner = await serve(tmp_path, "rate_limit:\n  interval: 1h\n  burst: 2\n")
    try:
        codes = [await status(served.url("/metrics")) for _ in range(4)]
    finally:
        await runner.cleanup()
    assert codes == [200, 200, 429, 429]
    assert served.refused == {"rate_limited": 2}


async def test_tls_from_the_file_with_client_certificates_verified(tmp_path: Path) -> None:
    cert, key = self_signed(tmp_path, "server", "127.0.0.1")
    client_cert, client_key = self_signed(tmp_path, "client", "prometheus")
    served, runner = await serve(
        tmp_path,
        f"tls_server_config:\n  cert_file: {cert}\n  key_file: {key}\n"
        f"  client_auth_type: RequireAndVerifyClientCert\n  client_ca_file: {client_cert}\n",
    )
    try:
        assert served.scheme == "https"
        trusting = ssl.create_default_context(cafile=str(cert))
        trusting.check_hostname = False
        with pytest.raises((aiohttp.ClientError, ssl.SSLError, ConnectionError)):
            await status(served.url("/metrics"), context=trusting)  # no client certificate
        trusting.load_cert_chain(str(client_cert), str(client_key))
        assert await status(served.url("/metrics"), context=trusting) == 200
    finally:
        await runner.cleanup()


async def test_a_file_that_cannot_be_served_is_refused_at_start(tmp_path: Path) -> None:
    with pytest.raises(WebConfigError, match=r"web\.yml:2: tls_server_config\.keyfile: unknown field"):
        await serve(tmp_path, "tls_server_config:\n  keyfile: x\n")
    with pytest.raises(WebConfigError, match=r"web\.yml: tls_server_config: .*cannot load the pair"):
        await serve(
            tmp_path,
            f"tls_server_config:\n  cert_file: {tmp_path}/none.crt\n  key_file: {tmp_path}/none.key\n",
        )


async def test_bcrypt_rounds_are_not_paid_on_every_scrape(users: Served) -> None:
    calls = 0
    real = bcrypt.checkpw

    def counted(password: bytes, hashed: bytes) -> bool:
        nonlocal calls
        calls += 1
        return real(password, hashed)

    bcrypt.checkpw = counted  # type: ignore[assignment]
    try:
        codes = [await status(users.url("/metrics"), basic("alice", "wonderland")) for _ in range(20)]
        assert codes == [200] * 20
    finally:
        bcrypt.checkpw = real  # type: ignore[assignment]
    assert calls == 1
