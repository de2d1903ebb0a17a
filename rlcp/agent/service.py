"""`AgentService`: the agent assembled, and its reads.

The composition root, as `controller.py` is the controller's: it builds the gate, the
records and the weight state, hands each family of operations (`rlcp/agent/operations/`) the
context and the engine capability it uses, and answers the reads (state, readiness, pause,
version) from what those keep, never by asking an engine that may be busy reloading weights.
The admin routes call the operations through it (`service.control.pause(...)`).
"""

from __future__ import annotations

import uuid

from rlcp.agent.context import AgentContext
from rlcp.agent.engine.base import Engine
from rlcp.agent.gate import EngineGate
from rlcp.agent.metrics import AgentMetrics
from rlcp.agent.operations.caches import Caches
from rlcp.agent.operations.control import EngineControl
from rlcp.agent.operations.disk import DiskLoads
from rlcp.agent.operations.lora import Loras
from rlcp.agent.operations.transfer import Transfer
from rlcp.agent.operations.weights import Weights
from rlcp.agent.readiness import Readiness
from rlcp.agent.records import OperationRecords
from rlcp.agent.settings import AgentSettings
from rlcp.agent.weight_state import WeightState
from rlcp.core.wire.agent import AgentState


class AgentService:
    def __init__(self, engine: Engine, settings: AgentSettings, *, inference_url: str | None = None) -> None:
        self.engine = engine
        self.settings = settings
        self.timeouts = settings.timeouts
        self.inference_url = inference_url
        self.instance_id = uuid.uuid4().hex[:12]
        self.metrics = AgentMetrics()
        self.gate = EngineGate(alive=lambda: engine.is_alive(), asleep=lambda: self.control.sleeping)
        self.records = OperationRecords(self.metrics)
        ctx = AgentContext(settings, self.gate, self.records)
        self.weight_state = WeightState(ctx, engine)
        self.readiness = Readiness(settings, engine, self.weight_state, asleep=lambda: self.control.sleeping)
        self.control = EngineControl(ctx, engine)
        self.disk = DiskLoads(ctx, engine, self.weight_state)
        self.weights = Weights(ctx, engine, self.weight_state)
        self.transfer = Transfer(ctx, engine, self.weight_state)
        self.lora = Loras(ctx, engine)
        self.caches = Caches(ctx, engine)

    async def start(self) -> None:
        """Read the engine's initial state once; from here on this agent tracks it."""
        self.disk.start()
        await self.control.start()
        await self.weight_state.start()

    # -- reads ------------------------------------------------------------------------
    @property
    def paused(self) -> bool:
        return self.control.paused

    @property
    def weight_version(self) -> str | None:
        return self.weight_state.version

    @property
    def desired_weight_version(self) -> str | None:
        return self.readiness.desired_version

    def set_desired_version(self, version: str | None) -> None:
        self.readiness.set_desired_version(version)

    def not_ready_reason(self) -> str | None:
        return self.readiness.not_ready_reason()

    def state(self) -> AgentState:
        reason = self.readiness.not_ready_reason()
        return AgentState(
            agent_id=self.settings.agent_id,
            instance_id=self.instance_id,
            model=self.engine.model_name,
            engine=self.engine.kind,
            engine_alive=self.engine.is_alive(),
            ready=reason is None,
            not_ready_reason=reason,
            paused=self.control.paused,
            sleeping=self.control.sleeping,
            requests=self.engine.request_counts(),
            weight_version=self.weight_state.version,
            desired_weight_version=self.readiness.desired_version,
            loras=self.lora.registry.loaded(),
            lora_enabled=self.settings.engine.enable_lora,
            max_loras=self.settings.engine.max_loras if self.settings.engine.enable_lora else None,
            world_size=self.engine.world_size(),
            busy_with=self.gate.busy_with,
            last_operations=self.records.recent(),
            inference_url=self.inference_url,
        )
