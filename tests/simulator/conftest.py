"""Fixtures for the simulated cluster's tests.

Aspects covered here: serving the simulated apiserver on a loopback port from a background
thread with its own event loop (the official client is synchronous), a kubeconfig that the
official client loads, and a clean shutdown that ends open watch streams.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from pathlib import Path
from typing import Any, TypeVar

import pytest
from aiohttp import web
from kubernetes import client, config

from gpuhealth.clock import ManualClock
from simulator.apiserver.app import ServerSettings, create_app
from simulator.apiserver.kubeconfig import write_kubeconfig
from simulator.apiserver.store import Store

T = TypeVar("T")


class ServedCluster:
    """A simulated apiserver serving on 127.0.0.1 from its own thread and event loop."""

    def __init__(
        self,
        kubeconfig: Path,
        *,
        token: str | None = None,
        settings: ServerSettings | None = None,
        watch_window: int | None = None,
        **store_options: Any,
    ) -> None:
        """`store_options` go to `Store` as they are (watch_cache=, kubernetes_version=, ...)."""
        self.clock = ManualClock()
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="sim-apiserver", daemon=True)
        self._thread.start()
        self.token = token
        self.kubeconfig = kubeconfig

        async def boot() -> tuple[Store, web.AppRunner, int]:
            store = Store(self.clock, watch_window=watch_window, seed=7, **store_options)
            app = create_app(store, token=token, settings=settings)
            runner = web.AppRunner(app, shutdown_timeout=2.0)
            await runner.setup()
            site = web.TCPSite(runner, "127.0.0.1", 0)
            await site.start()
            port = runner.addresses[0][1]
            return store, runner, port

        self.store, self._runner, port = self._run(boot())
        self.url = f"http://127.0.0.1:{port}"
        write_kubeconfig(kubeconfig, self.url, token=token)

    def _run(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout=30)

    def call(self, fn: Callable[[], T]) -> T:
        """Run `fn` on the server's loop thread (the store is not thread-safe) and return its result."""
        done: Future[T] = Future()

        def run() -> None:
            try:
                done.set_result(fn())
            except BaseException as exc:
                done.set_exception(exc)

        self.loop.call_soon_threadsafe(run)
        return done.result(timeout=30)

    def api_client(self) -> client.ApiClient:
        """An official-client ApiClient configured from the written kubeconfig."""
        return config.new_client_from_config(config_file=str(self.kubeconfig))

    def stop(self) -> None:
        if self.loop.is_closed():
            return
        self._run(self._runner.cleanup())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=10)
        self.loop.close()


@pytest.fixture
def make_cluster(tmp_path: Path) -> Iterator[Callable[..., ServedCluster]]:
    started: list[ServedCluster] = []

    def make(**kwargs: Any) -> ServedCluster:
        served = ServedCluster(tmp_path / f"kubeconfig-{len(started)}", **kwargs)
        started.append(served)
        return served

    yield make
    for served in started:
        served.stop()


@pytest.fixture
def cluster(make_cluster: Callable[..., ServedCluster]) -> ServedCluster:
    return make_cluster(settings=ServerSettings(bookmark_interval_seconds=0.2))


@pytest.fixture
def api(cluster: ServedCluster) -> Iterator[client.ApiClient]:
    api_client = cluster.api_client()
    yield api_client
    api_client.close()


def pod_manifest(
    name: str,
    *,
    labels: dict[str, str] | None = None,
    node: str | None = None,
    finalizers: list[str] | None = None,
) -> dict[str, Any]:
    """A minimal valid Pod body."""
    meta: dict[str, Any] = {"name": name}
    if labels:
        meta["labels"] = labels
    if finalizers:
        meta["finalizers"] = finalizers
    spec: dict[str, Any] = {"containers": [{"name": "main", "image": "registry.example/infer:1"}]}
    if node:
        spec["nodeName"] = node
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec}


@pytest.fixture
def make_pod() -> Callable[..., dict[str, Any]]:
    return pod_manifest
