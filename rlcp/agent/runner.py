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
from rlcp.agent.engine.base import Engine
from rlcp.agent.service import AgentService
from rlcp.agent.settings import AgentSettings

log = structlog.get_logger("rlcp.agent.runner")


def build_engine(settings: AgentSettings) -> Engine:
    if settings.engine.kind == "sim":
        from rlcp.agent.engine.sim import SimEngine

        return SimEngine(model_name=settings.engine.model or "sim-model", world_size=settings.engine.sim_world_size,
                         op_latency_s=settings.engine.sim_op_latency_s,
                         token_interval_s=settings.engine.sim_token_interval_s,
                         load_latency_s=settings.engine.sim_load_latency_s)
    from rlcp.agent.engine.vllm_engine import VllmEngine  # imports vllm: only when asked for

    return VllmEngine(settings.engine, settings.inference)


async def _start_site(app: web.Application, host: str, port: int) -> tuple[web.AppRunner, int]:
    runner = web.AppRunner(app, access_log=None, handle_signals=False)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    await site.start()
    bound = runner.addresses[0][1]
    return runner, bound


async def run_agent(settings: AgentSettings, stop: asyncio.Event, *, ports_file: Path | None = None) -> None:
    token = settings.admin.resolved_token()
    structlog.contextvars.bind_contextvars(agent_id=settings.agent_id)
    engine = build_engine(settings)
    runners: list[web.AppRunner] = []
    try:
        await engine.start()
        if settings.engine.kind == "sim":
            from rlcp.agent.engine.sim_inference import build_sim_inference_app

            inference_runner, inference_port = await _start_site(
                build_sim_inference_app(engine), settings.inference.host, settings.inference.port)  # type: ignore[arg-type]
            runners.append(inference_runner)
        else:
            inference_port = engine.inference_port  # type: ignore[attr-defined]
        inference_url = f"http://{settings.inference.host}:{inference_port}"
        service = AgentService(engine, settings, inference_url=inference_url)
        await service.start()
        admin_runner, admin_port = await _start_site(build_admin_app(service, token=token), settings.admin.host,
                                                     settings.admin.port)
        runners.append(admin_runner)
        ports = {"admin_port": admin_port, "inference_port": inference_port, "pid": os.getpid()}
        if ports_file is not None:
            tmp = ports_file.with_suffix(".tmp")
            tmp.write_text(json.dumps(ports))
            tmp.replace(ports_file)  # atomic: a reader never sees half a file
        log.info("agent_ready", engine=engine.kind, model=engine.model_name, **ports)
        await stop.wait()
    finally:
        log.info("agent_stopping")
        for runner in reversed(runners):
            await runner.cleanup()
        await engine.shutdown()
