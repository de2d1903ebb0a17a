"""LoRA adapters fleet-wide: load (or hot-swap under the same name) and unload.

A load is verified (unless `verify: false`): the adapter's tensors, as each worker holds them,
agree across the fleet (`verify.verify_adapter`); a worker that read other bytes under the
same path (a stale node-local copy) is named. It keeps the adapter; the operation says which.

An adapter's name is a model name the gateway routes by: a load under a name another fleet
serves is refused (409 naming both fleets) before any worker is touched, and the name stays
claimed until the load has ended (`fleet/names.py`)."""

from __future__ import annotations

from collections.abc import Mapping

from rlcp.controlplane.errors import Conflict, MissingCapability, NotFound
from rlcp.controlplane.fleet.members import WorkerRecord
from rlcp.controlplane.fleet.paths import check_path
from rlcp.controlplane.operations.checkpoint import checking
from rlcp.controlplane.operations.context import OperationContext, Run, require_capability
from rlcp.controlplane.operations.steps import StepDone
from rlcp.controlplane.operations.transaction import Begin, Call, Open, Steps, Write, run_operation
from rlcp.controlplane.operations.verify import verify_adapter
from rlcp.controlplane.workers.capabilities import LORA, LoraLoaded
from rlcp.controlplane.workers.steps import Step
from rlcp.core.wire.controller import LoraRequest, LoraSpec, OperationResult


async def load_lora(ctx: OperationContext, req: LoraRequest) -> OperationResult:
    path = check_path(req.path, "path", ctx.allowed_roots)
    members = ctx.registry.members()
    require_capability(members, "lora", "a LoRA load")
    check_lora_room(members, ctx.desired.state.loras, req.name)
    with ctx.names.claim(ctx.fleet, req.name, "a LoRA adapter"):
        return await run_operation(ctx, lora_load(ctx, req, path, members))


def lora_load(ctx: OperationContext, req: LoraRequest, path: str, members: list[WorkerRecord]) -> Steps:
    """A load's steps: the adapter's check; open, begin, the adapter desired, the load (the
    desired state put back if nobody took it), verification."""
    # As a disk update's checkpoint (checkpoint.py): an adapter no worker can load is a 422
    # before it is desired; workers that cannot load it are left out, reported.
    refused = (yield from checking(ctx, members, path, field="path", kind="adapter")).refused
    # Verifying, a worker whose checksums cover adapters answers the adapter's in the load (the
    # agent): hashing time on top of the load's.
    loading = Step(
        name="load_lora",
        can=LORA,
        call=lambda w: w.load_lora(req.name, path, req.version, checksums=req.verify),
        deadline_s=ctx.deadlines.lora_s + (ctx.deadlines.checksums_s if req.verify else 0.0),
    )
    detail = {"name": req.name, "version": req.version, "path": path, "verify": req.verify}
    run: Run = yield Open("load_lora", detail)
    yield Begin()
    run.steps.report(refused.values())
    before = ctx.desired.state.loras.get(req.name)
    yield Write(ctx.desired.set_lora(req.name, LoraSpec(path=path, version=req.version)))
    loaded: StepDone[LoraLoaded | None] = yield Call(loading, [r for r in run.members if r.id not in refused])
    if not loaded.ok:
        # No member took it: the fleet is as it was, so the desired state is too. Kept desired,
        # every member would turn not ready for lacking it and the gateway would hold every
        # rollout until an unload (which TRL never sends after a failed load).
        if before is None:
            yield Write(ctx.desired.drop_lora(req.name))
        else:
            yield Write(ctx.desired.set_lora(req.name, before))
        return
    held = {
        worker_id: a.checksums for worker_id, a in loaded.answers.items() if a is not None and a.checksums is not None
    }
    verified = (yield from verify_adapter(run, loaded.ok, req.name, held)) if req.verify else loaded.ok
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


def check_lora_room(members: list[WorkerRecord], desired: Mapping[str, LoraSpec], name: str) -> None:
    """Refuse, before any worker is touched, a load some member cannot hold: its engine runs
    without LoRA, or the new name would take it past its `max_loras` (vLLM would evict the
    oldest adapter silently, and a request naming that one would fail). A member that does not
    report these (a stock server) is not judged. TRL loads version N+1 before it unloads N, so a
    fleet for it needs `max_loras >= max_staleness + 2`."""
    off = {r.id: "lora" for r in members if r.status is not None and r.status.lora_enabled is False}
    if off:
        raise MissingCapability(
            f"the engines of {', '.join(sorted(off))} run without LoRA (start them with --enable-lora; "
            "the local fleet: scripts/run-local.sh --lora): no adapter can be loaded",
            workers=off,
        )
    full: list[str] = []
    for r in members:
        if r.status is None or r.status.max_loras is None:
            continue
        held = set(r.status.loras) | set(desired) | {name}
        if len(held) > r.status.max_loras:
            full.append(f"{r.id} (max_loras={r.status.max_loras}, would hold {', '.join(sorted(held))})")
    if full:
        raise Conflict(
            f"loading {name!r} would exceed max_loras on {'; '.join(full)}: vLLM would evict the oldest adapter "
            "silently. Unload one first, or start the engines with a larger --max-loras",
            field="name",
        )


async def unload_lora(ctx: OperationContext, name: str) -> OperationResult:
    return await run_operation(ctx, lora_unload(ctx, name))


def lora_unload(ctx: OperationContext, name: str) -> Steps:
    """An unload's steps: the adapter no longer desired, then unloaded everywhere."""
    members = ctx.registry.members()
    if name not in ctx.desired.state.loras and not any(r.status and name in r.status.loras for r in members):
        raise NotFound(f"no LoRA named {name!r} in the fleet", field="name")
    require_capability(members, "lora", "a LoRA unload")
    unloading = Step(name="unload_lora", can=LORA, call=lambda w: w.unload_lora(name), deadline_s=ctx.deadlines.lora_s)
    run: Run = yield Open("unload_lora", {"name": name})
    yield Begin()
    yield Write(ctx.desired.drop_lora(name))
    yield Call(unloading, run.members)
