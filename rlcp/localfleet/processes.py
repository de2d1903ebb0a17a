"""The processes one local fleet run started (agents, the controller, Envoy): started, named in
pids.json for tools and tests, kept up by a supervisor, checked, and stopped. `FleetError` is the
package's one error: a part of the fleet could not be brought up or kept up."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

from rlcp.core.wire.agent.inference import EXIT_ENGINE_DIED
from rlcp.harness.envoy import EnvoyProcess
from rlcp.harness.processes import AgentProcess, ChildProcess, stop_all
from rlcp.harness.supervisor import ProcessSupervisor
from rlcp.localfleet.report import say


class FleetError(Exception):
    """The fleet could not be brought up or kept up; the message says which part and why."""


_Child = TypeVar("_Child", bound=ChildProcess)


@dataclass
class Processes:
    """Every subprocess this run started; their pids go to pids.json for tools and tests."""

    workdir: Path
    children: list[ChildProcess] = field(default_factory=list)
    supervisor: ProcessSupervisor | None = None  # restarts the agents that exit (`supervise`)
    envoy: EnvoyProcess | None = None  # --envoy: the data plane, in front of the agents
    down_on_purpose: set[str] = field(default_factory=set)  # --churn: agents that left, or killed until restarted

    def add_envoy(self, envoy: EnvoyProcess) -> EnvoyProcess:
        """Start Envoy (its own session, as every child) and name it in pids.json."""
        self.envoy = envoy.start()
        self.note_pids()
        return envoy

    def spawn(self, child: _Child) -> _Child:
        """Start `child` (its config, which holds tokens, readable by this user only)."""
        self.children.append(child.spawn())
        self.note_pids()
        return child

    def note_pids(self) -> None:
        """pids.json again (a child started anew by someone else: the churn's restart)."""
        pids = {c.name: c.pid for c in self.children}
        if self.envoy is not None and self.envoy.pid is not None:
            pids[self.envoy.name] = self.envoy.pid
        (self.workdir / "pids.json").write_text(json.dumps(pids))

    def supervise(self) -> ProcessSupervisor:
        """The agents restarted when they exit (an agent exits when its engine dies), as a
        kubelet would; run its `run()` as a task."""

        def restarted(child: ChildProcess, status: int | None, n: int) -> None:
            why = " (its engine died)" if status == EXIT_ENGINE_DIED else ""
            self.note_pids()
            say(
                f"  {child.name} exited with {status}{why}: restarted ({n}/{supervisor.max_restarts}); the "
                "controller converges it before the gateway takes it back"
            )

        supervisor = ProcessSupervisor([c for c in self.children if isinstance(c, AgentProcess)], on_restart=restarted)
        self.supervisor = supervisor
        return supervisor

    def check_alive(self) -> None:
        if self.envoy is not None and not self.envoy.running():
            assert self.envoy.proc is not None
            raise FleetError(
                f"envoy exited with {self.envoy.proc.returncode}; the end of {self.envoy.log}:\n"
                + "\n".join(self.envoy.log.read_text(errors="replace").splitlines()[-40:])
            )
        kept_up = [] if self.supervisor is None else self.supervisor.children
        given_up = [] if self.supervisor is None else self.supervisor.gave_up
        down = [c for c in self.children if not c.running() and c.name not in self.down_on_purpose]
        if dead := [c for c in down if c not in kept_up or c in given_up]:
            status = None if dead[0].proc is None else dead[0].proc.returncode
            why = " (restarted as often as the supervisor does)" if dead[0] in given_up else ""
            raise dead[0].failure(f"exited with {status}{why}")

    def stop(self, grace_s: float = 20.0) -> None:
        """Every child stopped (SIGTERM, then SIGKILL after `grace_s`), Envoy first: nothing
        is routed to agents on their way out."""
        if self.envoy is not None:
            self.envoy.stop()
        for c in stop_all(self.children, grace_s):
            say(f"  {c.name} did not stop within {grace_s:g}s: killed it")
