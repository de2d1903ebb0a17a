"""The flavor tests' stand-in wire (aioresponses that records bodies), and helpers to build a
driver over it and read what it sent."""

from __future__ import annotations

import asyncio
from typing import Any
from unittest.mock import Mock

import aiohttp
from aioresponses import CallbackResult, aioresponses

from rlcp.controlplane.deadlines import DriverDeadlines
from rlcp.controlplane.settings.workers import WorkerCallSettings
from rlcp.controlplane.workers.registry import make_driver
from rlcp.controlplane.workers.transport import CallPolicy, HttpTransport
from rlcp.controlplane.workerspec import WorkerSpec

BASE = "http://w0:8101"
POLICY = CallPolicy(timeout_s=0.5, attempts=3, backoff_initial_s=0.001, backoff_max_s=0.002)
GRACE_S = WorkerCallSettings().deadline_grace_s  # the default


class _Response(aiohttp.ClientResponse):
    """aioresponses 0.7.9 builds responses without the `stream_writer` aiohttp 3.14 requires
    (pnuckowski/aioresponses#289, fix pending in #288); aiohttp only reads its output_size."""

    def __init__(self, *args: Any, stream_writer: Any = None, **kwargs: Any) -> None:
        super().__init__(*args, stream_writer=stream_writer or Mock(output_size=0), **kwargs)


class RecordingWire(aioresponses):
    def add(self, *args: Any, response_class: Any = None, **kwargs: Any) -> None:
        super().add(*args, response_class=response_class or _Response, **kwargs)


def make(flavor: str, session: aiohttp.ClientSession, **options: Any):
    spec = WorkerSpec(id="w0", admin_url=BASE, flavor=flavor)
    transport = HttpTransport(session=session, worker_id="w0", base_url=BASE, token="tok", policy=POLICY)
    return make_driver(
        spec, transport, DriverDeadlines(weight_load_s=options.get("weight_load_timeout_s", 600.0), grace_s=GRACE_S)
    )


def sent(m: aioresponses) -> list[tuple[str, str, Any]]:
    """(method, URL with query, JSON body) of every request, in order of first use of each URL."""
    return [
        (method, str(url), call.kwargs.get("json")) for (method, url), calls in m.requests.items() for call in calls
    ]


def slow(delay_s: float, payload: Any = None):
    async def callback(url, **kwargs):
        await asyncio.sleep(delay_s)
        return CallbackResult(payload=payload if payload is not None else {}, response_class=_Response)

    return callback
