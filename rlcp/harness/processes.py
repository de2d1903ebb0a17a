"""The agent and the controller as child processes, started exactly as production starts them.

`python -m rlcp.agent --config <yaml> --ports-file <file>` and `python -m rlcp.controlplane --config <yaml>
--port-file <file>` bind port 0 (or the port in the config) and write what they bound to the ready
file once they serve, so nobody races for ports or guesses when a child is up. Each child leads its
own process group: a stop or a kill reaches a vLLM agent's engine processes too. Tests, the
benchmarks and `localfleet` all start their children through `ChildProcess`. Beside it: servers
that write no ready file (`servers`), children restarted when they exit (`supervisor`), what /proc
says of a child (`procfs`), and what a vLLM engine child runs with (`engine_env`).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterable
from pathlib import Path
from typing import Any, ClassVar, Self

import yaml

from rlcp.harness.engine_env import engine_env

REPO = Path(__file__).resolve().parents[2]
# pydantic-settings ranks the environment above the YAML file: settings left exported by a shell
# would override the child's config (a stale token makes every admin call a 401).
_SETTINGS_PREFIXES = ("RLAGENT_", "RLCP_")


class ProcessError(RuntimeError):
    """A child exited while starting or running, or did not get ready in time; the message ends
    with the tail of its log."""


def run_to_end(
    argv: list[str], *, cwd: Path, timeout_s: float, grace_s: float = 20.0
) -> subprocess.CompletedProcess[str]:
    """Run a command as a user runs it in a terminal, to its end, its output captured. Past
    `timeout_s` it is stopped as Ctrl-C stops it (SIGINT to its process group: its own handler
    stops what it started in sessions of their own), killed after `grace_s` more, and the error
    carries its output so far. `subprocess.run`'s timeout SIGKILLs the child alone: a localfleet
    stopped so left its controller running (a fresh-clone run, under load)."""
    proc = subprocess.Popen(
        argv,
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        text=True,
        start_new_session=True,
    )
    try:
        out, _ = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGINT)
        try:
            out, _ = proc.communicate(timeout=grace_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, _ = proc.communicate()
        raise ProcessError(f"{' '.join(argv[1:])} ran past {timeout_s:g}s and was stopped; its output:\n{out[-6000:]}")
    return subprocess.CompletedProcess(argv, proc.returncode, out, "")


async def stop_child(proc: asyncio.subprocess.Process, grace_s: float = 30.0) -> None:
    """Stop an asyncio child that is still running: SIGTERM, so its own handler stops what it
    started (the TRL run stops TRL's rollout process), then SIGKILL after `grace_s`."""
    if proc.returncode is not None:
        return
    proc.terminate()
    try:
        await asyncio.wait_for(proc.wait(), timeout=grace_s)
    except TimeoutError:
        proc.kill()
        await proc.wait()


def child_env(**extra: str) -> dict[str, str]:
    """The environment of a child: this one without settings variables, plus what a CPU vLLM
    engine needs (`engine_env`) and fatal signals reported, plus `extra`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(_SETTINGS_PREFIXES)}
    # A child, or an engine's worker process under it, killed by a fatal signal (SIGSEGV,
    # SIGBUS, SIGILL, SIGABRT) prints where it was to its log instead of vanishing without
    # a trace (a shared agent's engine worker did, twice, in loaded fresh-clone runs).
    env.update(PYTHONFAULTHANDLER="1", **engine_env())
    return env | extra


class ChildProcess:
    """One `python -m <module>` child: spawn it with its config, wait for its ready file, stop
    it (SIGTERM to its group, SIGKILL after a grace period), kill it, read its log.

    A child can be started again after it stopped or was killed: same config, same files, its
    log appended to."""

    module: ClassVar[str]
    ready_flag: ClassVar[str]

    def __init__(
        self,
        config: dict[str, Any],
        workdir: Path,
        *,
        name: str,
        env: dict[str, str] | None = None,
        start_timeout_s: float = 60.0,
        stop_timeout_s: float = 30.0,
        log_path: Path | None = None,
    ) -> None:
        self.config, self.workdir, self.name = config, workdir, name
        self.extra_env = env or {}
        self.start_timeout_s, self.stop_timeout_s = start_timeout_s, stop_timeout_s
        self.config_path = workdir / f"{name}.yaml"
        self.ready_file = workdir / f"{name}.ready"
        self.log_path = log_path or workdir / f"{name}.log"
        self.proc: subprocess.Popen[bytes] | None = None

    def settings(self) -> dict[str, Any]:
        """What goes into the config file (subclasses add their defaults)."""
        return self.config

    def spawn(self) -> Self:
        """Start the child and return at once; `wait_ready` waits for it to serve. The config
        file may hold tokens: it is readable by this user only."""
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self.ready_file.unlink(missing_ok=True)
        fd = os.open(self.config_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            yaml.safe_dump(self.settings(), f)
        argv = [
            sys.executable,
            "-m",
            self.module,
            "--config",
            str(self.config_path),
            self.ready_flag,
            str(self.ready_file),
        ]
        self.launch(argv, env=child_env(**self.extra_env), cwd=REPO)
        return self

    def launch(self, argv: list[str], *, env: dict[str, str], cwd: Path) -> None:
        """How every child starts, whatever it runs: its output appended to its log (a restart
        adds to the same file), nothing on its stdin, and a session of its own, so a stop or a
        kill of its group reaches the processes it starts in turn (an engine's)."""
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(
                argv,
                cwd=cwd,
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )

    def _ready_text(self) -> str | None:
        """The ready file's text once written; raises if the child died first."""
        assert self.proc is not None, f"{self.name} was never spawned"
        if self.ready_file.exists():
            return self.ready_file.read_text()
        if self.proc.poll() is not None:
            raise self.failure(f"exited with {self.proc.returncode} while starting")
        return None

    def _on_ready(self, text: str) -> None:
        """Read what the child bound from its ready file."""

    def _timed_out(self) -> ProcessError:
        self.stop()
        return self.failure(f"did not start within {self.start_timeout_s:g}s")

    def wait_ready(self) -> Self:
        deadline = time.monotonic() + self.start_timeout_s
        while (text := self._ready_text()) is None:
            if time.monotonic() > deadline:
                raise self._timed_out()
            time.sleep(0.05)
        self._on_ready(text)
        return self

    async def wait_ready_async(self) -> Self:
        deadline = time.monotonic() + self.start_timeout_s
        while (text := self._ready_text()) is None:
            if time.monotonic() > deadline:
                raise self._timed_out()
            await asyncio.sleep(0.05)
        self._on_ready(text)
        return self

    def start(self) -> Self:
        return self.spawn().wait_ready()

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def signal_group(self, sig: int) -> bool:
        """Signal the child's whole process group; False when none of the group is left."""
        if self.proc is None:
            return False
        if self.proc.poll() is not None and Path(f"/proc/{self.proc.pid}").exists():
            # The leader is reaped and its pid is another process's now. Linux does not hand out a
            # pid still naming a live process group, so ours is gone; a signal to that pid's
            # group would reach a stranger's (pid_max here is 32,768, and a full run wraps it).
            return False
        try:
            os.killpg(self.proc.pid, sig)
            return True
        except ProcessLookupError:
            return False

    def alive(self) -> bool:
        """The child, or any process of its group (a vLLM engine may outlive its agent)."""
        return self.running() or self.signal_group(0)

    def stop(self, timeout_s: float | None = None) -> None:
        stop_all([self], timeout_s or self.stop_timeout_s)

    def kill(self) -> None:
        if self.running():
            self.signal_group(signal.SIGKILL)
            assert self.proc is not None
            self.proc.wait(timeout=10)

    def log_tail(self, n: int = 60) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""

    def failure(self, what: str) -> ProcessError:
        return ProcessError(f"{self.name} {what}; the end of {self.log_path}:\n{self.log_tail(40)}")


def stop_all(children: Iterable[ChildProcess], grace_s: float = 20.0) -> list[ChildProcess]:
    """SIGTERM every child's group, wait up to `grace_s` for all of them, then SIGKILL the rest;
    returns the children that had to be killed. Synchronous on purpose: a second Ctrl-C cannot
    cancel it half-way."""
    children = [c for c in children if c.proc is not None]
    for c in children:
        if c.alive():
            c.signal_group(signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and any(c.alive() for c in children):
        time.sleep(0.05)
    killed = [c for c in children if c.alive()]
    for c in killed:
        c.signal_group(signal.SIGKILL)
        assert c.proc is not None
        c.proc.wait(timeout=10)
    return killed


def start_all(children: Iterable[ChildProcess]) -> None:
    """Spawn every child, then wait for each: their start-ups (mostly imports) overlap."""
    children = list(children)
    for c in children:
        c.spawn()
    for c in children:
        c.wait_ready()


class AgentProcess(ChildProcess):
    """`python -m rlcp.agent`: admin and inference ports picked by the agent unless the config names them."""

    module = "rlcp.agent"
    ready_flag = "--ports-file"

    def __init__(
        self,
        config: dict[str, Any],
        workdir: Path,
        *,
        token: str = "test-token",
        start_timeout_s: float = 180.0,
        name: str = "agent",
        **kw: Any,
    ) -> None:
        super().__init__(config, workdir, name=name, start_timeout_s=start_timeout_s, **kw)
        self.token = token
        self.ports: dict[str, int] = {}

    def settings(self) -> dict[str, Any]:
        return {"admin": {"port": 0, "token": self.token}, "inference": {"port": 0}, **self.config}

    def _on_ready(self, text: str) -> None:
        self.ports = json.loads(text)

    def spawn(self) -> Self:
        """Start the agent; once it has served, again on the ports it bound the first time (a
        restarted pod keeps its address: the controller's static list and the gateway's routes
        still name it)."""
        if self.ports:
            admin = {"port": 0, "token": self.token, **self.config.get("admin", {})}
            self.config = {
                **self.config,
                "admin": admin | {"port": self.ports["admin_port"]},
                "inference": {**self.config.get("inference", {}), "port": self.ports["inference_port"]},
            }
        super().spawn()
        return self

    @property
    def admin_url(self) -> str:
        return f"http://127.0.0.1:{self.ports['admin_port']}"

    @property
    def inference_url(self) -> str:
        return f"http://127.0.0.1:{self.ports['inference_port']}"

    @property
    def auth(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"}

    def spec(self, worker_id: str) -> dict[str, Any]:
        """This agent as a static worker of a controller (flavor `agent`)."""
        return {"id": worker_id, "admin_url": self.admin_url, "inference_url": self.inference_url, "flavor": "agent"}

    def disk_loads(self) -> Counter[str]:
        """Versions this agent loaded from disk (successful `update_weights_from_disk`
        operations) over every start: read from its JSON log, which restarts append to."""
        loads: Counter[str] = Counter()
        for line in self.log_path.read_text(errors="replace").splitlines():
            if not line.startswith("{"):
                continue
            try:
                rec = json.loads(line)
            except ValueError:
                continue
            if (
                rec.get("event") == "operation"
                and rec.get("operation") == "update_weights_from_disk"
                and rec.get("status") == "ok"
            ):
                loads[rec["version"]] += 1
        return loads


class ControllerProcess(ChildProcess):
    """`python -m rlcp.controlplane` on the port its config names (0: one it picks)."""

    module = "rlcp.controlplane"
    ready_flag = "--port-file"

    def __init__(
        self,
        config: dict[str, Any],
        workdir: Path,
        *,
        name: str = "controller",
        start_timeout_s: float = 60.0,
        stop_timeout_s: float = 15.0,
        **kw: Any,
    ) -> None:
        super().__init__(
            config, workdir, name=name, start_timeout_s=start_timeout_s, stop_timeout_s=stop_timeout_s, **kw
        )
        self.port = 0

    def _on_ready(self, text: str) -> None:
        self.port = int(text)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


class GatewayProcess(ChildProcess):
    """`python -m rlcp.controlplane.gateway` (a standalone gateway); its ready file holds `{"port": N}`."""

    module = "rlcp.controlplane.gateway"
    ready_flag = "--port-file"

    def __init__(self, config: dict[str, Any], workdir: Path) -> None:
        super().__init__(config, workdir, name="gateway", start_timeout_s=60.0, stop_timeout_s=10.0)
        self.port = 0

    def _on_ready(self, text: str) -> None:
        self.port = json.loads(text)["port"]

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"
