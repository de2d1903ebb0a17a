"""The agent and the controller as child processes, started exactly as production starts them.

`python -m rlcp.agent --config <yaml> --ports-file <file>` and `python -m rlcp.controlplane --config <yaml>
--port-file <file>` bind port 0 (or the port in the config) and write what they bound to the ready
file once they serve, so nobody races for ports or guesses when a child is up. Each child leads its
own process group: a stop or a kill reaches a vLLM agent's engine processes too. Tests, the
benchmarks and `localfleet` all start their children through `ChildProcess`.
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
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, ClassVar, Self

import yaml

from rlcp.harness.tiny_model import serve_flags

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


def child_env(**extra: str) -> dict[str, str]:
    """The environment of a child: this one without settings variables, plus what a CPU vLLM
    engine needs (offline Hub, a small KV cache), plus `extra`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(_SETTINGS_PREFIXES)}
    env.update(
        HF_HUB_OFFLINE="1",
        TOKENIZERS_PARALLELISM="false",
        VLLM_CPU_KVCACHE_SPACE=os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1"),
    )
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


class ProcessSupervisor:
    """Starts a child again when it exits, as a kubelet restarts a container (`restartPolicy:
    Always`) or Ray an actor: same config, same files (an agent: same ports), after a back-off
    that doubles from `backoff_s` up to 30 s, at most `max_restarts` times each; past that the
    child is given up (`gave_up`). An agent ends itself when its engine dies
    (`exit_on_engine_death`), so this is what brings a local fleet back to full strength.
    `on_restart(child, exit_status, restarts)` is told each restart."""

    def __init__(
        self,
        children: Iterable[ChildProcess],
        *,
        max_restarts: int = 5,
        backoff_s: float = 1.0,
        on_restart: Callable[[ChildProcess, int | None, int], None] | None = None,
    ) -> None:
        self.children = list(children)
        self.max_restarts, self.backoff_s, self.on_restart = max_restarts, backoff_s, on_restart
        self.restarts: Counter[str] = Counter()
        self.gave_up: list[ChildProcess] = []

    async def run(self, poll_s: float = 0.2) -> None:
        """Until cancelled. A child restarted is not waited for here: its ready file shows when it serves."""
        while True:
            for child in self.children:
                if child.running() or child in self.gave_up or child.proc is None:
                    continue
                status = child.proc.returncode
                if self.restarts[child.name] >= self.max_restarts:
                    self.gave_up.append(child)
                    continue
                await asyncio.sleep(min(30.0, self.backoff_s * 2 ** self.restarts[child.name]))
                self.restarts[child.name] += 1
                child.spawn()
                if self.on_restart is not None:
                    self.on_restart(child, status, self.restarts[child.name])
            await asyncio.sleep(poll_s)


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


def cpu_seconds(pid: int) -> float | None:
    """CPU seconds a process's live threads have run so far (Linux /proc); None once it is gone.

    Summed from each thread's `schedstat` (nanoseconds): `stat`'s user + system times count in
    clock ticks (10 ms), as coarse as a whole update cycle of a small fleet. A thread that has
    ended drops out of the sum, so take differences over spans its threads live through."""
    try:
        tasks = list(Path(f"/proc/{pid}/task").iterdir())
    except OSError:
        return None
    total_ns = 0
    for task in tasks:
        try:
            total_ns += int((task / "schedstat").read_text().split()[0])
        except (OSError, IndexError, ValueError):
            continue  # the thread ended while being read
    return total_ns / 1e9


def controller_pids(pid: int) -> dict[str, int]:
    """The daemon's processes: the front and the core it started (`api.front`), or the one."""
    try:
        children = [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        children = []
    if not children:
        return {"controller": pid}
    return {"controller-front": pid, **{f"controller-core{'' if i == 0 else i}": c for i, c in enumerate(children)}}


class HttpServerProcess(ChildProcess):
    """A server that writes no ready file, started as `argv()` in `environment()` from its
    workdir: ready when `probe()` says so, by default when GET `ready_path` on `port` answers
    200. A subclass changes what it runs, its environment and, where readiness means more than
    one route's 200, the probe; the loop that waits for it is this one."""

    ready_path: ClassVar[str] = "/health"
    ready_timeout_s: ClassVar[float] = 2.0  # one readiness probe's deadline
    ready_poll_s: ClassVar[float] = 0.5  # between probes
    port: int

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def argv(self) -> list[str]:
        """The command line; every subclass says it."""
        raise NotImplementedError(f"{type(self).__name__} does not say what it runs")

    def listen_args(self) -> list[str]:
        """`--host 127.0.0.1 --port <port>`: loopback only, on the port picked for it."""
        return ["--host", "127.0.0.1", "--port", str(self.port)]

    def environment(self) -> dict[str, str]:
        """The child's environment: `child_env` and the extra variables it was given."""
        return child_env(**self.extra_env)

    def spawn(self) -> Self:
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.launch(self.argv(), env=self.environment(), cwd=self.workdir)
        return self

    def probe(self) -> bool:
        """Whether the server is ready now (a probe that fails for any reason is a no: not
        listening yet, or its engine still starting)."""
        import urllib.error
        import urllib.request

        try:
            ready_url = f"http://127.0.0.1:{self.port}{self.ready_path}"
            with urllib.request.urlopen(ready_url, timeout=self.ready_timeout_s) as resp:
                return bool(resp.status == 200)
        except (OSError, urllib.error.URLError):
            return False

    def _ready_text(self) -> str | None:
        assert self.proc is not None, f"{self.name} was never spawned"
        if self.proc.poll() is not None:
            raise self.failure(f"exited with {self.proc.returncode} while starting")
        return "up" if self.probe() else None

    def wait_ready(self) -> Self:
        deadline = time.monotonic() + self.start_timeout_s
        while self._ready_text() is None:
            if time.monotonic() > deadline:
                raise self._timed_out()
            time.sleep(self.ready_poll_s)
        return self

    async def wait_ready_async(self) -> Self:
        deadline = time.monotonic() + self.start_timeout_s
        while await asyncio.to_thread(self._ready_text) is None:
            if time.monotonic() > deadline:
                raise self._timed_out()
            await asyncio.sleep(self.ready_poll_s)
        return self


class VllmServeProcess(HttpServerProcess):
    """A stock `vllm serve` as a user starts it (`python -m vllm.entrypoints.openai.api_server`,
    since the `vllm` console script is broken in vllm-cpu), in dev mode with runtime LoRA
    updates: the `vllm` flavor's real counterpart. It has no ready file, so it is ready when
    `/health` answers 200. The port is picked once, so `kill` then `start` brings the same
    server back on the same address; `core` pins its OpenMP threads so two servers on this
    2-core machine do not both sit on core 0. `nice` lowers its scheduling priority (with its
    engine core child), for a test whose own process must keep up with the streams it reads."""

    def __init__(
        self,
        model: Path,
        workdir: Path,
        *,
        name: str = "vllm-serve",
        core: int = 0,
        port: int | None = None,
        start_timeout_s: float = 240.0,
        extra_args: Iterable[str] = (),
        nice: int = 0,
        **kw: Any,
    ) -> None:
        from rlcp.harness.http import free_port

        super().__init__({}, workdir, name=name, start_timeout_s=start_timeout_s, **kw)
        self.model, self.core, self.extra_args, self.nice = model, core, list(extra_args), nice
        self.port = port or free_port()

    def argv(self) -> list[str]:
        niced = ["nice", "-n", str(self.nice)] if self.nice else []  # `nice` execs: the pid stays the server's
        return [
            *niced,
            sys.executable,
            "-m",
            "vllm.entrypoints.openai.api_server",
            "--model",
            str(self.model),
            *serve_flags(),
            *self.listen_args(),
            *self.extra_args,
        ]

    def environment(self) -> dict[str, str]:
        return child_env(
            VLLM_SERVER_DEV_MODE="1",
            VLLM_ALLOW_RUNTIME_LORA_UPDATING="True",
            VLLM_CPU_OMP_THREADS_BIND=str(self.core),
            **self.extra_env,
        )

    def spec(self, worker_id: str) -> dict[str, Any]:
        """This server as a static worker of a controller with flavor `vllm`."""
        return {"id": worker_id, "admin_url": self.url, "inference_url": self.url, "flavor": "vllm"}
