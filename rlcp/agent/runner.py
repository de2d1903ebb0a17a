"""Assemble and run one agent: engine, service, admin port, inference port.

Start-up order matters: the token is resolved first (a misconfigured agent fails
before it spends 30 s starting an engine), then the engine and its inference port,
then the admin port, so a controller that can reach the admin port can use it.

An agent whose engine has died ends (exit status 3, `exit_on_engine_death`) rather than live on
as a shell answering 503: a dead vLLM engine does not come back in the same process, and every
supervisor restarts a process that exits (the kubelet, Ray's actor restart through
`placement/actor.py`, the local fleet). The restarted agent starts on its configured weights;
the controller converges it before the gateway's fence takes it back.
"""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path

import structlog
from aiohttp import web

from rlcp.agent.admin.app import build_admin_app
from rlcp.agent.engine.base import Engine
from rlcp.agent.engine.factory import build_engine
from rlcp.agent.service import AgentService
from rlcp.agent.settings import AgentSettings
from rlcp.agent.sites import start_site
from rlcp.core.wire.agent.inference import EXIT_ENGINE_DIED

log = structlog.get_logger("rlcp.agent.runner")

_WATCH_S = 0.2  # how often the engine's liveness is looked at (a flag read, no call)
# Between the engine's death and the exit: the answers to the requests it was serving (vLLM's
# 500, the gateway's 502 naming the worker) and the controller's next read (`engine_dead`) get out.
_DEATH_GRACE_S = 1.0


async def run_agent(settings: AgentSettings, stop: asyncio.Event, *, ports_file: Path | None = None) -> int:
    """Serve until `stop` is set (0) or, with `exit_on_engine_death`, the engine dies (EXIT_ENGINE_DIED)."""
    token = settings.admin.resolved_token()
    structlog.contextvars.bind_contextvars(agent_id=settings.agent_id)
    built = build_engine(settings)
    engine = built.engine
    admin_runner: web.AppRunner | None = None
    try:
        await engine.start()
        inference_port = await built.inference.start()
        inference_url = f"http://{settings.inference.host}:{inference_port}"
        service = AgentService(engine, settings, inference_url=inference_url)
        await service.start()
        admin_runner, admin_port = await start_site(
            build_admin_app(service, token=token), settings.admin.host, settings.admin.port
        )
        ports = {"admin_port": admin_port, "inference_port": inference_port, "pid": os.getpid()}
        if ports_file is not None:
            tmp = ports_file.with_suffix(".tmp")
            tmp.write_text(json.dumps(ports))
            tmp.replace(ports_file)  # atomic: a reader never sees half a file
        log.info("agent_ready", engine=engine.kind, model=engine.model_name, **ports)
        return await _serve(stop, engine, exit_on_death=settings.exit_on_engine_death)
    finally:
        log.info("agent_stopping")
        if admin_runner is not None:
            await admin_runner.cleanup()
        await built.inference.stop()
        await engine.shutdown()


async def _serve(stop: asyncio.Event, engine: Engine, *, exit_on_death: bool) -> int:
    stopped = asyncio.create_task(stop.wait(), name="agent-stop")
    try:
        while not stopped.done():
            if exit_on_death and not engine.is_alive():
                log.error(
                    "engine_died",
                    engine=engine.kind,
                    exit_status=EXIT_ENGINE_DIED,
                    action=f"the agent exits in {_DEATH_GRACE_S:g}s for its supervisor to restart it",
                )
                await asyncio.wait({stopped}, timeout=_DEATH_GRACE_S)
                return EXIT_ENGINE_DIED
            await asyncio.wait({stopped}, timeout=_WATCH_S)
        return 0
    finally:
        stopped.cancel()
