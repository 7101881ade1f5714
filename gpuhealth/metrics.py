"""Metric family declarations: how every service states what it exposes.

Each service keeps one catalog of `MetricFamily` declarations (`exporter.metrics`,
`responder.metrics`); its code renders or builds its metrics from them, and the rules
tests check every PromQL selector against them. Pure data: no prometheus_client import,
so a checker can read the catalogs without a metrics library.

Names follow Prometheus' data model as client_python spells it: a counter's family is
declared without `_total`, and `MetricFamily.sample_names` gives the series names the
kind adds (`_total`; `_bucket`, `_sum`, `_count`; `_info`).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Literal

Kind = Literal["counter", "gauge", "histogram", "info"]
KINDS: tuple[Kind, ...] = ("counter", "gauge", "histogram", "info")

_SUFFIXES: dict[str, tuple[str, ...]] = {
    "counter": ("_total",),
    "gauge": ("",),
    "histogram": ("_bucket", "_sum", "_count"),
    "info": ("_info",),
}
_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*\Z")
_LABEL = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*\Z")
BUCKET_LABEL = "le"
"""The label every `_bucket` series of a histogram carries besides the declared ones."""


@dataclass(frozen=True, slots=True)
class MetricFamily:
    """One metric family a service exposes."""

    name: str
    """Family name, without the suffixes its kind adds (a counter's `_total`, an info's `_info`)."""
    kind: Kind
    help: str
    """The HELP text: what one sample means, in one line."""
    labels: tuple[str, ...] = ()
    """Label names every sample carries, in the order the code passes values (`le` is implied)."""
    unit: str = ""
    """The base unit the name ends with (`seconds`, `celsius`, `watts`, `bytes`); "" for counts."""

    def __post_init__(self) -> None:
        where = f"metric family {self.name!r}"
        if not _NAME.match(self.name):
            raise ValueError(f"{where}: not a valid metric name")
        if self.kind not in KINDS:
            raise ValueError(f"{where}: kind must be one of {', '.join(KINDS)}, got {self.kind!r}")
        for suffix in _SUFFIXES[self.kind]:
            # client_python appends these itself; declared twice they would read `_total_total`.
            if suffix and self.name.endswith(suffix):
                raise ValueError(f"{where}: a {self.kind} is declared without its {suffix!r} suffix")
        if not self.help.strip() or "\n" in self.help:
            raise ValueError(f"{where}: help must be one non-empty line")
        if len(set(self.labels)) != len(self.labels):
            raise ValueError(f"{where}: duplicate label names in {self.labels}")
        for label in self.labels:
            if not _LABEL.match(label) or label.startswith("__"):
                raise ValueError(f"{where}: {label!r} is not a valid label name")
        if self.kind == "histogram" and BUCKET_LABEL in self.labels:
            raise ValueError(f"{where}: {BUCKET_LABEL!r} is the histogram's own bucket label")
        if self.unit and not self.name.endswith(f"_{self.unit}"):
            raise ValueError(f"{where}: the name must end with its unit _{self.unit}")

    @property
    def sample_names(self) -> tuple[str, ...]:
        """The series names this family exposes."""
        return tuple(self.name + suffix for suffix in _SUFFIXES[self.kind])

    @property
    def exposed_name(self) -> str:
        """The name on the family's HELP and TYPE lines in text format 0.0.4 (client_python's too)."""
        return self.sample_names[0] if self.kind in ("counter", "info") else self.name

    @property
    def text_type(self) -> str:
        """The type on the TYPE line in text format 0.0.4, which has no `info` type."""
        return "gauge" if self.kind == "info" else self.kind

    def sample_labels(self, sample_name: str) -> frozenset[str]:
        """Label names a series of this family carries (`le` on a histogram's buckets)."""
        if sample_name not in self.sample_names:
            raise KeyError(f"{sample_name!r} is not a series of {self.name!r}")
        if self.kind == "histogram" and sample_name.endswith("_bucket"):
            return frozenset((*self.labels, BUCKET_LABEL))
        return frozenset(self.labels)


class Catalog:
    """An immutable set of families whose family names and series names are all unique."""

    def __init__(self, families: Iterable[MetricFamily]) -> None:
        self._families: dict[str, MetricFamily] = {}
        self._by_sample: dict[str, MetricFamily] = {}
        for family in families:
            if family.name in self._families:
                raise ValueError(f"metric family {family.name!r} is declared twice")
            for sample in family.sample_names:
                other = self._by_sample.get(sample)
                if other is not None:
                    raise ValueError(f"series {sample!r} belongs to both {other.name!r} and {family.name!r}")
                self._by_sample[sample] = family
            self._families[family.name] = family

    @classmethod
    def union(cls, *catalogs: Catalog) -> Catalog:
        """One catalog of every family in `catalogs` (a name declared by two services is refused)."""
        return cls(family for catalog in catalogs for family in catalog)

    def __iter__(self) -> Iterator[MetricFamily]:
        return iter(self._families.values())

    def __len__(self) -> int:
        return len(self._families)

    def __contains__(self, name: object) -> bool:
        return name in self._families

    def __getitem__(self, name: str) -> MetricFamily:
        """The family named `name` (without the suffixes of its kind)."""
        return self._families[name]

    def family_of(self, sample_name: str) -> MetricFamily | None:
        """The family that exposes series `sample_name`, or None when none here does."""
        return self._by_sample.get(sample_name)

    @property
    def sample_names(self) -> frozenset[str]:
        """Every series name the catalog's families expose."""
        return frozenset(self._by_sample)
