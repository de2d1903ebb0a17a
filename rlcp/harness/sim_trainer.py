"""A trainer's side of a broadcast for fleets of SimEngine agents: `BroadcastSync(join=sim_join(...))`.

vLLM's trainer engine (on this project's gloo backend or on `nccl`) is rank 0 of a real
collective and waits in init until every rank has joined; SimEngine joins none (its
`update_weights` records the chunk, nothing is received), so that engine cannot run against
a simulated fleet. This one makes the calls `GlooTrainerWeightTransferEngine` makes through
the same client, in the same order, and broadcasts nothing: init with the worker-side init
info, then per round start, one chunk naming every tensor, and finish naming the version.
So the trainer's half of the protocol (`rlcp.rl.sync.BroadcastSync`: joining, re-forming a
group the fleet moved under, pushing the same version again) runs against real agents and a
real controller in one process, at the cost of a few HTTP calls.

As gloo's rank 0 does, it runs the chunk's call in a thread of its own beside the (here
empty) broadcast, and when that call fails it raises the broadcast's error, not the call's:
with a real collective nobody receives a chunk the controller refused, the broadcast times
out, and the refusal is lost with the thread. So the trainer's side sees what it would see.

In the trainer's thread, `before_init` runs once the world size has been read and before the
init, `after_init` once the fleet has joined, and `after_start` between a round's start and
its chunk: the places where a test moves the fleet under a group.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from rlcp.client.client import ControllerWeightSyncClient
from rlcp.rl.sync import JoinGroup, TrainerEngine, free_port

# A model as this trainer sees it: each tensor's name and shape (float32, as SimEngine takes any).
SimModel = Mapping[str, Sequence[int]]


@dataclass
class SimTrainerEngine:
    """Rank 0 of a group whose other ranks are SimEngines: the calls, no broadcast."""

    client: ControllerWeightSyncClient
    model: SimModel
    after_start: Callable[[], None] | None = None

    def send_weights(self, weight_version: str | None = None) -> None:
        self.client.start_weight_update()
        if self.after_start is not None:
            self.after_start()
        chunk = {
            "names": list(self.model),
            "dtype_names": ["float32"] * len(self.model),
            "shapes": [list(shape) for shape in self.model.values()],
        }
        with ThreadPoolExecutor(max_workers=1, thread_name_prefix="sim-update") as exe:
            if (refused := exe.submit(self.client.update_weights, chunk).exception()) is not None:
                raise RuntimeError(f"sim broadcast: no rank received the chunk ({type(refused).__name__} beside it)")
        self.client.finish_weight_update(weight_version)

    def shutdown(self) -> None:
        pass  # no communicator to close: the workers leave theirs at the next init


def sim_join(
    *,
    before_init: Callable[[int], None] | None = None,
    after_init: Callable[[int], None] | None = None,
    after_start: Callable[[int], None] | None = None,
) -> JoinGroup:
    """`BroadcastSync.join` for a SimEngine fleet. Each hook gets n, counting this sync's
    groups from 1: `before_init(n)` runs before the n-th init, `after_init(n)` once the fleet
    has joined in it, `after_start(n)` after each round's start in the n-th group."""
    inits = 0

    def join(client: ControllerWeightSyncClient, world_size: int, model: SimModel) -> TrainerEngine:
        nonlocal inits
        inits += 1
        n = inits
        if before_init is not None:
            before_init(n)
        client.init_weight_transfer_engine(
            {
                "master_address": "127.0.0.1",
                "master_port": free_port("127.0.0.1"),
                "rank_offset": 1,
                "world_size": world_size,
            }
        )
        if after_init is not None:
            after_init(n)
        started = None if after_start is None else lambda: after_start(n)
        return SimTrainerEngine(client, model, started)

    return join
