"""The loopback webhook recorder that stands in for Alertmanager's receivers.

Aspects covered: a JSON object is recorded with its path and authorization; a body that is
not a JSON object (not JSON, a scalar, an array) is refused with 400 and never recorded,
so readers of the deliveries can rely on an object.
"""

from __future__ import annotations

import urllib.error
import urllib.request

from gpuhealth.testing.loopback import WebhookRecorder

# No `integration` marker: the recorder is an in-process server on loopback, as fast as
# aiohttp's test servers (policy: tests/conftest.py).


def post(url: str, body: bytes) -> int:
    request = urllib.request.Request(url, data=body, headers={"Authorization": "Bearer t"}, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return exc.code


def test_objects_are_recorded_and_anything_else_is_refused() -> None:
    with WebhookRecorder() as recorder:
        assert post(f"{recorder.url}/webhook", b'{"alerts": [{"labels": {"alertname": "A"}}]}') == 200
        for junk in (b"{not json", b"42", b"[1, 2]"):
            assert post(f"{recorder.url}/webhook", junk) == 400
        (delivery,) = recorder.deliveries()
        assert (delivery.path, delivery.authorization) == ("/webhook", "Bearer t")
        assert [a["labels"]["alertname"] for _, a in recorder.alerts("/webhook")] == ["A"]
