"""Each fleet's Envoy cluster as the fence makes it: pure code over the state document.

An endpoint is a member inside the fence (`gateway/fence.py`, the Python gateway's own rule),
at its inference address, carrying `rl: {version, worker}` as EDS metadata: Envoy's upstream
filter stamps the version on each request after choosing the host (`X-RL-Expect-Weight-Version`,
which an agent refuses 409 for other weights) and the route copies both onto the answer
(`X-RL-Weight-Version`, `X-RL-Worker`).

Left out, and why (each in `Cluster.left_out`):
- Dynamo members: they take requests through their frontend, pinned by a body field
  (`nvext.backend_instance_id`) that Envoy cannot write; sent unpinned, the frontend's own
  router would pick any instance, inside the fence or not.
- a member whose inference URL has a path or a host that is not an IP address: an EDS endpoint
  is an address and a port (a name would need a DNS cluster per member).
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from rlcp.controlplane.gateway.fence import fence
from rlcp.controlplane.workerspec import request_path
from rlcp.core.wire.controller.state import FleetState, WorkerView

METADATA_NAMESPACE = "rl"  # %UPSTREAM_METADATA(rl:version)% in bootstrap.py


def cluster_name(fleet: str) -> str:
    return f"rl-{fleet}"


@dataclass(frozen=True)
class Endpoint:
    worker: str
    host: str
    port: int
    version: str


@dataclass(frozen=True)
class Cluster:
    name: str
    endpoints: tuple[Endpoint, ...]
    left_out: dict[str, str] = field(default_factory=dict)  # worker -> why Envoy cannot be given it


def address(url: str) -> tuple[str, int] | None:
    """(IP, port) of an inference URL Envoy can reach as an EDS endpoint, else None."""
    parts = urlsplit(url)
    if parts.scheme != "http" or parts.path.strip("/") or parts.hostname is None:
        return None
    host = "127.0.0.1" if parts.hostname == "localhost" else parts.hostname
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return None
    return host, parts.port or 80


def endpoint(view: WorkerView) -> Endpoint | str:
    """The member as an endpoint, or why it cannot be one."""
    if request_path(view.flavor).pinned:
        return f"a {view.flavor} member is reached through its frontend, pinned by a body field Envoy cannot set"
    where = address(view.inference_url or "")
    if where is None:
        return f"inference URL {view.inference_url!r} is not http://<IP>:<port> (EDS takes addresses)"
    return Endpoint(view.id, where[0], where[1], view.weight_version or "")


def fleet_cluster(state: FleetState) -> Cluster:
    _, members = fence(state)
    endpoints, left_out = [], {}
    for view in members:
        made = endpoint(view)
        if isinstance(made, str):
            left_out[view.id] = made
        else:
            endpoints.append(made)
    return Cluster(cluster_name(state.fleet), tuple(sorted(endpoints, key=lambda e: e.worker)), left_out)


def observed(state: FleetState) -> bool:
    """Whether the state says enough to fence by: discovery has synced and every member has
    been read (or failed a read) once. A controller just started knows none of its members'
    versions; serving Envoy its empty fence then would empty the fence Envoy kept."""
    return state.discovery_synced and all(
        w.last_seen is not None or w.last_error is not None or w.last_result is not None for w in state.workers
    )
