"""Assemble and run one agent: engine, service, admin port, inference port.

Start-up order matters: the token is resolved first (a misconfigured agent fails
before it spends 30 s starting an engine), then the engine and its inference port,
then the admin port, so a controller that can reach the admin port can use it.
"""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path

import structlog
from aiohttp import web

from rlcp.agent.admin.app import build_admin_app
from rlcp.agent.engine.factory import build_engine
from rlcp.agent.service import AgentService
from rlcp.agent.settings import AgentSettings
from rlcp.agent.sites import start_site

log = structlog.get_logger("rlcp.agent.runner")


async def run_agent(settings: AgentSettings, stop: asyncio.Event, *, ports_file: Path | None = None) -> None:
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
        admin_runner, admin_port = await start_site(build_admin_app(service, token=token), settings.admin.host,
                                                    settings.admin.port)
        ports = {"admin_port": admin_port, "inference_port": inference_port, "pid": os.getpid()}
        if ports_file is not None:
            tmp = ports_file.with_suffix(".tmp")
            tmp.write_text(json.dumps(ports))
            tmp.replace(ports_file)  # atomic: a reader never sees half a file
        log.info("agent_ready", engine=engine.kind, model=engine.model_name, **ports)
        await stop.wait()
    finally:
        log.info("agent_stopping")
        if admin_runner is not None:
            await admin_runner.cleanup()
        await built.inference.stop()
        await engine.shutdown()
