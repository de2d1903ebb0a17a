"""The controller for tests: its settings over a sim fleet, served in this process, and
readiness read through the public HTTP contract (`GET /v1/rl/state`), not the controller's
internals, so this module holds whatever the controller's insides become.

    ctl = await start_controller(tmp_path, agents)      # agents: anything with .spec()
    status, result = await ctl.call("POST", "/v1/rl/pause", {"mode": "keep"})
    state = await ctl.state()
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from rlcp.controlplane.api.handling import CONTROLLER
from rlcp.controlplane.assembly import assemble
from rlcp.controlplane.settings import ControllerSettings
from rlcp.core.wire.controller.updates import UpdateWeightsRequest
from rlcp.harness.checkpoints import write_checkpoint
from rlcp.harness.http import bearer
from rlcp.harness.simfleet import TOKEN as AGENT_TOKEN
from rlcp.harness.waiting import wait_for

CTL_TOKEN = "ctl-token"
AUTH = bearer(CTL_TOKEN)
# Short deadlines on the controller's calls to its workers, so a test's fault resolves in seconds
# (an in-process controller's `workers` section, here and in `memory.MemoryFleet.controller`).
TEST_WORKER_CALLS: dict[str, Any] = {
    "timeout_s": 2,
    "attempts": 2,
    "retry_budget_s": 5,
    "pause_timeout_s": 5,
    "weight_load_timeout_s": 10,
    "checkpoint_wait_s": 1,
    "deadline_grace_s": 1,
}
# The same, but a call waits for a live worker as long as it takes (the gateway's `STALE_VIEW`, 60 s),
# for fleets whose tests need every live member read: with 2 s, a read of an in-process agent gave up
# while the test's own loop was held 2.5 s (load 14), and the member looked gone. An agent that was
# stopped still fails its calls at once (its port refuses them).
PATIENT_WORKER_CALLS: dict[str, Any] = {**TEST_WORKER_CALLS, "timeout_s": 60}


def controller_settings(tmp_path: Path, specs: list[dict[str, Any]], **overrides: Any) -> ControllerSettings:
    """Short deadlines and a fast reconciler for an in-process controller over `specs`; each
    keyword replaces a whole section."""
    base: dict[str, Any] = dict(
        api={"token": CTL_TOKEN},
        gateway={"port": 0},
        discovery={"kind": "static", "static": specs},
        workers={"token": AGENT_TOKEN, **TEST_WORKER_CALLS},
        reconcile={"poll_interval_s": 0.1, "interval_s": 0.1, "backoff_initial_s": 0.1, "backoff_max_s": 0.5},
        store={"kind": "file", "path": str(tmp_path / "state" / "desired.json")},
        allowed_roots=[str(tmp_path)],
        log_format="console",
        log_level="warning",
    )
    return ControllerSettings(**(base | overrides))


def controller_config(
    workdir: Path, workers: list[dict[str, Any]], roots: list[Path], **overrides: Any
) -> dict[str, Any]:
    """The YAML config of a controller process (`rlcp.harness.processes.ControllerProcess`): short
    deadlines and a fast reconciler, so faults resolve in seconds; the desired state in a file
    under `workdir`, which survives a restart. A dict keyword is merged into its section."""
    config: dict[str, Any] = {
        "controller_id": "faults",
        "api": {"host": "127.0.0.1", "port": 0, "token": CTL_TOKEN},
        "gateway": {"host": "127.0.0.1", "port": 0},
        "discovery": {"kind": "static", "static": workers},
        "workers": {
            "token": AGENT_TOKEN,
            "timeout_s": 3,
            "attempts": 3,
            "retry_budget_s": 10,
            "pause_timeout_s": 10,
            "weight_load_timeout_s": 20,
        },
        # last_seen shown at every poll (seen_refresh_s), so a test can watch each worker being read
        "reconcile": {
            "poll_interval_s": 0.2,
            "interval_s": 0.2,
            "backoff_initial_s": 0.2,
            "backoff_max_s": 1.0,
            "seen_refresh_s": 0.2,
        },
        "store": {"kind": "file", "path": str(workdir / "store" / "desired.json")},
        "allowed_roots": [str(r) for r in roots],
        "log_format": "json",
        "log_level": "info",
    }
    return merge_sections(config, overrides)


def merge_sections(config: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    """`config` with `overrides`: a dict merged into its section, any other value replacing it."""
    for key, value in overrides.items():
        config[key] = (
            {**config[key], **value} if isinstance(value, dict) and isinstance(config.get(key), dict) else value
        )
    return config


def fleet_reachable(state: dict[str, Any], workers: int | None = None) -> bool:
    """Discovery has synced and every member (all `workers` of them, if given) answered a poll."""
    members = state.get("workers", [])
    return (
        bool(state.get("discovery_synced"))
        and all(w["reachable"] for w in members)
        and (workers is None or len(members) == workers)
    )


async def wait_reachable(
    session: aiohttp.ClientSession,
    url: str,
    *,
    workers: int | None = None,
    timeout_s: float = 10.0,
    headers: dict[str, str] | None = None,
) -> dict[str, Any]:
    """Until the controller at `url` sees its whole fleet reachable; returns its state."""

    async def probe() -> dict[str, Any] | None:
        async with session.get(url + "/v1/rl/state", headers=headers, timeout=aiohttp.ClientTimeout(total=30)) as resp:
            state: dict[str, Any] = await resp.json() if resp.status == 200 else {}
        return state if fleet_reachable(state, workers) else None

    state: dict[str, Any] = await wait_for(
        probe,
        timeout_s,
        f"{workers or 'all'} workers reachable at {url}",
        interval_s=0.05,
        tolerate=(aiohttp.ClientError, TimeoutError),
    )
    return state


class Ctl:
    """An in-process controller behind aiohttp's test client. `ctl` is the controller object
    itself, for the tests that inspect its internals."""

    def __init__(self, client: TestClient[web.Request, web.Application]) -> None:
        self.client = client
        assert isinstance(client.server, TestServer)
        self.ctl = client.server.app[CONTROLLER]

    @property
    def url(self) -> str:
        return str(self.client.make_url("")).rstrip("/")

    async def call(
        self, method: str, path: str, body: Any = None, headers: dict[str, str] | None = AUTH, data: bytes | None = None
    ) -> tuple[int, Any]:
        resp = await self.client.request(method, path, json=body if data is None else None, data=data, headers=headers)
        return resp.status, await resp.json()

    async def state(self) -> dict[str, Any]:
        status, body = await self.call("GET", "/v1/rl/state", headers={})
        assert status == 200 and isinstance(body, dict)
        return body

    def worker(self, state: dict[str, Any], worker_id: str) -> dict[str, Any]:
        return next(w for w in state["workers"] if w["id"] == worker_id)

    async def wait_reachable(self, timeout_s: float = 10.0) -> dict[str, Any]:
        return await wait_reachable(self.client.session, self.url, timeout_s=timeout_s, headers=AUTH)

    async def wait_settled(self, timeout_s: float = 10.0) -> None:
        """Every member's status read and nothing left for the reconciler to do: its first pass
        (which tells each agent the desired version, a PUT that counts as touching it) is over."""
        members = self.ctl.members()
        reconciler = self.ctl.reconciler
        await wait_for(
            lambda: all(r.status is not None and not reconciler.needs_work(r) for r in members),
            timeout_s=timeout_s,
            what="the reconciler's first pass over every member",
        )


async def serve_controller(settings: ControllerSettings, *, reachable_timeout_s: float = 10.0) -> Ctl:
    """The controller of `settings` (with its gateway) served in this process, once every
    member is reachable; the caller closes `ctl.client`."""
    client = TestClient(TestServer(assemble(settings, token=CTL_TOKEN)))
    await client.start_server()
    ctl = Ctl(client)
    try:
        await ctl.wait_reachable(timeout_s=reachable_timeout_s)
    except BaseException:
        await client.close()
        raise
    return ctl


@contextlib.asynccontextmanager
async def serving_controller(settings: ControllerSettings, *, reachable_timeout_s: float = 10.0) -> AsyncIterator[Ctl]:
    """`serve_controller`, closed on the way out."""
    ctl = await serve_controller(settings, reachable_timeout_s=reachable_timeout_s)
    try:
        yield ctl
    finally:
        await ctl.client.close()


async def start_controller(tmp_path: Path, agents: list[Any], **overrides: Any) -> Ctl:
    """A controller over `agents` (anything with `.spec()`), once every one is reachable."""
    return await serve_controller(controller_settings(tmp_path, [a.spec() for a in agents], **overrides))


def update_body(version: str, path: Path, **extra: Any) -> dict[str, Any]:
    """The body of `POST /v1/rl/update_weights` from a directory on disk."""
    return {"version": version, "source": {"kind": "disk", "path": str(path)}, **extra}


def disk_update(root: Path, version: str, seed: int, **fields: Any) -> UpdateWeightsRequest:
    """An update to the checkpoint `root/<version>` (the weights of `seed`, written once), as the
    operations take it in memory."""
    path = root / version
    if not path.exists():
        write_checkpoint(path, seed)
    return UpdateWeightsRequest.model_validate(update_body(version, path, **fields))


async def rlctl(url: str, *args: str, token: str = CTL_TOKEN) -> tuple[int, str, str]:
    """`rlctl` as an operator runs it, a process of its own: (exit code, stdout, stderr)."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "rlcp.client.cli",
        "--url",
        url,
        "--token",
        token,
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env={"COLUMNS": "200", "PATH": ""},
    )
    try:
        # A guard against a hang only: a command ends in seconds, but its start alone took tens of
        # seconds at load ~20. A cut or failed test leaves no rlctl behind.
        out, err = await asyncio.wait_for(proc.communicate(), timeout=300)
    except BaseException:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
        raise
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()
