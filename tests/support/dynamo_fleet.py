"""The session's Dynamo fleet (`dynamo_fleet`, tests/conftest.py): Dynamo 1.6.1's own frontend and
up to two of its vLLM workers (rlcp/harness/dynamo.py), shared by the modules that drive Dynamo
(tests/controlplane/workers/flavors/test_dynamo.py with one worker, tests/e2e/test_dynamo_rollouts.py
with two), so the session starts one frontend and two workers instead of two and three.

Each module asks for the fleet it needs (`use(n)`): exactly the first n workers running and listed
by the frontend, none other (a worker beyond them is stopped, and the wait lasts until the
frontend no longer lists it), whatever the module before left. What the workers hold is each
module's to put back (every test there leaves its workers resumed on the base weights).

Every worker loads the harness's hold (rlcp/harness/hold.py: vLLM's `--logits-processors`, an
engine flag `dynamo.vllm` takes as it is), and the frontend serves its token-in/token-out route
(`/inference/v1/generate`), through which a held request reaches the worker: neither changes an
answer of a request that is not held.
"""

from __future__ import annotations

from pathlib import Path

from rlcp.harness import hold
from rlcp.harness.dynamo import DynamoFrontendProcess, DynamoVllmProcess
from rlcp.harness.processes import stop_all
from rlcp.harness.tiny_model import SERVED_NAME


class DynamoFleet:
    """One frontend and two workers, none started until a module asks (`use`)."""

    def __init__(self, models: dict[str, Path], workdir: Path, target: Path) -> None:
        kv = workdir / "kv"
        kv.mkdir()
        self.frontend = DynamoFrontendProcess(workdir / "frontend", target=target, kv_dir=kv, generate_api=True)
        self.workers = [
            DynamoVllmProcess(
                models["base"],
                workdir / f"w{i}",
                target=target,
                kv_dir=kv,
                name=f"dynamo-vllm-{i}",
                core=i,
                extra_args=hold.SERVE_ARGS,
            )
            for i in range(2)
        ]

    def use(self, n: int) -> list[DynamoVllmProcess]:
        """The first `n` workers, running and listed by the frontend, which serves the model;
        the others stopped and no longer listed. A child that dies ends the wait at once with its
        log; only a hang meets the 300 s guard."""
        wanted = self.workers[:n]
        stop_all([w for w in self.workers[n:] if w.running()])
        starting = [w for w in wanted if not w.running()]
        for w in starting:
            w.spawn()
        frontend_starting = not self.frontend.running()
        if frontend_starting:
            self.frontend.spawn()
        for w in starting:
            w.wait_ready()
        if frontend_starting:
            self.frontend.wait_ready()
        self.frontend.wait_serving(wanted, SERVED_NAME)
        return wanted

    def stop(self) -> None:
        stop_all([self.frontend, *self.workers])
