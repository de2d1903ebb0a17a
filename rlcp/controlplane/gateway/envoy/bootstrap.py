"""Envoy's bootstrap for the fleet: pure, a dict to write as YAML (`envoy -c bootstrap.yaml`).

Static: one listener, one route table, one EDS cluster per fleet (their assignments come over
ADS from the controller: `xds.py`) and the controller's xDS cluster. What the settings hold is
static in Envoy too: a change of settings is a new bootstrap and a restart (no LDS/RDS/CDS).

The gateway's contract, as far as Envoy holds it (docs/gateway.md, "Envoy"):
- the fence: only the EDS endpoints (the fence's members) take requests; an upstream HTTP
  filter on each cluster stamps `X-RL-Expect-Weight-Version` from the chosen endpoint's
  metadata *after* host selection (a route's `request_headers_to_add` runs before it, empty);
- a 409 (an agent refusing other weights), a refused connection or a reset before any answer is
  retried on another endpoint (`previous_hosts`), `attempts - 1` times, with a short back-off
  and a retry budget that does not overflow (Envoy's defaults: 25 ms, and 3 at once);
- `X-RL-Worker` / `X-RL-Weight-Version` on every answer, from the endpoint's metadata;
- outlier ejection after `outlier_failures` 5xx or connect failures in a row;
- idle connections to workers closed after `gateway.upstream_idle_timeout_s`, before the workers' own
  keep-alive closes them under a request;
- session affinity: a request naming a session (`affinity_header`, else `X-Session-ID`) goes to
  a second cluster over the same EDS resource (`service_name`: one assignment, one ACK),
  balanced by a consistent-hash ring on that header with bounded load (`hash_balance_factor` =
  `affinity_load_factor` x 100); other requests to least-request;
- the admission limit per worker (`max_in_flight_per_worker`): at most that many connections to
  one endpoint per cluster (`per_host_thresholds`), and upstream HTTP/1.1 carries one request
  per connection, so as many requests; more wait in Envoy's queue for that endpoint;
- no member in the fence: 503 at once with `Retry-After: 1` and the JSON error shape
  (Envoy cannot hold a request until an endpoint appears);
- the gateway token (and the admin token, with `accept_admin_token`) by RBAC: 401 otherwise,
  the token removed before the request goes on;
- several fleets: by the header `X-RL-Fleet` (Envoy cannot route on the JSON body's `model`
  without a body-reading filter), else the default fleet.
"""

from __future__ import annotations

import ipaddress
from typing import Any

from rlcp.controlplane.fleetnames import DEFAULT_FLEET
from rlcp.controlplane.gateway.envoy.fence import METADATA_NAMESPACE, cluster_name
from rlcp.controlplane.settings import ControllerSettings
from rlcp.core.wire.agent.inference import EXPECT_VERSION_HEADER

XDS_CLUSTER = "rlcp-xds"
FLEET_HEADER = "x-rl-fleet"
SESSION_HEADERS_AFTER = ("x-session-id",)  # after `affinity_header`, as the Python gateway reads them
SESSIONS_SUFFIX = "-sessions"  # the cluster taking requests that name a session
_T = "type.googleapis.com/"


def _address(host: str, port: int) -> dict[str, Any]:
    return {"socket_address": {"address": host, "port_value": port}}


def _address_type(host: str) -> str:
    """STATIC for an IP address; a name (the controller's Service, in a cluster) is resolved by
    Envoy, again when its address changes (LOGICAL_DNS: one connection to whatever it resolves to)."""
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return "LOGICAL_DNS"
    return "STATIC"


def _seconds(s: float) -> str:
    return f"{s:.6f}s"


def _json_error(code: str, message: str) -> dict[str, Any]:
    return {"json_format": {"error": {"code": code, "message": message}}}


def _upstream_http_options(idle_timeout_s: float) -> dict[str, Any]:
    """After host selection: the chosen endpoint's version on the request (the agents' check);
    idle connections to workers closed before the workers close them (Envoy's default is 1 h,
    the workers' 5 s: `gateway.upstream_idle_timeout_s`)."""
    stamp = {
        "append": {
            "header": {
                "key": EXPECT_VERSION_HEADER.lower(),
                "value": f"%UPSTREAM_METADATA({METADATA_NAMESPACE}:version)%",
            },
            "append_action": "OVERWRITE_IF_EXISTS_OR_ADD",
        }
    }
    return {
        "envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
            "@type": _T + "envoy.extensions.upstreams.http.v3.HttpProtocolOptions",
            "explicit_http_config": {"http_protocol_options": {}},
            "common_http_protocol_options": {"idle_timeout": _seconds(idle_timeout_s)},
            "http_filters": [
                {
                    "name": "envoy.filters.http.header_mutation",
                    "typed_config": {
                        "@type": _T + "envoy.extensions.filters.http.header_mutation.v3.HeaderMutation",
                        "mutations": {"request_mutations": [stamp]},
                    },
                },
                {
                    "name": "envoy.filters.http.upstream_codec",
                    "typed_config": {"@type": _T + "envoy.extensions.filters.http.upstream_codec.v3.UpstreamCodec"},
                },
            ],
        }
    }


def _ring_hash(settings: ControllerSettings) -> dict[str, Any]:
    """Consistent hashing on the session header, bounded load when `affinity_load_factor` is set:
    a host past factor x the mean of requests out takes no more; the ring's next host does."""
    factor = settings.gateway.affinity_load_factor
    config: dict[str, Any] = {"@type": _T + "envoy.extensions.load_balancing_policies.ring_hash.v3.RingHash"}
    if factor is not None:
        config["consistent_hashing_lb_config"] = {"hash_balance_factor": round(factor * 100)}
    return {
        "policies": [
            {"typed_extension_config": {"name": "envoy.load_balancing_policies.ring_hash", "typed_config": config}}
        ]
    }


def _fleet_cluster(fleet: str, settings: ControllerSettings, *, sessions: bool = False) -> dict[str, Any]:
    g = settings.gateway
    breakers: dict[str, Any] = {
        "thresholds": [
            {
                "max_retries": g.envoy.max_retries,
                "max_requests": 1 << 20,
                "max_pending_requests": 1 << 20,
                "max_connections": 1 << 20,
            }
        ]
    }
    if g.max_in_flight_per_worker is not None:
        breakers["per_host_thresholds"] = [{"max_connections": g.max_in_flight_per_worker}]
    cluster: dict[str, Any] = {
        "name": cluster_name(fleet) + (SESSIONS_SUFFIX if sessions else ""),
        "type": "EDS",
        "connect_timeout": _seconds(g.connect_timeout_s),
        # One assignment for both of a fleet's clusters (`service_name`), so one ACK covers both.
        # initial_fetch_timeout 0: Envoy waits for the controller's fence before it serves at
        # all (its default, 15 s, would then serve an empty cluster).
        "eds_cluster_config": {
            "service_name": cluster_name(fleet),
            "eds_config": {"ads": {}, "resource_api_version": "V3", "initial_fetch_timeout": "0s"},
        },
        "circuit_breakers": breakers,
        "typed_extension_protocol_options": _upstream_http_options(g.upstream_idle_timeout_s),
    }
    if sessions:
        cluster["load_balancing_policy"] = _ring_hash(settings)
    else:
        cluster["lb_policy"] = "LEAST_REQUEST"
    if g.outlier_failures:
        cluster["outlier_detection"] = {
            "consecutive_5xx": g.outlier_failures,
            "consecutive_gateway_failure": g.outlier_failures,
            "base_ejection_time": _seconds(g.outlier_backoff_s),
            "max_ejection_time": _seconds(g.outlier_max_backoff_s),
            "interval": _seconds(min(1.0, g.outlier_backoff_s)),
            "max_ejection_percent": 100,
        }
    return cluster


def _routes(fleet: str, settings: ControllerSettings, header: bool) -> list[dict[str, Any]]:
    """The fleet's routes: one per session header (to the ring-hash cluster, hashed on it), in
    the Python gateway's order, then the rest (least-request)."""
    fleet_match = [{"name": FLEET_HEADER, "string_match": {"exact": fleet}}] if header else []
    routes = []
    for session in (settings.gateway.affinity_header.lower(), *SESSION_HEADERS_AFTER):
        route = _route(
            cluster_name(fleet) + SESSIONS_SUFFIX, settings, [*fleet_match, {"name": session, "present_match": True}]
        )
        route["route"]["hash_policy"] = [{"header": {"header_name": session}}]
        routes.append(route)
    routes.append(_route(cluster_name(fleet), settings, fleet_match))
    return routes


def _route(cluster: str, settings: ControllerSettings, headers: list[dict[str, Any]]) -> dict[str, Any]:
    g = settings.gateway
    match: dict[str, Any] = {"prefix": "/"}
    if headers:
        match["headers"] = headers
    meta = f"%UPSTREAM_METADATA({METADATA_NAMESPACE}:{{}})%"
    return {
        "match": match,
        "route": {
            "cluster": cluster,
            "timeout": _seconds(g.request_timeout_s),
            "retry_policy": {
                "retry_on": "connect-failure,refused-stream,reset-before-request,retriable-status-codes",
                "retriable_status_codes": [409],
                "num_retries": g.attempts - 1,
                "retry_host_predicate": [
                    {
                        "name": "envoy.retry_host_predicates.previous_hosts",
                        "typed_config": {
                            "@type": _T + "envoy.extensions.retry.host.previous_hosts.v3.PreviousHostsPredicate"
                        },
                    }
                ],
                # Least-request favours the refusing worker (its 409s are quick): choose again, often.
                "host_selection_retry_max_attempts": 50,
                "retry_back_off": {
                    "base_interval": _seconds(g.envoy.retry_back_off_s),
                    "max_interval": _seconds(g.envoy.retry_back_off_s * 10),
                },
            },
        },
        "response_headers_to_add": [
            {
                "header": {"key": "x-rl-worker", "value": meta.format("worker")},
                "append_action": "OVERWRITE_IF_EXISTS_OR_ADD",
            },
            {
                "header": {"key": "x-rl-weight-version", "value": meta.format("version")},
                "append_action": "OVERWRITE_IF_EXISTS_OR_ADD",
            },
        ],
    }


def _rbac(tokens: list[str]) -> dict[str, Any]:
    principals = [{"header": {"name": "authorization", "string_match": {"exact": f"Bearer {t}"}}} for t in tokens]
    return {
        "name": "envoy.filters.http.rbac",
        "typed_config": {
            "@type": _T + "envoy.extensions.filters.http.rbac.v3.RBAC",
            "rules": {
                "action": "ALLOW",
                "policies": {"token": {"permissions": [{"any": True}], "principals": principals}},
            },
        },
    }


def envoy_bootstrap(
    settings: ControllerSettings,
    *,
    xds_host: str,
    xds_port: int,
    node_id: str = "envoy-0",
    listen_host: str = "127.0.0.1",
    listen_port: int | None = None,
    admin_port: int | None = None,
    admin_token: str | None = None,
) -> dict[str, Any]:
    """The bootstrap of one Envoy in front of every fleet of `settings`, fed by the controller's
    xDS server at `xds_host:xds_port`. Ports default to the `gateway.envoy` settings."""
    e = settings.gateway.envoy
    fleets = [DEFAULT_FLEET, *settings.fleets]
    routes = [route for name in settings.fleets for route in _routes(name, settings, header=True)]
    routes += _routes(DEFAULT_FLEET, settings, header=False)
    manager = _connection_manager(routes, _inference_tokens(settings, admin_token))
    return {
        "node": {"id": node_id, "cluster": "rlcp-gateway"},
        "admin": {"address": _address("127.0.0.1", e.admin_port if admin_port is None else admin_port)},
        "dynamic_resources": {
            "ads_config": {
                "api_type": "GRPC",
                "transport_api_version": "V3",
                "set_node_on_first_message_only": True,
                "grpc_services": [{"envoy_grpc": {"cluster_name": XDS_CLUSTER}}],
            }
        },
        "static_resources": {
            "listeners": [
                {
                    "name": "rl-inference",
                    "address": _address(listen_host, e.listen_port if listen_port is None else listen_port),
                    "filter_chains": [
                        {
                            "filters": [
                                {"name": "envoy.filters.network.http_connection_manager", "typed_config": manager}
                            ]
                        }
                    ],
                }
            ],
            "clusters": [
                _xds_cluster(xds_host, xds_port),
                *(_fleet_cluster(name, settings, sessions=sessions) for name in fleets for sessions in (False, True)),
            ],
        },
    }


def _inference_tokens(settings: ControllerSettings, admin_token: str | None) -> list[str]:
    """As the Python gateway: inference is open unless the gateway has a token; then the admin
    token is accepted too (`accept_admin_token`)."""
    g = settings.gateway
    own = g.resolved_token()
    return [t for t in (own, admin_token if g.accept_admin_token else None) if t] if own else []


def _connection_manager(routes: list[dict[str, Any]], tokens: list[str]) -> dict[str, Any]:
    """The inference listener's HTTP connection manager: the routes, the token check (none
    without tokens), and local replies in this project's error shape."""
    http_filters = ([_rbac(tokens)] if tokens else []) + [
        {
            "name": "envoy.filters.http.router",
            # No x-envoy-* headers to the worker or the client. (Its dynamic stats stay on: they
            # count the requests routed, per response class, which `rlctl` and the local fleet read.)
            "typed_config": {
                "@type": _T + "envoy.extensions.filters.http.router.v3.Router",
                "suppress_envoy_headers": True,
            },
        }
    ]
    return {
        "@type": _T + "envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
        "stat_prefix": "rl",
        "codec_type": "AUTO",
        # A client's X-Request-ID passes to the worker as it is; Envoy does not mint a UUID for
        # every request that has none (the Python gateway does not either).
        "generate_request_id": False,
        "route_config": {
            "name": "rl",
            "virtual_hosts": [
                {
                    "name": "fleet",
                    "domains": ["*"],
                    "routes": routes,
                    "request_headers_to_remove": ["authorization"] if tokens else [],
                }
            ],
        },
        "http_filters": http_filters,
        "local_reply_config": {"mappers": _local_replies()},
    }


def _local_replies() -> list[dict[str, Any]]:
    """Envoy's own answers, in this project's error shape: no capacity (503, Retry-After) and RBAC's refusal (401)."""
    return [
        {
            "filter": {"response_flag_filter": {"flags": ["UH", "NR"]}},
            "status_code": 503,
            "headers_to_add": [
                {"header": {"key": "retry-after", "value": "1"}, "append_action": "OVERWRITE_IF_EXISTS_OR_ADD"}
            ],
            "body_format_override": _json_error(
                "no_capacity",
                "no member of the fleet is inside the weight-version fence now (paused, updating, "
                "or converging); retry after Retry-After",
            ),
        },
        # Envoy's own 403s are RBAC's (local replies only: a worker's 403 passes as it is).
        {
            "filter": {
                "status_code_filter": {
                    "comparison": {"op": "EQ", "value": {"default_value": 403, "runtime_key": "rl.local_403"}}
                }
            },
            "status_code": 401,
            "body_format_override": _json_error("unauthorized", "missing or wrong bearer token"),
        },
    ]


def _xds_cluster(host: str, port: int) -> dict[str, Any]:
    """The controller's xDS server, over HTTP/2 (gRPC)."""
    return {
        "name": XDS_CLUSTER,
        "type": _address_type(host),
        "connect_timeout": "1s",
        "typed_extension_protocol_options": {
            "envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
                "@type": _T + "envoy.extensions.upstreams.http.v3.HttpProtocolOptions",
                "explicit_http_config": {"http2_protocol_options": {}},
            }
        },
        "load_assignment": {
            "cluster_name": XDS_CLUSTER,
            "endpoints": [{"lb_endpoints": [{"endpoint": {"address": _address(host, port)}}]}],
        },
    }
