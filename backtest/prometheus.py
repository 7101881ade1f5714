"""Reading a window of history from Prometheus' HTTP API: the adapter of `gpuhealth backtest`.

`query_range` page by page (`window.Window.pages`: no query over Prometheus' 11,000 points per
series) for the times of a series' samples, with a line of progress per page on long windows;
the series of a selector in a window (`/api/v1/series`).
Standard library HTTP, one blocking request at a time: a backtest is one person's command, not a
service. Every failure is a `PrometheusError` whose message says what to check.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from typing import Any

from backtest.window import Window
from gpuhealth.kube.meta import rfc3339_seconds

Series = tuple[dict[str, str], list[float]]
"""(labels, the timestamps of its samples)."""


class PrometheusError(RuntimeError):
    """Prometheus could not be reached or refused a query; the message says what to check."""


class PrometheusReader:
    def __init__(
        self, url: str, *, timeout: float = 60.0, progress: Callable[[str], None] = lambda line: None
    ) -> None:
        parts = urllib.parse.urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise PrometheusError(f"--prometheus-url {url!r}: expected http(s)://HOST[:PORT][/PATH]")
        self._url, self._timeout, self._progress = url.rstrip("/"), timeout, progress

    @property
    def url(self) -> str:
        return self._url

    def _get(self, path: str, params: dict[str, str]) -> Any:
        address = f"{self._url}{path}?{urllib.parse.urlencode(params)}"
        try:
            with urllib.request.urlopen(address, timeout=self._timeout) as response:
                raw = response.read()
        except urllib.error.HTTPError as exc:
            detail = _error_of(exc.read())
            if detail:
                raise PrometheusError(f"Prometheus at {self._url} refused {path}: {detail}") from None
            raise PrometheusError(
                f"{self._url} answered HTTP {exc.code} to {path}: check --prometheus-url (the server's "
                "base URL, without /api/v1)"
            ) from None
        except (OSError, urllib.error.URLError) as exc:
            reason = getattr(exc, "reason", exc)
            raise PrometheusError(
                f"cannot reach Prometheus at {self._url} ({reason}): check --prometheus-url"
            ) from None
        try:
            answer = json.loads(raw)
        except ValueError:
            answer = None
        if not isinstance(answer, dict) or answer.get("status") != "success" or "data" not in answer:
            raise PrometheusError(
                f"{self._url}{path} does not answer as Prometheus' HTTP API: check --prometheus-url "
                "(the server's base URL, without /api/v1)"
            )
        return answer["data"]

    def sample_times(self, selector: str, window: Window, *, what: str) -> list[Series]:
        """Every series of the vector selector `selector` over `window` with the times of its own
        samples, read page by page (a series in several pages comes once per page:
        `responder.replay.history.firings` merges them).

        The times are `timestamp()`'s, not the query's grid: a range query repeats a series' last
        sample for the lookback delta (5 minutes) after it, wherever no staleness marker ends it
        (backfilled history, a Prometheus restart), which would lengthen every episode."""
        pages = window.pages()
        out: list[Series] = []
        for number, (start, end) in enumerate(pages, 1):
            if len(pages) > 1:
                self._progress(
                    f"reading {what}: page {number}/{len(pages)} "
                    f"({rfc3339_seconds(start)} to {rfc3339_seconds(end)})"
                )
            data = self._get(
                "/api/v1/query_range",
                {
                    "query": f"timestamp({selector})",
                    "start": f"{start:.3f}",
                    "end": f"{end:.3f}",
                    "step": f"{window.step:g}",
                },
            )
            for item in data.get("result", ()):
                out.append((dict(item["metric"]), [float(v) for _, v in item.get("values", ())]))
        return out

    def series(self, selector: str, start: float, end: float, *, limit: int = 0) -> list[dict[str, str]]:
        """The label sets of the series of `selector` with a sample within [start, end] (the
        index only: no sample is loaded, whatever the window's length); `limit` 0 for all."""
        params = {"match[]": selector, "start": f"{start:.3f}", "end": f"{end:.3f}"}
        if limit:
            params["limit"] = str(limit)
        return [dict(labels) for labels in self._get("/api/v1/series", params)]


def _error_of(raw: bytes) -> str:
    try:
        answer = json.loads(raw)
    except ValueError:
        return ""
    return str(answer.get("error", "")) if isinstance(answer, dict) else ""
