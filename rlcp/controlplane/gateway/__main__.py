"""`python -m rlcp.controlplane.gateway` (`rl-gateway`): a standalone gateway that follows a
controller's state, for scaling rollouts out over several replicas behind one Service.

It reads the same settings as the controller (`--config`, `RLCP_*`), of which it uses the
`gateway` section; `gateway.follow_url` names the controller to follow, and the one every
request the gateway does not route is forwarded to (its admin API: one URL, `admin.py`).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from aiohttp import ClientSession

    from rlcp.controlplane.gateway.follow import FollowedState
    from rlcp.controlplane.gateway.proxy import Gateway
    from rlcp.controlplane.settings import ControllerSettings


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="rl-gateway", description=__doc__)
    parser.add_argument("--config", type=Path, help="YAML settings file (env RLCP_* overrides it)")
    parser.add_argument("--port-file", type=Path, help="write the bound port here once serving")
    args = parser.parse_args(argv)

    from rlcp.controlplane.settings import load_settings
    from rlcp.core.entry import settings_or_exit

    settings = settings_or_exit(parser, lambda: load_settings(args.config), check=_check)
    with asyncio.Runner(loop_factory=loop_factory(settings.gateway.event_loop)) as runner:
        runner.run(_serve(settings, args.port_file))
    return 0


def _check(settings: ControllerSettings) -> None:
    if not settings.gateway.follow_url:
        raise ValueError("gateway.follow_url (RLCP_GATEWAY__FOLLOW_URL) must name the controller to follow")
    settings.gateway.resolved_token()


# The heavy imports are made once the settings are read, so `--help` and a settings error answer at once.
async def _serve(settings: ControllerSettings, port_file: Path | None) -> None:
    """Follow the controller's state of each fleet and route by it, until a signal."""
    import structlog

    from rlcp.controlplane.fleetnames import DEFAULT_FLEET, fleet_path
    from rlcp.controlplane.gateway.admin import ControllerLink, forward_to_controller
    from rlcp.controlplane.gateway.app import new_session, start_site
    from rlcp.controlplane.gateway.follow import FollowedState
    from rlcp.core.entry import stop_on_signals
    from rlcp.core.heap import settle

    g = settings.gateway
    stop = stop_on_signals()
    token = g.follow_token.get_secret_value() if g.follow_token else None
    async with new_session(g.upstream_idle_timeout_s) as session:
        # One followed state document per fleet (the settings' `fleets`, as the controller
        # has them: the chart hands both processes one config), each at its fleet's path.
        followed = {
            name: FollowedState(
                session=session,
                url=(g.follow_url or "").rstrip("/") + fleet_path(name),
                interval_s=g.follow_interval_s,
                token=token,
            )
            for name in (DEFAULT_FLEET, *settings.fleets)
        }
        followers = [
            asyncio.create_task(f.run(), name=f"follow-controller-state:{name}") for name, f in followed.items()
        ]
        gateway = _gateway(settings, session, followed, token)
        link = ControllerLink(
            url=g.follow_url or "",
            session=session,
            timeout_s=g.controller_timeout_s,
            connect_timeout_s=g.controller_connect_timeout_s,
        )
        runner = await start_site(gateway, controller=forward_to_controller(link))
        frozen = settle()  # startup's heap, out of the collector's sight (rlcp/core/heap.py)
        structlog.get_logger("rlcp.controlplane.gateway").info(
            "gateway_serving",
            url=gateway.url,
            following=g.follow_url,
            fleets=list(followed),
            heap_frozen=frozen,
            event_loop=type(asyncio.get_running_loop()).__module__.split(".")[0],
        )
        if port_file:
            port_file.write_text(json.dumps({"port": runner.addresses[0][1]}))
        try:
            await stop.wait()
        finally:
            for follower in followers:
                follower.cancel()
            await asyncio.gather(*followers, return_exceptions=True)
            await runner.cleanup()


def _gateway(
    settings: ControllerSettings, session: ClientSession, followed: dict[str, FollowedState], token: str | None
) -> Gateway:
    """The gateway routing each fleet's models by that fleet's followed state."""
    from rlcp.controlplane.fleetnames import DEFAULT_FLEET
    from rlcp.controlplane.gateway.fleets import FleetRoute, ModelRoutes
    from rlcp.controlplane.gateway.metrics import GatewayMetrics
    from rlcp.controlplane.gateway.proxy import Gateway
    from rlcp.controlplane.gateway.routing import Router

    routes = {name: FleetRoute(name, Router(f)) for name, f in followed.items()}
    default, named = routes.pop(DEFAULT_FLEET), list(routes.values())
    # The token it follows the controller with is the controller's: inference takes it too.
    return Gateway(
        router=default.router,
        session=session,
        settings=settings.gateway,
        metrics=GatewayMetrics(),
        admin_token=token,
        fleets=ModelRoutes(default, named) if named else None,
    )


def loop_factory(kind: str) -> Callable[[], asyncio.AbstractEventLoop] | None:
    """The event loop `gateway.event_loop` names (None: asyncio's own)."""
    if kind == "asyncio":
        return None
    try:
        import uvloop
    except ImportError:
        if kind == "uvloop":
            raise SystemExit(
                "rl-gateway: gateway.event_loop is uvloop but uvloop is not installed "
                "(pip install 'rl-controlplane[gateway]')"
            ) from None
        return None
    return uvloop.new_event_loop


if __name__ == "__main__":
    sys.exit(main())
