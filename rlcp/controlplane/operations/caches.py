"""The fleet's prefix caches on request (`POST /v1/rl/reset_prefix_cache`; vLLM's
`/reset_prefix_cache` on the facade): every member's engine drops its cached KV blocks.

The fleet resets them itself where they go stale (each weight update and adapter swap); this
is the trainer's explicit reset, after it changed something the controller did not see. Every
member in service, or the members a selector names; members asleep have nothing cached and
are left out (`Run`). A member whose engine could not reset (blocks still held by running
requests, without `reset_running_requests`) failed: the caller asked for empty caches.
Refused before any worker is touched: a malformed or unmatched selector (422), a member whose
flavor has no reset (409 `capability_missing`, naming it).
"""

from __future__ import annotations

from rlcp.controlplane.errors import InvalidInput
from rlcp.controlplane.fleet.members import WorkerRecord
from rlcp.controlplane.fleet.select import read_selector, selected
from rlcp.controlplane.operations.context import OperationContext, Run, require_capability
from rlcp.controlplane.operations.transaction import Begin, Call, Open, Steps, run_operation
from rlcp.controlplane.workers.capabilities import PREFIX_CACHE
from rlcp.controlplane.workers.steps import Step
from rlcp.core.labels import Selector
from rlcp.core.wire.controller import OperationResult, ResetPrefixCacheRequest


def _targets(records: list[WorkerRecord], selector: Selector | None) -> list[WorkerRecord]:
    chosen = selected(records, selector)
    if records and not chosen and selector is not None:
        raise InvalidInput(f"selector {selector.text!r} matches none of the {len(records)} members", field="selector")
    require_capability(chosen, "prefix_cache", "reset_prefix_cache")
    return chosen


async def reset_prefix_cache(ctx: OperationContext, req: ResetPrefixCacheRequest) -> OperationResult:
    return await run_operation(ctx, resetting(ctx, req))


def resetting(ctx: OperationContext, req: ResetPrefixCacheRequest) -> Steps:
    """The reset's steps: every refusal before the gate, the log and any worker; then one step."""
    selector = read_selector(req.selector)
    _targets(ctx.registry.members(), selector)
    step = Step(
        name="reset_prefix_cache",
        can=PREFIX_CACHE,
        call=lambda w: w.reset_prefix_cache(running=req.reset_running_requests, external=req.reset_external),
        deadline_s=ctx.deadlines.control_s,
    )
    detail: dict[str, object] = {
        "reset_running_requests": req.reset_running_requests,
        "reset_external": req.reset_external,
    } | ({"selector": req.selector} if req.selector is not None else {})
    run: Run = yield Open("reset_prefix_cache", detail, lambda records: _targets(records, selector))
    yield Begin()
    yield Call(step, run.members)
