"""The actor a placed agent lives in: it starts `python -m rlcp.agent` as its child and says
where that agent listens through its `__repr__` (the discovery convention, docs/ray.md).

Ray runs this class in a worker process of its own (the class is referenced by module, so the
workers' Python must have `rlcp` installed, as it must to run the agent at all). The agent is a
child process, not in the actor: an engine that crashes takes the actor down with it, and Ray
restarts the actor (`max_restarts=-1`), which starts a fresh agent. The other way round: the
child gets SIGKILL when the actor's process dies (`PR_SET_PDEATHSIG`), and the actor exits
when its child does, so the two always go together.

This module imports Ray only inside the actor (for the node's address and the actor's id), and
of the controller only the convention's version (one home: discovery, which reads it).
"""

from __future__ import annotations

import ctypes
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from rlcp.controlplane.discovery.ray import CONVENTION_VERSION

_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    """In the child before exec: SIGKILL when the actor's thread that started it dies."""
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


def _logs_dir(ray: Any) -> Path:
    node: Any = getattr(getattr(getattr(ray, "_private", None), "worker", None), "_global_node", None)
    try:
        return Path(node.get_logs_dir_path())
    except (AttributeError, TypeError):
        return Path(tempfile.gettempdir())


class AgentActor:
    """One placed agent. `config`: the agent's settings; `host`: the host in the URLs published
    (None: the Ray node's address)."""

    def __init__(self, config: dict[str, Any], host: str | None, start_timeout_s: float) -> None:
        import ray

        host = host or ray.util.get_node_ip_address()
        # One directory per actor, kept across its restarts (the actor id stays): the previous
        # agent's log is kept beside the new one. Under the Ray session's logs when Ray says where
        # (a private attribute, hence the fallback), so it goes with the node's other logs.
        self.workdir = _logs_dir(ray) / f"rlcp-placed-{ray.get_runtime_context().get_actor_id()}"
        self.workdir.mkdir(exist_ok=True)
        if (self.workdir / "agent.log").exists():
            (self.workdir / "agent.log").replace(self.workdir / "agent.previous.log")
        (self.workdir / "ports.json").unlink(missing_ok=True)
        config_path, ports_path = self.workdir / "agent.json", self.workdir / "ports.json"
        config_path.unlink(missing_ok=True)
        with os.fdopen(os.open(config_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "w") as f:
            json.dump(config, f)  # JSON is YAML: the agent's --config reads it; it may hold a token
        self.log = (self.workdir / "agent.log").open("ab")
        self.child = subprocess.Popen(
            [sys.executable, "-m", "rlcp.agent", "--config", str(config_path), "--ports-file", str(ports_path)],
            stdout=self.log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            preexec_fn=_die_with_parent,
        )
        deadline = time.monotonic() + start_timeout_s
        while not ports_path.exists():
            if self.child.poll() is not None or time.monotonic() > deadline:
                self.child.kill()
                tail = (self.workdir / "agent.log").read_text(errors="replace")[-2000:]
                raise RuntimeError(f"the agent did not start (exit {self.child.poll()}): {tail}")
            time.sleep(0.05)
        ports = json.loads(ports_path.read_text())
        self.described = {
            "rlcp": CONVENTION_VERSION,
            "admin_url": f"http://{host}:{ports['admin_port']}",
            "inference_url": f"http://{host}:{ports['inference_port']}",
            "flavor": "agent",
            "world_size": 1,
            "model": config.get("engine", {}).get("model", ""),
            "agent_pid": ports["pid"],
        }
        threading.Thread(target=self._exit_with_child, name="agent-watch", daemon=True).start()

    def _exit_with_child(self) -> None:
        code = self.child.wait()
        # The agent is gone: so is this actor, and Ray restarts it with a fresh agent.
        print(f"rlcp agent exited {code}; the actor exits too", file=sys.stderr, flush=True)
        os._exit(1)

    def __repr__(self) -> str:  # the state API's `repr_name`: how discovery finds this agent
        return json.dumps(self.described)

    def describe(self) -> dict[str, Any]:
        return dict(self.described, actor_pid=os.getpid())
