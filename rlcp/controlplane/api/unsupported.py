"""The admin routes of one vLLM server (vLLM 0.32's `entrypoints/rl/online/` and
`entrypoints/serve/dev/` routers, and prime-rl's own `/init_broadcaster`) that have no fleet
meaning. Each answers 501 `not_supported`, naming the route, why, and what to call instead,
so code written for one vLLM server stops with a reason rather than a bare 404.

The routes that do have a fleet meaning are in `facade.py`, `facade_rpc.py` and `facade_info.py`; together they
cover every admin route of vLLM's (`tests/controlplane/api/test_facade.py` checks the list against
vLLM's own routers when vLLM is installed; docs/controller.md has the table, route by route).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from aiohttp import web

from rlcp.core.errors import NotSupportedError
from rlcp.core.openapi import RouteTable

api = RouteTable()
_FACADE = "vLLM-compatible facade"

_RELEASE = (
    "a member whose KV cache is released serves nothing yet would still count as serving: the fleet releases "
    "memory only as a whole sleep, which keeps members out of the gateway's fence until a verified wake. "
    "Call POST /sleep?level=1 (then POST /wake_up, or /wake_up?tags=kv_cache last)"
)
_CACHES = (
    "the fleet has no verified reset of this cache on its members (no flavor's driver can do it, and none "
    "reports it); the cache RL steps make stale, the prefix cache, is POST /reset_prefix_cache, and is reset "
    "on every weight update and adapter swap. Reset this one on a worker through its own server"
)
# (method, path, why and what instead)
REFUSED: tuple[tuple[str, str, str], ...] = (
    (
        "POST",
        "/abort_requests",
        "request ids belong to one worker and the fleet does not track them; abort everything "
        "in flight with POST /pause?mode=abort, then POST /resume",
    ),
    (
        "POST",
        "/weight_checker",
        "the controller compares every worker's weight checksums itself on each update "
        "(GET /v1/rl/state: `applied.verified`; a manifest: `expected_checksums` in POST "
        "/v1/rl/update_weights); one worker's checksums: its agent's own /weight_checker",
    ),
    ("POST", "/start_draft_weight_update", "draft-model (speculative decoding) weight updates are not supported"),
    ("POST", "/release_kv_cache_memory", _RELEASE),
    ("POST", "/reset_mm_cache", _CACHES),
    ("POST", "/reset_encoder_cache", _CACHES),
    (
        "POST",
        "/scale_elastic_ep",
        "the fleet scales by membership, not by one engine's expert parallelism: add or "
        "remove workers (discovery), or PUT /v1/rl/placement",
    ),
    ("POST", "/is_scaling_elastic_ep", "the fleet scales by membership: GET /v1/rl/state shows its members"),
    (
        "GET",
        "/fault_tolerance/status",
        "the fleet's health is GET /v1/rl/state (each member's reachability, engine "
        "and last result); one engine's fault tolerance: that worker's own server",
    ),
    (
        "POST",
        "/fault_tolerance/apply",
        "the controller restores failed members itself (the reconciler); one engine's "
        "fault tolerance: that worker's own server",
    ),
    ("GET", "/load", "the fleet's load is GET /v1/rl/state (request counts per member)"),
    ("GET", "/version", "members may run different vLLM versions: GET /v1/rl/workers, or a worker's own /version"),
    ("GET", "/kv_event_sources", "KV events are published by each worker; ask a worker's own server"),
    ("POST", "/start_profile", "profile one worker through its own server"),
    ("POST", "/stop_profile", "profile one worker through its own server"),
    (
        "POST",
        "/init_broadcaster",
        "prime-rl's own NCCL/NIXL broadcaster is served by prime-rl's inference server, not "
        "here; broadcast updates through vLLM's weight-transfer routes "
        "(/init_weight_transfer_engine ...), or update from disk (POST /update_weights "
        '{"weight_dir": ...}, prime-rl\'s filesystem mode)',
    ),
)


def _refusal(method: str, path: str, why: str) -> Callable[[web.Request], Awaitable[web.Response]]:
    async def refuse(request: web.Request) -> web.Response:
        raise NotSupportedError(f"{method} {path} has no fleet meaning here: {why}", field=path)

    refuse.__name__ = f"refuse_{path.strip('/').replace('/', '_')}"
    return refuse


for _method, _path, _why in REFUSED:
    api.route(_method, _path, f"Not supported on a fleet: {_why}.", errors=(501,), tag=_FACADE)(
        _refusal(_method, _path, _why)
    )
