"""Members from an sglang-router's own worker list (`GET {router}/workers`, SGLang's model gateway).

slime and Miles start an sglang-router and register each SGLang server they launch with it
(`POST {router}/workers {url, worker_type}`, `slime/backends/sglang_utils/sglang_engine.py`), and
read the same list back to abort rollouts (`slime/rollout/sglang_rollout.py`). That list is the one
place outside slime's Ray job where the servers' addresses are written down (its engine actors are
unnamed: docs/ray.md), so the controller reads it: `discovery.kind: http_listing` with
`format: sglang_router`, polled by `HttpListingSource` like any listing.

The router's answer (sglang-router 0.3.2, read from the running binary):
`{"workers": [{"id", "url", "model_id", "worker_type", "is_healthy", "metadata": {"tp_size", ...},
...}], "total", "stats"}`.

    parse_router_workers   router answer -> [WorkerSpec]   (pure; bad entries skipped)
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import ValidationError

from rlcp.controlplane.discovery.polling import PollFailed, good_entries
from rlcp.controlplane.workerspec import WorkerSpec
from rlcp.core.labels import labels_from


def parse_router_workers(body: Any, *, error: type[PollFailed]) -> list[WorkerSpec]:
    """Each worker the router lists as a member of flavor `sglang`, its URL both admin and inference
    URL. A malformed top level raises `error`; one bad entry is logged and skipped.

    The member id is the worker's URL, not the router's `id`: the router makes a new UUID each time
    a server is registered, so a slime engine that re-registers after a restart would otherwise look
    like a new member while the old one lingered; the URL is what slime itself matches workers by.
    Every listed worker is a member whatever its `is_healthy` (slime turns the router's health check
    off): whether a member serves is for the controller's own status reads to say."""
    if not isinstance(body, Mapping):
        raise error(f"router worker list is a {type(body).__name__}, not an object")
    entries = body.get("workers")
    if not isinstance(entries, list):
        raise error("router answer has no 'workers' list (is the URL the router's /workers?)")
    return good_entries(entries, _parse_worker, key="url", event="router_worker_skipped")


def _parse_worker(entry: Any) -> tuple[WorkerSpec | None, str]:
    if not isinstance(entry, Mapping):
        return None, "entry is not an object"
    url = entry.get("url")
    if not isinstance(url, str) or not url.startswith(("http://", "https://")):
        # a gRPC worker (`grpc://`) speaks no HTTP admin route the sglang driver could call
        return None, f"url {url!r} is not an http(s) URL"
    url = url.rstrip("/")
    model = entry.get("model_id")
    worker_type = entry.get("worker_type")
    try:
        spec = WorkerSpec(
            id=url,
            admin_url=url,
            inference_url=url,
            flavor="sglang",
            world_size=_tp_size(entry.get("metadata")),
            model=model if isinstance(model, str) and model else None,
            # prefill / decode in a PD-disaggregated fleet: a selector can pick one side
            labels=labels_from({"worker_type": worker_type} if isinstance(worker_type, str) else None),
        )
    except (ValidationError, ValueError) as exc:
        return None, str(exc)
    return spec, ""


def _tp_size(metadata: Any) -> int:
    """The server's TP size, which the router read from its `/server_info` (as a string): the
    member's `world_size` for a broadcast (docs/controller.md, "SGLang: broadcast updates").
    1 when the router does not say."""
    raw = metadata.get("tp_size") if isinstance(metadata, Mapping) else None
    try:
        size = int(raw) if isinstance(raw, (str, int)) and not isinstance(raw, bool) else 1
    except ValueError:
        return 1
    return size if size >= 1 else 1
