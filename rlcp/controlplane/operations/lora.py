"""LoRA adapters fleet-wide: load (or hot-swap under the same name) and unload.

A load is verified (unless `verify: false`): the adapter's tensors, as each worker holds them,
agree across the fleet (`verify.verify_adapter`); a worker that read other bytes under the
same path (a stale node-local copy) is named. It keeps the adapter; the operation says which.

An adapter's name is a model name the gateway routes by: a load under a name another fleet
serves is refused (409 naming both fleets) before any worker is touched, and the name stays
claimed until the load has ended (`fleet/names.py`)."""

from __future__ import annotations

from rlcp.controlplane.errors import NotFound
from rlcp.controlplane.fleet.members import WorkerRecord
from rlcp.controlplane.fleet.paths import check_path
from rlcp.controlplane.operations.checkpoint import check_checkpoint
from rlcp.controlplane.operations.context import OperationContext, Run, require_capability, run_operation
from rlcp.controlplane.operations.steps import Step
from rlcp.controlplane.operations.verify import verify_adapter
from rlcp.controlplane.workers.capabilities import LORA
from rlcp.core.wire.controller import LoraRequest, LoraSpec, OperationResult


async def load_lora(ctx: OperationContext, req: LoraRequest) -> OperationResult:
    path = check_path(req.path, "path", ctx.allowed_roots)
    members = ctx.registry.members()
    require_capability(members, "lora", "a LoRA load")
    with ctx.names.claim(ctx.fleet, req.name, "a LoRA adapter"):
        return await _load_lora(ctx, req, path, members)


async def _load_lora(
    ctx: OperationContext, req: LoraRequest, path: str, members: list[WorkerRecord]
) -> OperationResult:
    # As a disk update's checkpoint (checkpoint.py): an adapter no worker can load is a 422 before
    # it is desired; workers that cannot load it are left out, reported.
    refused = (await check_checkpoint(ctx, members, path, field="path", kind="adapter")).refused

    # Verifying, a worker whose checksums cover adapters answers the adapter's in the load (the
    # agent): hashing time on top of the load's.
    loading = Step(
        name="load_lora",
        can=LORA,
        call=lambda w: w.load_lora(req.name, path, req.version, checksums=req.verify),
        deadline_s=ctx.deadlines.lora_s + (ctx.deadlines.checksums_s if req.verify else 0.0),
    )

    async def body(run: Run) -> None:
        run.steps.report(refused.values())
        await ctx.desired.set_lora(req.name, LoraSpec(path=path, version=req.version))
        loaded = await run.steps.run(loading, [r for r in run.members if r.id not in refused])
        held = {
            worker_id: a.checksums
            for worker_id, a in loaded.answers.items()
            if a is not None and a.checksums is not None
        }
        verified = await verify_adapter(run, loaded.ok, req.name, held) if req.verify else loaded.ok
        for r in verified:
            answer = loaded.answers.get(r.id)
            if answer is not None and answer.status is not None:
                run.steps.observe_status(r.id, answer.status, final=True)
            elif r.status is not None:
                # Known without a read (a stock server answers a load with nothing): its last
                # status, holding the adapter at this version.
                run.steps.observe_status(
                    r.id, r.status.model_copy(update={"loras": {**r.status.loras, req.name: req.version}}), final=True
                )

    return await run_operation(
        ctx, "load_lora", {"name": req.name, "version": req.version, "path": path, "verify": req.verify}, body
    )


async def unload_lora(ctx: OperationContext, name: str) -> OperationResult:
    members = ctx.registry.members()
    if name not in ctx.desired.state.loras and not any(r.status and name in r.status.loras for r in members):
        raise NotFound(f"no LoRA named {name!r} in the fleet", field="name")
    require_capability(members, "lora", "a LoRA unload")

    unloading = Step(name="unload_lora", can=LORA, call=lambda w: w.unload_lora(name), deadline_s=ctx.deadlines.lora_s)

    async def body(run: Run) -> None:
        await ctx.desired.drop_lora(name)
        await run.steps.run(unloading, run.members)

    return await run_operation(ctx, "unload_lora", {"name": name}, body)
