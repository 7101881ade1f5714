"""Running the simulated cluster's controllers against a bare store, for the controllers' tests.

`Controllers` builds the controllers a test names over a `Store` on a `ManualClock`, runs their
informers as tasks, and `settle(check)` lets them work until `check()` holds, with a deadline in
loop iterations (no wall-clock timing): positive evidence first, as every waiting test does.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable
from typing import Any

from gpuhealth.clock import ManualClock
from simulator.apiserver.store import Store, format_timestamp
from simulator.fleet.events_recorder import EventRecorder
from simulator.fleet.timers import Timers


class Controllers:
    def __init__(self) -> None:
        self.clock = ManualClock()
        self.store = Store(self.clock, seed=3)
        self.timers = Timers(self.clock)
        self.timers.start_time()
        self.rng = random.Random(5)
        self.running: list[Any] = []
        self._tasks: list[asyncio.Task[None]] = []

    def recorder(self, component: str) -> EventRecorder:
        return EventRecorder(self.store, component, self.timers.wall)

    def suffix(self) -> str:
        return "".join(self.rng.choice("bcdfghjklmnpqrstvwxz2456789") for _ in range(5))

    def start(self, *controllers: Any) -> None:
        for controller in controllers:
            self.running.append(controller)
            for informer in controller.informers:
                self._tasks.append(asyncio.create_task(informer.run()))

    async def settle(self, check: Callable[[], bool], *, rounds: int = 2000) -> None:
        for _ in range(rounds):
            await asyncio.sleep(0)
            if check():
                return
        raise AssertionError("the controllers did not reach the expected state")

    async def advance(self, seconds: float) -> None:
        await self.timers.advance(seconds)

    async def stop(self) -> None:
        for controller in self.running:
            controller.close()
        for task in self._tasks:
            await asyncio.wait_for(task, 5)

    # ---- helpers for what the scheduler and the kubelet would do

    def pods(self, namespace: str = "default", selector: str | None = None) -> list[dict[str, Any]]:
        return self.store.list("pods", namespace, label_selector=selector)[0]

    def make_ready(self, name: str, namespace: str = "default", ready: bool = True) -> None:
        ts = format_timestamp(self.clock.now())

        def fn(obj: dict[str, Any]) -> None:
            obj["spec"].setdefault("nodeName", "n1")
            obj["status"] = {
                "phase": "Running",
                "conditions": [
                    {"type": "Ready", "status": "True" if ready else "False", "lastTransitionTime": ts}
                ],
            }

        self.store.mutate("pods", name, namespace, fn)

    def finish(self, name: str, phase: str, namespace: str = "default") -> None:
        def fn(obj: dict[str, Any]) -> None:
            obj["status"] = {"phase": phase}

        self.store.mutate("pods", name, namespace, fn)


def template(app: str, image: str = "registry.example/app:1") -> dict[str, Any]:
    return {
        "metadata": {"labels": {"app": app}},
        "spec": {"containers": [{"name": "main", "image": image}]},
    }
