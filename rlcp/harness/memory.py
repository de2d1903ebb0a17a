"""A fleet without sockets: real agents (service, admin handlers) on SimEngine, reached by the
controller through `MemoryTransport`, and a controller built without its HTTP API.

Operation and reconcile logic run here exactly as in production -- the same drivers, fan-out,
deadlines and retries, the agent's own route handlers and service -- but every call is a
coroutine call in this process, so a test of a partial failure or a convergence takes
milliseconds. Tests of the wire itself (HTTP, middlewares, tokens) use `simfleet`.

    fleet = await MemoryFleet.start(3, roots=[tmp_path])
    ctl = fleet.controller(tmp_path)
    result = await update_weights(ctl, UpdateWeightsRequest(...))
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

from aiohttp import web
from aiohttp.test_utils import make_mocked_request

from rlcp.agent.admin.app import build_admin_app
from rlcp.agent.engine.sim import SimEngine
from rlcp.agent.service import AgentService
from rlcp.agent.settings import AgentSettings
from rlcp.controlplane.controller import Controller
from rlcp.controlplane.persistence.memory import MemoryStore
from rlcp.controlplane.settings import ControllerSettings
from rlcp.controlplane.workers.transport import CallPolicy, MemoryTransport, WorkerTransport
from rlcp.controlplane.workerspec import WorkerSpec
from rlcp.core.errors import ApiError
from rlcp.harness.controller import TEST_WORKER_CALLS
from rlcp.harness.faults import FaultRules, injected_body
from rlcp.harness.simfleet import CHANGES_NOTHING, TEST_TIMEOUTS, TOKEN


class _ContentStream:
    """The request body as aiohttp's request reads it (`readany` until empty)."""

    def __init__(self, data: bytes) -> None:
        self._data = data

    async def readany(self) -> bytes:
        data, self._data = self._data, b""
        return data

    def set_read_chunk_size(self, size: int) -> None:
        pass

    def at_eof(self) -> bool:
        return not self._data


@dataclass
class MemoryAgent:
    """One agent: the real service and admin handlers over a SimEngine, answering in-process."""

    agent_id: str
    roots: list[Path]
    engine_kwargs: dict[str, Any] = field(default_factory=dict)
    faults: FaultRules = field(default_factory=FaultRules)
    touched: list[str] = field(default_factory=list)  # every mutating call that reached the agent
    calls: list[str] = field(default_factory=list)  # every call that reached the agent, reads too

    def spec(self) -> WorkerSpec:
        # An inference URL only names where rollouts would go: the gateway fence needs one.
        return WorkerSpec(
            id=self.agent_id,
            admin_url=f"memory://{self.agent_id}",
            flavor="agent",
            inference_url=f"memory://{self.agent_id}/inference",
        )

    async def start(self) -> MemoryAgent:
        self.engine = SimEngine(model_name="sim", **self.engine_kwargs)
        await self.engine.start()
        sections: dict[str, Any] = {
            "engine": {"kind": "sim", "model": "sim"},
            "admin": {"token": TOKEN},
            "timeouts": TEST_TIMEOUTS,
        }  # validated as a config file's are
        settings = AgentSettings(agent_id=self.agent_id, allowed_roots=self.roots, **sections)
        self.service = AgentService(self.engine, settings)
        await self.service.start()
        self.app = build_admin_app(self.service, token=TOKEN)
        self.app.freeze()
        return self

    async def stop(self) -> None:
        await self.engine.shutdown()

    async def restart(self) -> None:
        """A fresh process image: base weights, no adapters, unpaused."""
        await self.stop()
        await self.start()

    async def handle(self, method: str, path: str, params: dict[str, str], body: Any) -> tuple[int, Any]:
        """One admin call: the fault rules first, then the agent's own route handler."""
        fault = self.faults.take(method, path)
        if fault is not None:
            self.faults.log(method, path, fault.kind)
            if fault.kind == "status":
                return fault.status, json.loads(injected_body(fault.status))
            if fault.kind == "hang":
                await asyncio.sleep(3600)
            if fault.kind == "delay":
                await asyncio.sleep(fault.delay_s)
            if fault.kind == "reset":
                raise ConnectionResetError(f"{self.agent_id}: connection reset (injected)")
        self.calls.append(f"{method} {path}")
        if method != "GET" and f"{method} {path}" not in CHANGES_NOTHING:
            self.touched.append(f"{method} {path}")
        target = path + ("?" + urlencode(params) if params else "")
        probe = make_mocked_request(method, target, app=self.app)
        match = await self.app.router.resolve(probe)
        if match.http_exception is not None:
            return match.http_exception.status, {"error": {"code": "not_found", "message": match.http_exception.reason}}
        data = b"" if body is None else json.dumps(body).encode()
        payload: Any = _ContentStream(data)  # typed a StreamReader; aiohttp only calls its readany()
        request = make_mocked_request(
            method,
            target,
            app=self.app,
            match_info=dict(match),
            headers={"Content-Type": "application/json"},
            payload=payload,
        )
        try:
            response = await match.handler(request)
        except ApiError as exc:
            return exc.status, exc.body()
        assert isinstance(response, web.Response)
        text = response.text or ""
        return response.status, json.loads(text) if text else None


@dataclass
class MemoryFleet:
    agents: dict[str, MemoryAgent]

    @classmethod
    async def start(cls, n: int, *, roots: list[Path], **engine_kwargs: Any) -> MemoryFleet:
        agents = await asyncio.gather(
            *(MemoryAgent(f"w{i}", roots, engine_kwargs=dict(engine_kwargs)).start() for i in range(n))
        )
        return cls({a.agent_id: a for a in agents})

    def __getitem__(self, agent_id: str) -> MemoryAgent:
        return self.agents[agent_id]

    def specs(self) -> list[WorkerSpec]:
        return [a.spec() for a in self.agents.values()]

    def transport(self, spec: WorkerSpec, policy: CallPolicy) -> WorkerTransport:
        return MemoryTransport(worker_id=spec.id, handler=self.agents[spec.id].handle, policy=policy)

    def controller(self, tmp_path: Path, **overrides: Any) -> Controller:
        """A controller over this fleet, without its HTTP API or background loops: a test
        calls operations on it and drives `refresh` / `reconciler.reconcile_once` itself."""
        base: dict[str, Any] = dict(
            workers=dict(TEST_WORKER_CALLS),
            reconcile={"backoff_initial_s": 0.05, "backoff_max_s": 0.2},
            store={"kind": "memory"},
            allowed_roots=[str(tmp_path)],
            log_format="console",
            log_level="warning",
            gateway={"enabled": False},
        )
        ctl = Controller(ControllerSettings(**(base | overrides)), transports=self.transport, store=MemoryStore())
        ctl.apply_membership(self.specs())
        return ctl

    async def stop(self) -> None:
        await asyncio.gather(*(a.stop() for a in self.agents.values()))
