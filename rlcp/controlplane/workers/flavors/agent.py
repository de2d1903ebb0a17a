"""The `agent` flavor: this project's agent (`rlcp/agent/admin`).

The agent reports everything in one read (`GET /v1/agent/state`), so `status` is one
call parsed with the agent's own wire model; there is no second copy of the shape to
drift. Its extras (disk update with a version, LoRA hot-swap that really frees the
adapter, desired-version gating) live under `/v1/agent`; the weight-transfer calls use
vLLM's RL route shapes at the root, which the agent serves unchanged.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, final
from urllib.parse import quote

from pydantic import ValidationError

from rlcp.controlplane.workers.capabilities import (
    STAGED_UPDATE,
    BroadcastPeer,
    Checksums,
    Control,
    DesiredVersion,
    DiskWeights,
    LoadReport,
    Lora,
    LoraLoaded,
    PrefixCache,
    ServerConfig,
    Sleep,
    StagedUpdate,
    UpdatePlan,
    UpdateReport,
    WeightsKind,
)
from rlcp.controlplane.workers.flavors.base import VllmCacheRoutes, VllmServerInfoRoute, VllmSleepRoutes
from rlcp.controlplane.workers.flavors.vllm_rl import VllmWeightTransferRoutes
from rlcp.controlplane.workers.steps import Step
from rlcp.controlplane.workers.transport import WorkerRejected
from rlcp.controlplane.workers.updates import DeclaredUpdate, UpdateSteps, WaveUpdate
from rlcp.controlplane.workerspec import WorkerStatus
from rlcp.core.wire.agent import (
    AgentState,
    DiskUpdatedAnswer,
    LoraLoadedAnswer,
    PauseMode,
    WeightsUpdatedAnswer,
    checksums_disagree,
)


@final
class AgentDriver(
    VllmServerInfoRoute,
    VllmWeightTransferRoutes,
    VllmSleepRoutes,
    VllmCacheRoutes,
    Control,
    StagedUpdate,
    DeclaredUpdate,
    DiskWeights,
    DesiredVersion,
    Checksums,
    Lora,
    BroadcastPeer,
    Sleep,
    PrefixCache,
    ServerConfig,
):
    """Speaks to one agent's admin port."""

    flavor = "agent"

    loads_with_checksums = True  # its load answers the new weights' checksums when asked
    covers_adapters = True  # its checksums hold each adapter's tensors (`lora:<name>:...`)

    async def status(self) -> WorkerStatus:
        return self._status("GET /v1/agent/state", await self.transport.request("GET", "/v1/agent/state", retry=False))

    def update_steps(self, update: WaveUpdate, wave: Sequence[DiskWeights]) -> UpdateSteps:
        """The disk update in one call (`DeclaredUpdate`): `update_in_one_call`, each worker's
        plan resuming it as the wave says and holding it to the checksums agreed on; it pauses
        in the same call, so a failure may have left it paused (`uncertain`)."""

        def plan(worker_id: str) -> UpdatePlan:
            return UpdatePlan(
                path=update.path,
                version=update.version,
                mode=update.mode,
                pause_timeout_s=update.pause_s,
                checksums=update.checksums,
                resume=update.resumes(worker_id),
                expected_checksums=update.expected_checksums,
            )

        return UpdateSteps(
            Step(
                name="update",
                can=STAGED_UPDATE,
                call=lambda w: w.update_in_one_call(plan(w.spec.id)),
                deadline_s=update.deadlines.update_in_one_call(update.requested_s, checksums=update.checksums),
                observe=_reported_status,
            ),
            uncertain=True,
        )

    def _status(self, call: str, body: Any) -> WorkerStatus:
        try:
            state = AgentState.model_validate(body)
        except ValidationError as exc:
            # A 200 we cannot read is the worker's fault, not the network's: no retry.
            raise WorkerRejected(self.spec.id, f"{call} answered a malformed state: {exc}", status=200) from exc
        return WorkerStatus(
            paused=state.paused,
            weight_version=state.weight_version,
            requests=state.requests,
            loras={lora.name: lora.version for lora in state.loras},
            lora_enabled=state.lora_enabled,
            max_loras=state.max_loras,
            ready=state.ready,
            not_ready_reason=state.not_ready_reason,
            engine_alive=state.engine_alive,
            sleeping=state.sleeping,
            world_size=state.world_size,
            instance_id=state.instance_id,
            model=state.model,
        )

    async def pause(self, mode: PauseMode, timeout_s: float) -> None:
        await self.transport.request(
            "POST",
            "/pause",
            params={"mode": mode, "timeout_s": timeout_s},
            timeout_s=timeout_s + self.deadlines.grace_s,
        )

    async def resume(self) -> None:
        await self.transport.request("POST", "/resume")

    async def update_weights_from_disk(self, path: str, version: str) -> None:
        # Reloading the same directory under the same version is idempotent, so a 5xx
        # is retried; the agent answers 409 while a previous attempt is still running.
        await self.transport.request(
            "POST",
            "/v1/agent/weights/disk",
            json_body={"path": path, "version": version},
            timeout_s=self.deadlines.weight_load_s,
        )

    # -- a staged update: a check, then three calls, each answering what would otherwise be a read --
    async def check_weights(self, path: str, kind: WeightsKind = "weights") -> None:
        # Not retried here: the caller retries a checkpoint that is not there yet on its own
        # schedule, and a worker that cannot be reached will fail its pause just as fast.
        await self.transport.request(
            "POST", "/v1/agent/weights/check", json_body={"path": path, "kind": kind}, retry=False
        )

    async def update_in_one_call(self, plan: UpdatePlan) -> UpdateReport:
        """`POST /v1/agent/weights/update`: the update after the check, in one round trip. Not
        retried: a retry after a lost answer could resume a worker the first attempt held back."""
        body: dict[str, Any] = {
            "path": plan.path,
            "version": plan.version,
            "mode": plan.mode,
            "timeout_s": plan.pause_timeout_s,
            "checksums": plan.checksums,
            "resume": plan.resume,
            "expected_checksums": plan.expected_checksums,
        }
        hashing = plan.checksums or plan.expected_checksums is not None
        try:
            answer = await self.transport.request(
                "POST",
                "/v1/agent/weights/update",
                json_body=body,
                retry=False,
                timeout_s=plan.pause_timeout_s
                + self.deadlines.grace_s
                + (self.deadlines.load_and_hash_s if hashing else self.deadlines.weight_load_s),
            )
        except WorkerRejected as exc:
            if exc.status != 404:
                raise
            return await self._update_in_three_calls(plan)  # an agent older than the route (a rolling upgrade)
        try:
            done = WeightsUpdatedAnswer.model_validate(answer)
        except ValidationError as exc:
            raise WorkerRejected(
                self.spec.id, f"POST /v1/agent/weights/update answered malformed: {exc}", status=200
            ) from exc
        if plan.checksums and done.checksums is None:
            raise WorkerRejected(
                self.spec.id, "POST /v1/agent/weights/update answered without the checksums asked for", status=200
            )
        status = self._status("POST /v1/agent/weights/update", done.state.model_dump(mode="json"))
        return UpdateReport(LoadReport(done.weight_version, done.checksums), status, done.resumed, done.held_back)

    async def _update_in_three_calls(self, plan: UpdatePlan) -> UpdateReport:
        """The same update as an older agent takes it: prepare, load, and resume if told. The
        prepare does not name the checkpoint: the oldest agents refuse the field (the check before
        the update asked those that can answer)."""
        await self.pause_for_update(plan.version, plan.mode, plan.pause_timeout_s)
        load = await self.load_from_disk(
            plan.path, plan.version, checksums=plan.checksums or plan.expected_checksums is not None
        )
        held_back = None
        if plan.resume and plan.expected_checksums is not None and load.checksums is not None:
            if problem := checksums_disagree(load.checksums, plan.expected_checksums):
                held_back = f"checksums disagree with those expected: {problem}"
        if plan.resume and held_back is None:
            return UpdateReport(load, await self.resume_after_update(), True, None)
        return UpdateReport(load, await self.status(), False, held_back)

    async def pause_for_update(
        self, version: str, mode: PauseMode, timeout_s: float, *, weights_path: str | None = None
    ) -> WorkerStatus:
        """One call: told the desired version, then paused (refused, nothing changed, when the
        checkpoint at `weights_path` is not loadable after all); answers the state."""
        body: dict[str, Any] = {"desired_weight_version": version, "mode": mode, "timeout_s": timeout_s}
        if weights_path is not None:
            body["weights_path"] = weights_path
        return self._status(
            "POST /v1/agent/prepare",
            await self.transport.request(
                "POST", "/v1/agent/prepare", json_body=body, timeout_s=timeout_s + self.deadlines.grace_s
            ),
        )

    async def load_from_disk(self, path: str, version: str, *, checksums: bool) -> LoadReport:
        # As update_weights_from_disk (a 5xx is retried: the reload is idempotent).
        body = await self.transport.request(
            "POST",
            "/v1/agent/weights/disk",
            json_body={"path": path, "version": version, "checksums": checksums},
            timeout_s=self.deadlines.load_and_hash_s if checksums else self.deadlines.weight_load_s,
        )
        try:
            answer = DiskUpdatedAnswer.model_validate(body)
        except ValidationError as exc:
            raise WorkerRejected(
                self.spec.id, f"POST /v1/agent/weights/disk answered malformed: {exc}", status=200
            ) from exc
        if checksums and answer.checksums is None:
            raise WorkerRejected(
                self.spec.id, "POST /v1/agent/weights/disk answered without the checksums asked for", status=200
            )
        return LoadReport(weight_version=answer.weight_version, checksums=answer.checksums)

    async def resume_after_update(self) -> WorkerStatus:
        return self._status("POST /v1/agent/resume", await self.transport.request("POST", "/v1/agent/resume"))

    async def set_desired_version(self, version: str | None) -> None:
        await self.transport.request("PUT", "/v1/agent/desired", json_body={"weight_version": version})

    async def weight_checksums(self) -> dict[str, str] | None:
        # Hashing every parameter of a large model takes far longer than a control call.
        body = await self.transport.request(
            "POST", "/weight_checker", json_body={"action": "checksum"}, timeout_s=self.deadlines.weight_load_s
        )
        return _checksums(self.spec.id, body)

    async def load_lora(
        self, name: str, path: str, version: str | None, *, checksums: bool = False
    ) -> LoraLoaded | None:
        # Reads the adapter from disk, so it gets the weight-load deadline (and hashing time when asked).
        body: dict[str, Any] = {"name": name, "path": path, "version": version}
        if checksums:
            body["checksums"] = True  # only when asked: an agent older than the field refuses it
        answer = await self.transport.request(
            "POST",
            "/v1/agent/loras",
            json_body=body,
            timeout_s=self.deadlines.load_and_hash_s if checksums else self.deadlines.weight_load_s,
        )
        if not checksums:
            return None
        try:
            loaded = LoraLoadedAnswer.model_validate(answer)
        except ValidationError as exc:
            raise WorkerRejected(self.spec.id, f"POST /v1/agent/loras answered malformed: {exc}", status=200) from exc
        if loaded.checksums is None or loaded.state is None:
            raise WorkerRejected(
                self.spec.id, "POST /v1/agent/loras answered without the checksums and state asked for", status=200
            )
        return LoraLoaded(loaded.checksums, self._status("POST /v1/agent/loras", loaded.state.model_dump(mode="json")))

    async def unload_lora(self, name: str) -> None:
        # Names may hold '/' (the agent allows it), so the whole name is one escaped segment.
        try:
            await self.transport.request("DELETE", f"/v1/agent/loras/{quote(name, safe='')}")
        except WorkerRejected as exc:
            if exc.status != 404:
                raise
            # Already gone: unloading is idempotent, so a retry after a lost answer succeeds.


def _reported_status(report: UpdateReport) -> WorkerStatus | None:
    return report.status


def _checksums(worker_id: str, body: Any) -> dict[str, str]:
    checksums = body.get("checksums") if isinstance(body, dict) else None
    if not isinstance(checksums, dict):
        raise WorkerRejected(worker_id, "POST /weight_checker answered without a 'checksums' object", status=200)
    return {str(k): str(v) for k, v in checksums.items()}
