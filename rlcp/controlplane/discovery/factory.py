"""The discovery source a controller's settings ask for; each imported only when asked."""

from __future__ import annotations

from typing import TYPE_CHECKING

import aiohttp

from rlcp.controlplane.discovery.base import DiscoverySource
from rlcp.controlplane.settings import ControllerSettings

if TYPE_CHECKING:
    from kubernetes_asyncio.client import ApiClient


def make_source(
    settings: ControllerSettings, session: aiohttp.ClientSession, *, kube_api: ApiClient | None = None
) -> DiscoverySource:
    d = settings.discovery
    if d.kind == "kubernetes":
        from rlcp.controlplane.discovery.kubernetes import EndpointSliceSource

        assert d.kubernetes is not None and kube_api is not None
        return EndpointSliceSource(
            api=kube_api, settings=d.kubernetes, request_timeout_s=settings.kubernetes.request_timeout_s
        )
    if d.kind == "static":
        from rlcp.controlplane.discovery.static import StaticSource

        return StaticSource(d.static)
    if d.kind == "http_listing":
        from rlcp.controlplane.discovery.http_listing import HttpListingSource

        assert d.http_listing is not None
        token = d.http_listing.token.get_secret_value() if d.http_listing.token else None
        return HttpListingSource(
            session=session,
            url=d.http_listing.url,
            interval_s=d.http_listing.interval_s,
            timeout_s=d.http_listing.timeout_s,
            token=token,
            default_flavor=d.http_listing.default_flavor,
            inference_url=d.http_listing.inference_url,
            format=d.http_listing.format,
        )
    if d.kind == "ray":
        from rlcp.controlplane.discovery.ray import RayActorSource

        assert d.ray is not None
        r = d.ray
        return RayActorSource(
            session=session,
            dashboard_url=r.dashboard_url,
            namespace=r.namespace,
            name_prefix=r.name_prefix,
            class_name=r.class_name,
            interval_s=r.interval_s,
            timeout_s=r.timeout_s,
            max_backoff_s=r.max_backoff_s,
            limit=r.limit,
            token=r.token.get_secret_value() if r.token else None,
            default_flavor=r.default_flavor,
            dead_actors=r.dead_actors,
        )
    raise ValueError(f"discovery kind {d.kind!r} is not available in this build")
