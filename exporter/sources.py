"""The choices of the exporter's two node sources, `--nvml` and `--pod-resources`, keyed by scheme.

A value is a bare name (`auto`, `none`, `pynvml`) or `SCHEME:TARGET` (`unix:///PATH`); each
names a `Choice` of its flag's `Sources`, which builds the reader for a node. The product
registers its own choices here; whoever launches an exporter may add more: the `gpuhealth`
command adds the test harness's `sim:URL` (a simulated node's NVML and kubelet over HTTP,
`gpuhealth_cli.sources`) where the harness imports, and where it does not, refuses `sim:` with
the reason. The settings check a value against these (`exporter.settings`), the command line
opens the reader (`exporter.cli`); neither names a scheme of its own.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

from exporter.podresources import PodResourcesSource
from gpuhealth.nvml import NvmlSource

T = TypeVar("T")


@dataclass(frozen=True)
class Choice(Generic[T]):
    """One way a flag's value names a source."""

    scheme: str
    """The bare value (`pynvml`), or what precedes the colon of `SCHEME:TARGET` (`unix`)."""
    form: str
    """How the help and errors spell it (`pynvml`, `unix:///PATH (the kubelet's socket)`)."""
    open: Callable[[str, str], T | None]
    """(target, node) -> the node's reader, not started; None: no reader. ValueError for a
    target it cannot read."""
    target: re.Pattern[str] | None = None
    """What follows `SCHEME:` must match this whole; None: a bare value, nothing follows."""
    one_node: bool = False
    """It reads one node's source, so the exporter must run in node mode (`--node`)."""


class Sources(Generic[T]):
    """A flag's choices, in the order the help lists them."""

    def __init__(self, *choices: Choice[T]) -> None:
        self._choices: dict[str, Choice[T]] = {}
        self._refused: dict[str, str] = {}
        for choice in choices:
            self.add(choice)

    def add(self, choice: Choice[T]) -> None:
        """Offer `choice` (replacing one of its scheme, or a refusal of it)."""
        self._refused.pop(choice.scheme, None)
        self._choices[choice.scheme] = choice

    def refuse(self, scheme: str, reason: str) -> None:
        """Answer a value of `scheme` with `reason` (a choice this installation lacks)."""
        self._choices.pop(scheme, None)
        self._refused[scheme] = reason

    def expected(self) -> str:
        """The choices as the help and errors list them: `a, b or c`."""
        forms = [c.form for c in self._choices.values()]
        return forms[0] if len(forms) == 1 else f"{', '.join(forms[:-1])} or {forms[-1]}"

    def choice(self, value: str) -> Choice[T]:
        """The choice `value` names; ValueError saying what is expected (or why it is refused)."""
        scheme, colon, target = value.partition(":")
        if scheme in self._refused and colon:
            raise ValueError(f"{value!r}: {self._refused[scheme]}")
        choice = self._choices.get(scheme)
        if choice is not None and (
            not colon if choice.target is None else bool(colon and choice.target.fullmatch(target))
        ):
            return choice
        raise ValueError(f"{value!r}: expected {self.expected()}")

    def open(self, value: str, node: str) -> T | None:
        """The reader `value` names for `node`; ValueError for a value or target it cannot read."""
        return self.choice(value).open(value.partition(":")[2], node)


def _pynvml(_target: str, _node: str) -> NvmlSource:
    from exporter.nvml_pynvml import PynvmlSource

    return PynvmlSource()


def _kubelet(target: str, node: str) -> PodResourcesSource:
    from exporter.podresources_kubelet import KubeletPodResources

    return KubeletPodResources(target.removeprefix("//"), node)


def _nothing(_target: str, _node: str) -> None:
    return None


NVML: Sources[NvmlSource] = Sources(
    Choice("auto", "auto", _pynvml),  # pynvml where a driver is present: a failed start is no NVML
    Choice("none", "none", _nothing),
    Choice("pynvml", "pynvml", _pynvml),
)
"""`--nvml`, `NvmlSettings.source`."""

POD_RESOURCES: Sources[PodResourcesSource] = Sources(
    Choice("none", "none", _nothing),
    # unix:///var/lib/kubelet/pod-resources/kubelet.sock: the socket by its absolute path.
    Choice("unix", "unix:///PATH (the kubelet's socket)", _kubelet, re.compile(r"///\S+")),
)
"""`--pod-resources`, `ExporterSettings.pod_resources`."""
