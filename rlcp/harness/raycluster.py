"""A real Ray head for tests and measurements, on loopback only.

`ray start --head --block` in a session of its own, every port it opens chosen here and bound
to 127.0.0.1 (docs/ray.md, /work/shared/TESTING.md "Ray on these machines"):
`RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0` keeps Ray from rewriting the node address to the
machine's own, and `AUTOSCALER_METRIC_PORT` / `DASHBOARD_METRIC_PORT` move the two metric
listeners that are otherwise fixed. Stopping kills the process group and then any process
left whose command line names this head's own temp dir (Ray's workers start sessions of their
own), each by pid: `ray stop` would stop every Ray on the machine.

Its ports and its workers' range are one block of free ports below the kernel's ephemeral range
(`rlcp.harness.ports`), and `start` returns once every port is listened on by the head's own
processes, retrying with fresh ports when one was taken (see `RayHead.start`). A head found
dead (`ray start --block` exited, the dashboard gone) raises `RayHeadDied`, naming it with the
tails of the head's own logs, from `check` and from every state-API read that fails.

This module runs the `ray` CLI and never imports `ray`; a test drives the cluster with
`ray.init(address=head.gcs_address, namespace=...)`.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rlcp.harness.engine_env import engine_env
from rlcp.harness.ports import free_range, listening_sockets
from rlcp.harness.procfs import parent
from rlcp.harness.waiting import wait_for_sync

RAY = Path(sys.executable).with_name("ray")
WORKER_PORTS = 40  # the range workers (actors) listen in; one port each
PORT_NAMES = (  # `ray start --<name>=<port>`; two more, the metric ports, go by environment
    "port",
    "object-manager-port",
    "node-manager-port",
    "ray-client-server-port",
    "dashboard-port",
    "dashboard-agent-listen-port",
    "dashboard-agent-grpc-port",
    "runtime-env-agent-port",
    "metrics-export-port",
)
# The session's logs of the processes whose death takes the head down (`ray start --block`
# kills the rest once one exits), in the order worth reading.
LOG_FILES = (
    "raylet.err",
    "raylet.out",
    "gcs_server.err",
    "gcs_server.out",
    "dashboard.err",
    "dashboard.log",
    "runtime_env_agent.err",
    "dashboard_agent.err",
    "dashboard_agent.log",
    "monitor.err",
    "log_monitor.err",
    "ray_client_server.err",
)
ADDRESS_IN_USE = "Address already in use"
# A line of a session log that reports something wrong: Ray's C++ logs mark errors " E " and
# warnings " W " after the time; Python's logs say ERROR/WARNING; tracebacks and exits speak.
ERROR_LINE = re.compile(r"\d\d [EWF] \d| ERROR | WARNING |Error|Traceback|exit|fate-share|already in use|Killed")


class RayHeadDied(RuntimeError):
    """The head is dead (or its dashboard is): what died and the tails of the head's own logs.
    `port_clash`: its logs say a port was taken by someone else ("Address already in use")."""

    def __init__(self, message: str, *, port_clash: bool = False) -> None:
        super().__init__(message)
        self.port_clash = port_clash


def _dashboard_up(url: str) -> bool:
    try:
        with urllib.request.urlopen(url + "/api/v0/actors?limit=1", timeout=2) as resp:
            return bool(resp.status == 200)
    except OSError:
        return False


@dataclass
class RayHead:
    num_cpus: int = 2
    num_gpus: int = 0  # logical GPUs: Ray schedules them and sets CUDA_VISIBLE_DEVICES, no device needed
    temp_dir: Path | None = None  # default: a short dir under /tmp (Ray's socket paths are length-bound)
    ports: dict[str, int] = field(default_factory=dict)
    process: subprocess.Popen[bytes] | None = None
    log_path: Path | None = None
    death: str | None = None  # what killed the head and its log tails, once found dead
    failed_starts: list[str] = field(default_factory=list)  # a start that was retried: why, with logs
    _reported: bool = field(default=False, repr=False)  # the death printed once, by stop()

    @property
    def gcs_address(self) -> str:
        return f"127.0.0.1:{self.ports['port']}"

    @property
    def dashboard_url(self) -> str:
        return f"http://127.0.0.1:{self.ports['dashboard-port']}"

    def placed_fleet(
        self,
        namespace: str,
        prefix: str,
        agent: dict[str, Any],
        *,
        replicas: int,
        bundle: dict[str, float],
        discovery: dict[str, Any] | None = None,
        placement: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        """A controller's `discovery` and `placement` sections for `replicas` agents (`agent`: an
        agent's settings) placed on this head as detached actors `<prefix><i>` in `namespace`, each
        in a `bundle`, torn down with the controller, and listed back by discovery, where an actor
        that is DEAD (scaled away, killed for good) leaves the fleet (`dead_actors: drop`).
        `discovery` and `placement`: settings over these (poll intervals, deadlines)."""
        return {
            "discovery": {
                "kind": "ray",
                "ray": {
                    "dashboard_url": self.dashboard_url,
                    "namespace": namespace,
                    "name_prefix": prefix,
                    "dead_actors": "drop",
                    **(discovery or {}),
                },
            },
            "placement": {
                "kind": "ray",
                "ray": {
                    "address": self.gcs_address,
                    "namespace": namespace,
                    "name_prefix": prefix,
                    "replicas": replicas,
                    "bundle": bundle,
                    "teardown": True,
                    "agent": agent,
                    **(placement or {}),
                },
            },
        }

    def start(self, *, timeout_s: float = 300.0, attempts: int = 3) -> RayHead:
        """Start the head and return once every port it was given is listened on by its own processes.

        A head that dies, or whose port another process took, ends the wait at once (`_started`),
        so `timeout_s` is only for a head that lives and never serves: long enough that a loaded
        machine's start-up never meets it (60 s did, at load 25, in a placement test).

        The dashboard answers seconds before the raylet's agents (runtime env agent, dashboard agent)
        bind their ports; an agent that cannot bind exits, the raylet exits with it and `ray start
        --block` then kills the whole head (seen in CI: "[Errno 98] Address already in use" in
        runtime_env_agent.err, the head gone ~10 s after the dashboard first answered). So the ports
        are taken below the kernel's ephemeral range (`free_range`), where no outgoing connection
        and no `free_port()` user can take them while Ray starts, and a start whose head dies or
        whose port is taken by another process anyway is retried with fresh ports and a fresh temp
        dir, `attempts` times in all; the failed starts' log tails are kept in `failed_starts`.
        """
        given_dir = self.temp_dir
        for attempt in range(1, attempts + 1):
            try:
                return self._start_once(timeout_s=timeout_s)
            except RayHeadDied as exc:
                self.failed_starts.append(str(exc))
                if attempt == attempts or not exc.port_clash:
                    raise
                self.temp_dir = given_dir  # the failed dir was removed by stop(): a fresh one
                self.ports, self.death, self._reported = {}, None, False
        raise AssertionError("unreachable: the last attempt returns or raises")

    def _start_once(self, *, timeout_s: float) -> RayHead:
        # One block: the head's own ports, then its workers' range; so one head's workers never
        # bind a port another head was given (the ranges are chosen free, at random).
        names = (*PORT_NAMES, "autoscaler-metric", "dashboard-metric")
        first = free_range(len(names) + WORKER_PORTS)
        self.ports = {name: first + i for i, name in enumerate(names)}
        workers = first + len(names)
        if self.temp_dir is None:
            self.temp_dir = Path(tempfile.mkdtemp(prefix="rlcp-ray-", dir="/tmp"))
        env = {
            **os.environ,
            **engine_env(),  # the agents Ray places inherit it
            "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
            "RAY_USAGE_STATS_ENABLED": "0",
            "AUTOSCALER_METRIC_PORT": str(self.ports["autoscaler-metric"]),
            "DASHBOARD_METRIC_PORT": str(self.ports["dashboard-metric"]),
        }
        cmd = [
            str(RAY),
            "start",
            "--head",
            "--block",
            "--node-ip-address=127.0.0.1",
            f"--num-cpus={self.num_cpus}",
            f"--num-gpus={self.num_gpus}",
            "--include-dashboard=true",
            "--dashboard-host=127.0.0.1",
            f"--temp-dir={self.temp_dir}",
            "--disable-usage-stats",
            f"--min-worker-port={workers}",
            f"--max-worker-port={workers + WORKER_PORTS - 1}",
            *(f"--{name}={self.ports[name]}" for name in PORT_NAMES),
        ]
        self.log_path = self.temp_dir / "ray-start.log"
        with self.log_path.open("wb") as log:
            self.process = subprocess.Popen(
                cmd, env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True
            )
        try:
            try:
                found = wait_for_sync(
                    self._started, timeout_s=timeout_s, what="every port of the Ray head listened on", interval_s=0.2
                )
            except AssertionError as exc:
                raise AssertionError(f"{exc}\n{self.log_tails()}") from None
            self.check(found if isinstance(found, str) else None)
        except BaseException:
            self.stop()
            raise
        return self

    def _started(self) -> str | bool:
        """True once every port given to the head is listened on by the head's own processes and
        the state API answers; a string saying why not, when it never will: the head exited, one
        of its processes logged a failed bind, or another process listens on one of its ports (an
        agent that cannot bind takes the raylet down, but `ray start --block` notices only once
        its own start-up is over, ~25 s later)."""
        dead = self._dead()
        if dead is not None:
            return dead
        if self.temp_dir is not None:  # an agent that failed to bind: the head is as good as dead
            for err in (self.temp_dir / "session_latest" / "logs").glob("*.err"):
                with contextlib.suppress(OSError):
                    if ADDRESS_IN_USE in err.read_text(errors="replace"):
                        return f"a process of the Ray head could not bind its port ({err.name}): {ADDRESS_IN_USE}"
        sockets = listening_sockets()  # before the pids: a process spawned in between must not look foreign
        mine = set(self.pids())
        names = {port: name for name, port in self.ports.items()}
        listening: set[int] = set()
        for _, port, owners in sockets:
            if owners & mine:
                listening.add(port)
            elif port in names and owners:
                return f"port {port} ({names[port]}) is taken by pid {sorted(owners)}, not this head: {ADDRESS_IN_USE}"
        return listening >= set(self.ports.values()) and _dashboard_up(self.dashboard_url)

    def _dead(self) -> str | None:
        """Why this head is dead, or None: `ray start --block` exits (killing the rest) once any of
        the head's processes dies, so its exit is the sign."""
        if self.process is None:
            return "the Ray head was never started"
        code = self.process.poll()
        if code is not None:
            return f"the Ray head's `ray start --block` (pid {self.process.pid}) exited with {code}"
        return None

    def check(self, reason: str | None = None) -> None:
        """Raise RayHeadDied, naming what died and with the tails of the head's own logs, if the head
        is dead or its dashboard is gone (or `reason` says what is wrong); else return. The state-API
        reads call it when a read fails, so a test sees a dead head named, not `Connection refused`."""
        reason = reason or self._dead()
        if reason is None and self.ports:
            dashboard = self.ports["dashboard-port"]
            if dashboard not in {port for _, port in self.listeners()}:
                reason = f"no process of the Ray head listens on its dashboard port {dashboard}"
        if reason is not None:
            tails = self.log_tails()
            self.death = f"{reason}\n{tails}"
            raise RayHeadDied(self.death, port_clash=ADDRESS_IN_USE in self.death)

    def log_tails(self, lines: int = 12, limit: int = 8000) -> str:
        """What the head's own logs say went wrong: the last `lines` lines of ray-start.log (where
        `ray start --block` names the process that exited, with its tail) and of
        ray_process_exit.log, then from the session's logs of the processes whose death takes the
        head down the last `lines` lines that report an error, each under its file name; at most
        `limit` characters."""
        if self.temp_dir is None:
            return "(no temp dir: no logs)"
        logs = self.temp_dir / "session_latest" / "logs"
        out: list[str] = []
        for path in (self.temp_dir / "ray-start.log", logs / "ray_process_exit.log", *(logs / f for f in LOG_FILES)):
            try:
                text = path.read_text(errors="replace")
            except OSError:
                continue
            kept = [line for line in text.splitlines() if line.strip() and "[state-dump]" not in line]
            if path.parent == logs and path.name != "ray_process_exit.log":
                kept = [line for line in kept if ERROR_LINE.search(line)]
            if kept:
                out.append(f"--- {path.relative_to(self.temp_dir)} (last {min(lines, len(kept))} lines)")
                out.extend(line[:400] for line in kept[-lines:])
        text = "\n".join(out) or f"(no logs under {self.temp_dir})"
        return text if len(text) <= limit else "...\n" + text[-limit:]

    def pids(self) -> list[int]:
        """Every live process of this head: `ray start` and its descendants, and any process whose
        command line names this head's own temp dir (a worker that left the process tree)."""
        marker = str(self.temp_dir).encode()
        parents: dict[int, int] = {}
        found: set[int] = set()
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            if (ppid := parent(int(entry.name))) is None:
                continue
            parents[int(entry.name)] = ppid
            with contextlib.suppress(OSError):
                if marker in (entry / "cmdline").read_bytes():
                    found.add(int(entry.name))
        if self.process is not None and self.process.poll() is None:
            found.add(self.process.pid)
        grown = True
        while grown:
            more = {pid for pid, parent in parents.items() if parent in found} - found
            found |= more
            grown = bool(more)
        return sorted(found)

    def dashboard_pid(self) -> int:
        """The pid of this head's dashboard process (a test stops or kills it)."""
        marker = str(self.temp_dir).encode()
        for pid in self.pids():
            with contextlib.suppress(OSError):
                cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
                if marker in cmdline and b"dashboard/dashboard.py" in cmdline:
                    return pid
        raise RayHeadDied(f"no dashboard process in the Ray head\n{self.log_tails()}")

    def _state_rows(self, resource: str, query: str = "") -> list[dict[str, Any]]:
        url = f"{self.dashboard_url}/api/v0/{resource}?detail=true&limit=1000{query}"
        try:
            with urllib.request.urlopen(url, timeout=5) as resp:
                return list(json.load(resp)["data"]["result"]["result"])
        except OSError:
            self.check()  # a dead head is named, with its logs; a live one's error stands
            raise

    def actors(self, namespace: str, prefix: str) -> dict[str, dict[str, Any]]:
        """Named actors of `namespace` whose name starts with `prefix`, alive or restarting, by name
        (the dashboard's state API rows: pid, state, num_restarts, repr_name, ...)."""
        rows = self._state_rows("actors", f"&filter_keys=ray_namespace&filter_predicates=%3D&filter_values={namespace}")
        return {r["name"]: r for r in rows if r.get("name", "").startswith(prefix) and r["state"] != "DEAD"}

    def placement_groups(self, prefix: str) -> list[str]:
        """Names of the placement groups starting with `prefix` that are not removed."""
        return sorted(
            r["name"]
            for r in self._state_rows("placement_groups")
            if r.get("name", "").startswith(prefix) and r["state"] != "REMOVED"
        )

    def remove_named(self, namespace: str, prefix: str, *, timeout_s: float = 60.0) -> None:
        """Kill the named actors of `namespace` and remove the placement groups whose names start
        with `prefix`, from a Ray driver of its own (a child process: this module never imports
        `ray`). For a test that found leftovers and must start the next case clean."""
        script = (
            "import sys, ray\n"
            "address, namespace, prefix = sys.argv[1:4]\n"
            "ray.init(address=address, namespace=namespace, logging_level='error', log_to_driver=False)\n"
            "for entry in ray.util.list_named_actors(all_namespaces=True):\n"
            "    if entry['namespace'] == namespace and entry['name'].startswith(prefix):\n"
            "        ray.kill(ray.get_actor(entry['name'], namespace=namespace), no_restart=True)\n"
            "for info in ray.util.placement_group_table().values():\n"
            "    if info.get('state') != 'REMOVED' and (info.get('name') or '').startswith(prefix):\n"
            "        try:\n"
            "            ray.util.remove_placement_group(ray.util.get_placement_group(info['name']))\n"
            "        except ValueError:\n"
            "            pass\n"
            "ray.shutdown()\n"
        )
        env = {**os.environ, "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}
        subprocess.run(
            [sys.executable, "-c", script, self.gcs_address, namespace, prefix],
            env=env,
            check=True,
            timeout=timeout_s,
            stdin=subprocess.DEVNULL,
            capture_output=True,
        )

    def listeners(self) -> list[tuple[str, int]]:
        """(address, port) of every TCP socket this head's processes listen on (`ss -ltnp`)."""
        sockets = listening_sockets()
        pids = set(self.pids())
        return sorted((address, port) for address, port, owners in sockets if owners & pids)

    def stop(self, *, grace_s: float = 5.0) -> None:
        """Stop every process of the head and remove its temp dir (kept with RLCP_KEEP_RAY_TEMP=1,
        for a look at a head's logs). A head that died on its own is reported on stderr first,
        with its log tails, before they go with the dir."""
        if self.death is None and self.process is not None and self.process.poll() is not None:
            with contextlib.suppress(RayHeadDied):
                self.check()
        if self.death is not None and not self._reported:
            print(f"Ray head {self.temp_dir} had died: {self.death}", file=sys.stderr)
            self._reported = True
        if self.process is not None and self.process.poll() is None:
            try:
                os.killpg(self.process.pid, signal.SIGTERM)  # `ray start --block` stops its children on TERM
            except ProcessLookupError:
                pass
            try:
                self.process.wait(timeout=grace_s)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(timeout=grace_s)
        deadline = time.monotonic() + grace_s
        while self.pids() and time.monotonic() < deadline:
            time.sleep(0.2)
        for pid in self.pids():  # workers in sessions of their own, still running: by pid
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        keep = os.environ.get("RLCP_KEEP_RAY_TEMP") == "1"
        if not keep and self.temp_dir is not None and self.temp_dir.name.startswith("rlcp-ray-"):
            shutil.rmtree(self.temp_dir, ignore_errors=True)
