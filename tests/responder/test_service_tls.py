"""TLS for the responder (gpuhealth.tls, `--tls-cert-file`/`--tls-key-file`), with self-signed
pairs made by the openssl command in the test.

Aspects: a site served with the certificate's context presents the pair; a rotated pair is
presented on the next handshake once `check()` saw it, and the background check finds it on
its own; a changed pair that does not load (a key that does not match) is refused and the
previous certificate served on; unchanged files are not reloaded; a pair that cannot be loaded
at start is CertificateError naming the files; one flag without the other, or unreadable
files, are usage errors (exit 2).
"""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from aiohttp import web

from gpuhealth.http import ServerSettings, add_probes, background, start_site
from gpuhealth.tls import CertificateError, ReloadingCertificate, watch_certificate
from tests.support.certificates import der, presented, self_signed


def install(source: tuple[Path, Path], cert: Path, key: Path) -> None:
    """Put a pair in place as a rotation does: each file replaced whole (a new inode)."""
    for src, dst in zip(source, (cert, key), strict=True):
        tmp = dst.with_suffix(".new")
        shutil.copyfile(src, tmp)
        os.replace(tmp, dst)


@pytest.fixture
async def served(tmp_path: Path) -> AsyncIterator[tuple[ReloadingCertificate, int, Path]]:
    first = self_signed(tmp_path, "first")
    cert, key = tmp_path / "tls.crt", tmp_path / "tls.key"
    install(first, cert, key)
    certificate = ReloadingCertificate(str(cert), str(key))
    app = web.Application()
    add_probes(app, ready=lambda: True, not_ready="-")
    runner = await start_site(app, ServerSettings(host="127.0.0.1", port=0), ssl_context=certificate.context)
    try:
        yield certificate, runner.addresses[0][1], tmp_path
    finally:
        await runner.cleanup()


async def shown(port: int) -> bytes:
    return await asyncio.to_thread(presented, "127.0.0.1", port)


async def test_a_rotated_pair_is_presented_on_the_next_handshake(
    served: tuple[ReloadingCertificate, int, Path],
) -> None:
    certificate, port, directory = served
    assert await shown(port) == der(directory / "first.crt")
    assert not certificate.check()  # nothing changed: nothing loaded

    second = self_signed(directory, "second")
    install(second, directory / "tls.crt", directory / "tls.key")
    assert certificate.check() and certificate.reloads == 1
    assert await shown(port) == der(second[0])

    # Half a rotation: a new certificate beside the old key. Refused; the second pair stays.
    third = self_signed(directory, "third")
    install((third[0], second[1]), directory / "tls.crt", directory / "tls.key")
    assert not certificate.check() and certificate.failures == 1
    assert await shown(port) == der(second[0])
    # The other half arrives: the third pair loads.
    install(third, directory / "tls.crt", directory / "tls.key")
    assert certificate.check()
    assert await shown(port) == der(third[0])


async def test_the_background_check_finds_a_rotation(
    served: tuple[ReloadingCertificate, int, Path],
) -> None:
    certificate, port, directory = served
    app = web.Application()
    app.cleanup_ctx.append(background("reload", lambda: watch_certificate(certificate, 0.05)))
    runner = web.AppRunner(app)
    await runner.setup()
    try:
        second = self_signed(directory, "second")
        install(second, directory / "tls.crt", directory / "tls.key")
        for _ in range(600):  # a deadline of about 30 s
            if await shown(port) == der(second[0]):
                break
            await asyncio.sleep(0.05)
        else:
            pytest.fail("the rotated certificate was never presented")
        assert certificate.reloads == 1
    finally:
        await runner.cleanup()


def test_a_pair_that_does_not_load_at_start_names_the_files(tmp_path: Path) -> None:
    cert, _ = self_signed(tmp_path, "a")
    _, other_key = self_signed(tmp_path, "b")
    with pytest.raises(CertificateError, match=f"{cert}, {other_key}: cannot load the pair"):
        ReloadingCertificate(str(cert), str(other_key))
    with pytest.raises(CertificateError, match="No such file or directory"):
        ReloadingCertificate(str(tmp_path / "missing.crt"), str(other_key))


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--tls-cert-file", "c.crt"], "--tls-cert-file and --tls-key-file go together"),
        (["--tls-key-file", "c.key"], "--tls-cert-file and --tls-key-file go together"),
        (["--tls-cert-file", "c.crt", "--tls-key-file", "c.key"], "cannot load the pair"),
    ],
)
def test_tls_flags_that_cannot_serve_are_usage_errors(tmp_path: Path, flags: list[str], message: str) -> None:
    token = tmp_path / "token"
    token.write_text("t\n")
    done = subprocess.run(
        [
            sys.executable, "-m", "gpuhealth", "responder",
            "--token-file", str(token), "--prometheus-url", "http://p", *flags,
        ],
        capture_output=True, text=True, timeout=60, check=False, cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert done.stderr.startswith("gpuhealth responder: error: --tls-")
    assert message in done.stderr and "Traceback" not in done.stderr
