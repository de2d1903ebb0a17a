"""In-process fleets of real agents on SimEngine, for controller tests.

Each `SimAgent` is the real agent (service + admin app) on a SimEngine, served on a
loopback port, with a fault layer in front of it that tests steer: answer 500, hang,
or reset the connection on a route; and it records every mutating call that reached
the agent, so a test can assert that a rejected request touched no worker.
"""

from __future__ import annotations

import asyncio
import socket
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from aiohttp import web
from safetensors.numpy import save_file

from agents.admin.app import build_admin_app
from agents.engine.sim import SimEngine
from agents.service import AgentService
from agents.settings import AgentSettings

TOKEN = "agent-token"


def write_checkpoint(directory: Path, seed: int) -> Path:
    """A small real safetensors checkpoint (SimEngine digests its bytes)."""
    directory.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    save_file({"model.embed.weight": rng.standard_normal((8, 4)).astype(np.float32),
               "model.layers.0.weight": rng.standard_normal((4, 4)).astype(np.float32)},
              str(directory / "model.safetensors"))
    return directory


def write_adapter(directory: Path) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "adapter_config.json").write_text('{"r": 8, "peft_type": "LORA"}')
    return directory


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Fault:
    kind: str  # "status" | "hang" | "reset"
    status: int = 500
    times: int | None = None  # None: until cleared


@dataclass
class SimAgent:
    agent_id: str
    roots: list[Path]
    port: int = 0  # bound at the first start, kept across restarts
    engine_kwargs: dict[str, Any] = field(default_factory=dict)
    faults: dict[str, Fault] = field(default_factory=dict)
    touched: list[str] = field(default_factory=list)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def spec(self) -> dict:
        return {"id": self.agent_id, "admin_url": self.url, "flavor": "agent"}

    async def start(self) -> SimAgent:
        self.engine = SimEngine(model_name="sim", **self.engine_kwargs)
        await self.engine.start()
        settings = AgentSettings(agent_id=self.agent_id, engine={"kind": "sim", "model": "sim"},
                                 allowed_roots=self.roots, admin={"token": TOKEN},
                                 timeouts={"pause_s": 30, "control_s": 10, "weight_load_s": 30})
        self.service = AgentService(self.engine, settings)
        await self.service.start()
        app = build_admin_app(self.service, token=TOKEN)
        app.middlewares.insert(0, self._fault_layer)
        self.runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.5)
        await self.runner.setup()
        await web.TCPSite(self.runner, "127.0.0.1", self.port, reuse_address=True).start()
        self.port = self.runner.addresses[0][1]
        return self

    async def stop(self) -> None:
        await self.runner.cleanup()
        await self.engine.shutdown()

    async def restart(self) -> None:
        """A fresh process image: base weights, no adapters, unpaused, same address."""
        await self.stop()
        await self.start()

    @web.middleware
    async def _fault_layer(self, request: web.Request, handler: Any) -> web.StreamResponse:
        fault = self.faults.get(request.path)
        if fault is not None:
            if fault.times is not None:
                fault.times -= 1
                if fault.times <= 0:
                    del self.faults[request.path]
            if fault.kind == "status":
                return web.json_response({"error": {"code": "injected", "message": "injected failure"}},
                                         status=fault.status)
            if fault.kind == "hang":
                await asyncio.sleep(3600)
            if fault.kind == "reset":
                assert request.transport is not None
                request.transport.abort()
                raise asyncio.CancelledError
        if request.method != "GET":
            self.touched.append(f"{request.method} {request.path}")
        return await handler(request)


async def start_fleet(n: int, roots: list[Path], **engine_kwargs: Any) -> list[SimAgent]:
    return list(await asyncio.gather(*(SimAgent(f"w{i}", roots, engine_kwargs=dict(engine_kwargs)).start()
                                       for i in range(n))))
