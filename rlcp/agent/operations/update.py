"""A controller's disk update in one call (`POST /v1/agent/weights/update`): the floor of its
round trips, one check before anyone pauses (`disk.py`) and this.

In order, stopping at the first failure: the checkpoint checked (a 4xx with nothing changed),
the desired version learnt (readiness gates on it), generation paused unless it already is,
the weights reloaded and named, their checksums taken, and generation resumed if the caller
said so -- and, when it named the checksums it holds the update to (a manifest, or what earlier
waves of a rolling update agreed on), only if the new weights agree with them. A failure after
the pause leaves the engine paused, as the separate calls did: nobody is served weights that
failed to load. The controller still decides what is verified; this only saves it the calls.
"""

from __future__ import annotations

from dataclasses import dataclass

from rlcp.agent.operations.control import EngineControl
from rlcp.agent.operations.disk import DiskLoads
from rlcp.agent.operations.weights import Weights
from rlcp.agent.readiness import Readiness
from rlcp.core.wire.agent import WeightsUpdateRequest, checksums_disagree


@dataclass(frozen=True)
class Updated:
    checksums: dict[str, str] | None
    resumed: bool
    held_back: str | None


async def update_from_disk(
    control: EngineControl, disk: DiskLoads, weights: Weights, readiness: Readiness, req: WeightsUpdateRequest
) -> Updated:
    checkpoint = await disk.check(req.path, "path")  # the one inspection: load takes its answer
    readiness.set_desired_version(req.version)
    if not control.paused:
        await control.pause(req.mode, req.timeout_s)
    await disk.load(checkpoint, req.version)
    hashing = req.checksums or (req.resume and req.expected_checksums is not None)
    checksums = await weights.checksums() if hashing else None
    held_back = None
    if req.resume and req.expected_checksums is not None:
        assert checksums is not None
        if problem := checksums_disagree(checksums, req.expected_checksums):
            held_back = f"checksums disagree with those expected: {problem}"
    resumed = req.resume and held_back is None
    if resumed:
        await control.resume()
    return Updated(checksums if req.checksums else None, resumed, held_back)
