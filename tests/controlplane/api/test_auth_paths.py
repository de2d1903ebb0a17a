"""Tokens and paths on both APIs, driven from the OpenAPI documents so that a route added
later is covered without touching this file.

- Every route the document secures answers 401 (the error shape, naming `Authorization`)
  to a missing, wrong or malformed token, Bearer or Basic, and reaches no worker; the
  right token works as Bearer and as the password of Basic auth.
- Reads are open by default and 401 with `auth_reads`; probes and the document stay open.
- The token is read from an environment variable, a file, or a Kubernetes-mounted Secret
  (`..data` symlinks), on both sides, and is never written to a log line.
- A path with `..`, a symlink out of an allowed root, or a relative path is a 403 before any
  worker (controller) or engine primitive (agent) is called.

What tests/controlplane/api/test_controller_bad_input.py and tests/agent/admin/test_agent_bad_input.py
already cover (the field-by-field bad input, and the agent's paths on a real vLLM engine) is not repeated here.
"""

from __future__ import annotations

import base64
import os
from functools import partial
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer

from rlcp.agent.admin.app import build_admin_app
from rlcp.agent.admin.openapi import agent_document
from rlcp.agent.engine.sim import SimEngine
from rlcp.agent.service import AgentService
from rlcp.agent.settings import AgentSettings
from rlcp.agent.settings import load_settings as load_agent_settings
from rlcp.controlplane.api.openapi import controller_document
from rlcp.controlplane.api.unsupported import REFUSED
from rlcp.controlplane.assembly import assemble
from rlcp.controlplane.settings import load_settings as load_controller_settings
from rlcp.core.openapi import MUTATING, OPENAPI_PATH
from rlcp.harness.checkpoints import write_adapter, write_checkpoint
from rlcp.harness.controller import CTL_TOKEN, Ctl, controller_settings, start_controller
from rlcp.harness.simfleet import TOKEN, start_fleet
from rlcp.harness.waiting import wait_for
from tests.support.fleets import SimFleet
from tests.support.touches import assert_no_worker_touched, fresh_request_id, with_request_id

REFUSED_ROUTES = {(method, path) for method, path, _ in REFUSED}

pytestmark = pytest.mark.timeout(120)


def basic(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


def bad_headers(token: str) -> dict[str, dict[str, str]]:
    return {
        "missing": {},
        "wrong bearer": {"Authorization": "Bearer wrong-guess"},
        "token plus a byte": {"Authorization": f"Bearer {token}x"},
        "token prefix": {"Authorization": f"Bearer {token[:-1]}"},
        "no scheme": {"Authorization": token},
        "empty bearer": {"Authorization": "Bearer "},
        "wrong basic password": {"Authorization": basic("trainer", "wrong-guess")},
        "token as basic user": {"Authorization": basic(token, "")},
        "basic not base64": {"Authorization": "Basic %%%"},
    }


def operations(document: dict) -> list[tuple[str, str, bool]]:
    """(method, concrete path, secured) for every operation in the document."""
    out = []
    for path, methods in document["paths"].items():
        for method, op in methods.items():
            out.append(
                (
                    method.upper(),
                    path.replace("{name}", "some-adapter")
                    .replace("{id}", "no-such-operation")
                    .replace("{route}", "is_paused"),
                    bool(op.get("security")),
                )
            )
    return out


async def send(client: TestClient, method: str, path: str, headers: dict[str, str]) -> tuple[int, Any]:
    body = {} if method in MUTATING else None
    resp = await client.request(method, path, json=body, headers=headers)
    data = await resp.json() if resp.content_type == "application/json" else await resp.text()
    return resp.status, data


def assert_401(status: int, body: Any, what: Any) -> None:
    assert status == 401, (what, status, body)
    assert body["error"]["code"] == "unauthorized" and body["error"]["field"] == "Authorization", (what, body)


# -- stacks -------------------------------------------------------------------------------------------
class Agent:
    """A real agent on SimEngine, served on loopback, its engine primitives counted: a refused
    request must call none."""

    def __init__(self, settings: AgentSettings, token: str = TOKEN) -> None:
        self.settings, self.token = settings, token
        self.calls: list[str] = []

    @classmethod
    def with_roots(cls, roots: list[Path], *, auth_reads: bool = False) -> Agent:
        return cls(
            AgentSettings(
                agent_id="a0",
                engine={"kind": "sim", "model": "sim"},
                allowed_roots=roots,
                admin={"token": TOKEN, "auth_reads": auth_reads},
            )
        )

    async def start(self) -> Agent:
        self.engine = SimEngine(model_name="sim")
        await self.engine.start()
        self.service = AgentService(self.engine, self.settings)
        await self.service.start()
        enter = self.engine._enter

        async def counted(op: str, **kw: Any) -> None:
            self.calls.append(op)
            await enter(op, **kw)

        self.engine._enter = counted  # type: ignore[method-assign]
        self.client = TestClient(TestServer(build_admin_app(self.service, token=self.token)))
        await self.client.start_server()
        return self

    @property
    def url(self) -> str:
        return str(self.client.make_url("")).rstrip("/")

    def spec(self) -> dict:
        return {"id": self.settings.agent_id, "admin_url": self.url, "flavor": "agent"}

    async def stop(self) -> None:
        await self.client.close()
        await self.engine.shutdown()


@pytest.fixture
async def settled_fleet(sim_fleet: SimFleet) -> SimFleet:
    """`sim_fleet` once the reconciler's first pass has told every worker the desired version."""
    await sim_fleet.ctl.wait_settled()
    return sim_fleet


# -- tokens on every secured route, from the documents --------------------------------------------------
async def test_every_secured_controller_route_refuses_a_bad_token_and_touches_no_worker(settled_fleet):
    ctl, agents = settled_fleet
    secured = [(m, p) for m, p, s in operations(controller_document(auth_reads=False)) if s]
    assert {m for m, _ in secured} == {"POST", "PUT", "DELETE"} and len(secured) >= 20
    for method, path in secured:
        for name, headers in bad_headers(CTL_TOKEN).items():
            rid = fresh_request_id("bad-token")
            status, body = await send(ctl.client, method, path, with_request_id(rid, headers))
            assert_401(status, body, (method, path, name))
            assert_no_worker_touched(agents, rid, (method, path, name))
    desired = ctl.ctl.desired.state
    assert desired.weight_version is None and not desired.paused and desired.placement_replicas is None


async def test_every_secured_agent_route_refuses_a_bad_token_and_touches_no_engine(tmp_path):
    agent = await Agent.with_roots([tmp_path]).start()
    try:
        secured = [(m, p) for m, p, s in operations(agent_document(auth_reads=False)) if s]
        assert len(secured) >= 14
        for method, path in secured:
            for name, headers in bad_headers(TOKEN).items():
                status, body = await send(agent.client, method, path, headers)
                assert_401(status, body, (method, path, name))
        assert agent.calls == [] and agent.service.state().last_operations == []
    finally:
        await agent.stop()


async def test_the_right_token_works_as_bearer_and_as_basic_password(settled_fleet):
    ctl, agents = settled_fleet
    for headers in (
        {"Authorization": f"Bearer {CTL_TOKEN}"},
        {"Authorization": basic("anyone", CTL_TOKEN)},
        {"Authorization": basic("", CTL_TOKEN)},
        {"Authorization": f"bearer {CTL_TOKEN}"},
    ):
        status, body = await send(ctl.client, "POST", "/v1/rl/pause", headers)
        assert status == 200 and body["status"] == "ok", (headers, body)
    assert all(a.service.paused for a in agents)


@pytest.mark.parametrize("auth_reads", [False, True])
async def test_controller_reads_are_open_by_default_and_need_the_token_with_auth_reads(tmp_path, auth_reads):
    agents = await start_fleet(1, [tmp_path])
    ctl = await start_controller(tmp_path, agents, api={"token": CTL_TOKEN, "auth_reads": auth_reads})
    try:
        reads = [(m, p, s) for m, p, s in operations(controller_document(auth_reads=auth_reads)) if m == "GET"]
        assert any(s for *_, s in reads) == auth_reads
        for method, path, secured in reads:
            status, body = await send(ctl.client, method, path, {})
            if secured:
                assert_401(status, body, path)
                status, _ = await send(ctl.client, method, path, {"Authorization": f"Bearer {CTL_TOKEN}"})
            # /health is 503 while no worker serves; no operation has that id: 404; a vLLM route with no
            # fleet meaning: 501
            assert (
                status in (200, 503)
                or (path.endswith("/no-such-operation") and status == 404)
                or (status == 501 and ("GET", path) in REFUSED_ROUTES)
            ), (path, status)
        for probe in ("/healthz", "/readyz", "/health", OPENAPI_PATH):
            assert (await ctl.client.get(probe)).status != 401, probe
    finally:
        await ctl.client.close()
        for a in agents:
            await a.stop()


@pytest.mark.parametrize("auth_reads", [False, True])
async def test_agent_reads_are_open_by_default_and_need_the_token_with_auth_reads(tmp_path, auth_reads):
    agent = await Agent.with_roots([tmp_path], auth_reads=auth_reads).start()
    client = agent.client
    try:
        reads = [(m, p, s) for m, p, s in operations(agent_document(auth_reads=auth_reads)) if m == "GET"]
        assert any(s for *_, s in reads) == auth_reads
        for method, path, secured in reads:
            status, body = await send(client, method, path, {})
            if secured:
                assert_401(status, body, path)
                status, _ = await send(client, method, path, {"Authorization": f"Bearer {TOKEN}"})
            assert status == 200, (path, status)
        for probe in ("/healthz", "/readyz", OPENAPI_PATH):
            assert (await client.get(probe)).status == 200, probe
    finally:
        await agent.stop()


# -- where the token comes from ------------------------------------------------------------------------
def mounted_secret(directory: Path, key: str, value: str) -> Path:
    """A Secret volume as the kubelet writes it: the key is a symlink into `..data`, itself a
    symlink to a timestamped directory (swapped atomically on rotation); values often end in a newline."""
    stamped = directory / "..2026_11_21_12_00_00.000000001"
    stamped.mkdir(parents=True)
    (stamped / key).write_text(value + "\n")
    (directory / "..data").symlink_to(stamped.name)
    (directory / key).symlink_to(f"..data/{key}")
    return directory / key


def token_sources(tmp_path: Path, prefix: str, section: str, value: str) -> dict[str, tuple[dict, dict]]:
    """name -> (environment, settings overrides)."""
    plain = tmp_path / "plain-token"
    plain.write_text(value + "\n")
    secret = mounted_secret(tmp_path / "secret", "token", value)
    return {
        "env": ({f"{prefix}{section.upper()}__TOKEN": value}, {}),
        "env token_file": ({f"{prefix}{section.upper()}__TOKEN_FILE": str(plain)}, {}),
        "file": ({}, {"token_file": str(plain)}),
        "mounted secret": ({}, {"token_file": str(secret)}),
    }


@pytest.mark.parametrize("source", ["env", "env token_file", "file", "mounted secret"])
async def test_controller_token_sources(tmp_path, monkeypatch, source):
    value = "ctl-" + source.replace(" ", "-")
    env, api = token_sources(tmp_path, "RLCP_", "api", value)[source]
    for key, val in env.items():
        monkeypatch.setenv(key, val)
    # The workers' token from a mounted Secret too; this agent protects its reads, so the
    # controller reaches it only with that token read right.
    agent = await Agent.with_roots([tmp_path], auth_reads=True).start()
    worker_secret = mounted_secret(tmp_path / "workers-secret", "token", TOKEN)
    settings = load_controller_settings(
        **({"api": api} if api else {}),
        workers={"token_file": str(worker_secret), "timeout_s": 2},
        discovery={"kind": "static", "static": [agent.spec()]},
        store={"kind": "memory"},
        reconcile={"poll_interval_s": 0.1, "interval_s": 0.1},
        gateway={"port": 0},
    )
    token = settings.api.resolved_token()
    assert token == value  # a file's trailing newline is not part of the token
    client = TestClient(TestServer(assemble(settings, token=token)))
    await client.start_server()
    try:
        ctl = Ctl(client)
        await wait_for(lambda: all(r.reachable for r in ctl.ctl.members()), what="worker reached with its token")
        assert (await send(client, "POST", "/v1/rl/resume", {"Authorization": f"Bearer {token}"}))[0] == 200
        assert agent.service.state().last_operations[0].kind == "resume"
        assert_401(*(await send(client, "POST", "/v1/rl/resume", {"Authorization": f"Bearer {TOKEN}"})), source)
    finally:
        await client.close()
        await agent.stop()


@pytest.mark.parametrize("source", ["env", "env token_file", "file", "mounted secret"])
async def test_agent_token_sources(tmp_path, monkeypatch, source):
    value = "agent-" + source.replace(" ", "-")
    env, admin = token_sources(tmp_path, "RLAGENT_", "admin", value)[source]
    for key, val in env.items():
        monkeypatch.setenv(key, val)
    settings = load_agent_settings(
        engine={"kind": "sim", "model": "sim"}, allowed_roots=[str(tmp_path)], **({"admin": admin} if admin else {})
    )
    token = settings.admin.resolved_token()
    assert token == value
    agent = await Agent(settings, token=token).start()
    try:
        assert (await send(agent.client, "POST", "/resume", {"Authorization": basic("x", token)}))[0] == 200
        assert_401(*(await send(agent.client, "POST", "/resume", {"Authorization": f"Bearer {TOKEN}"})), source)
    finally:
        await agent.stop()


def test_a_missing_or_empty_token_stops_start_up(tmp_path):
    empty = tmp_path / "empty"
    empty.write_text("\n")
    with pytest.raises(ValueError, match="RLCP_API__TOKEN"):
        load_controller_settings(api={"token_file": str(empty)}).api.resolved_token()
    with pytest.raises(ValueError, match="RLAGENT_ADMIN__TOKEN"):
        load_agent_settings(engine={"kind": "sim"}, admin={"token_file": str(empty)}).admin.resolved_token()
    with pytest.raises(FileNotFoundError):
        load_agent_settings(engine={"kind": "sim"}, admin={"token_file": str(tmp_path / "nope")}).admin.resolved_token()


# -- no token in any log line --------------------------------------------------------------------------
async def test_no_token_in_any_log_line_over_a_full_cycle(settled_fleet, tmp_path, capfd):
    ctl, agents = settled_fleet
    ckpt, adapter = write_checkpoint(tmp_path / "ckpt", 1), write_adapter(tmp_path / "ad")
    bearer = {"Authorization": f"Bearer {CTL_TOKEN}"}
    as_basic = {"Authorization": basic("trainer", CTL_TOKEN)}
    # 401s first: a wrong token, the right one in the wrong scheme, a Basic user name.
    for headers in (
        {"Authorization": "Bearer wrong-guess"},
        {"Authorization": CTL_TOKEN},
        {"Authorization": basic(CTL_TOKEN, "wrong-guess")},
    ):
        assert (await send(ctl.client, "POST", "/v1/rl/pause", headers))[0] == 401
    steps = [
        ("POST", "/v1/rl/update_weights", {"version": "v1", "source": {"kind": "disk", "path": str(ckpt)}}),
        ("POST", "/v1/rl/loras", {"name": "ad", "path": str(adapter)}),
        ("POST", "/pause?mode=keep", None),
        ("POST", "/resume", None),
        ("DELETE", "/v1/rl/loras/ad", None),
        (
            "POST",
            "/v1/rl/weight_transfer/init",
            {"init_info": {"master_address": "127.0.0.1", "master_port": 29999, "world_size": 3}},
        ),
        ("POST", "/v1/rl/weight_transfer/start", {}),
        ("POST", "/v1/rl/weight_transfer/update", {"update_info": {"names": ["w"]}}),
        ("POST", "/v1/rl/weight_transfer/finish", {"weight_version": "b1"}),
        ("POST", "/v1/rl/weight_transfer/shutdown", {}),
    ]
    for i, (method, path, body) in enumerate(steps):
        resp = await ctl.client.request(method, path, json=body, headers=bearer if i % 2 else as_basic)
        assert resp.status == 200, (path, await resp.text())
    out, err = capfd.readouterr()
    logged = out + err
    assert "update_weights" in logged and "weight_transfer" in logged  # the cycle was logged...
    for secret in (CTL_TOKEN, TOKEN, "wrong-guess", base64.b64encode(f"trainer:{CTL_TOKEN}".encode()).decode()):
        assert secret not in logged, "a token reached a log line"  # ...without any token


# -- paths: 403 before any worker or engine is called ---------------------------------------------------
def bad_paths(root: Path) -> dict[str, str]:
    (root / "escape").symlink_to("/etc")
    (root / "inside").mkdir()
    (root / "inside" / "up").symlink_to("../..")
    return {
        "relative": "weights/ckpt",
        "dot relative": "./ckpt",
        "traversal": f"{root}/../../etc",
        "traversal in the middle": f"{root}/inside/../../etc",
        "symlink out": f"{root}/escape",
        "through a symlink out": f"{root}/escape/ssl",
        "symlink to a parent": f"{root}/inside/up",
        "outside": "/etc",
    }


def controller_path_requests(path: str) -> list[tuple[str, str, dict, str]]:
    """(method, route, body, the field the 403 names) for every controller route that takes a path."""
    return [
        ("POST", "/v1/rl/update_weights", {"version": "v9", "source": {"kind": "disk", "path": path}}, "source.path"),
        ("POST", "/update_weights", {"weight_dir": path, "weight_version": "v9"}, "weight_dir"),
        ("POST", "/v1/rl/loras", {"name": "ad", "path": path}, "path"),
        ("POST", "/load_lora_adapter", {"lora_name": "ad", "lora_path": path}, "lora_path"),
        ("POST", "/v1/load_lora_adapter", {"lora_name": "ad", "lora_path": path}, "lora_path"),
        ("POST", "/v1/rl/weight_transfer/finish", {"weight_version": "b9", "checkpoint_path": path}, "checkpoint_path"),
        ("POST", "/finish_weight_update", {"weight_version": "b9", "checkpoint_path": path}, "checkpoint_path"),
    ]


async def test_controller_refuses_bad_paths_with_403_before_any_worker(settled_fleet, tmp_path):
    ctl, agents = settled_fleet
    for name, path in bad_paths(tmp_path).items():
        for method, route, body, field in controller_path_requests(path):
            # Each call's own request id, which the controller hands on to every worker call it makes
            # for it: what the reconciler does meanwhile is not this call's (after a status read that
            # timed out while the test's loop was held, it told both agents the desired version again).
            rid = fresh_request_id("refused-path")
            status, resp = await ctl.call(method, route, body, headers=with_request_id(rid))
            assert (status, resp["error"]["code"], resp["error"]["field"]) == (403, "path_forbidden", field), (
                name,
                route,
                resp,
            )
            assert_no_worker_touched(agents, rid, route)
    assert ctl.ctl.desired.state.weight_version is None and ctl.ctl.desired.state.loras == {}
    assert ctl.ctl.desired.state.checkpoint is None


async def test_controller_refuses_a_nul_byte_in_a_path(settled_fleet, tmp_path):
    ctl, agents = settled_fleet
    for method, route, body, field in controller_path_requests(f"{tmp_path}/ckpt\x00/x"):
        rid = fresh_request_id("nul-path")
        status, resp = await ctl.call(method, route, body, headers=with_request_id(rid))
        assert (status, resp["error"]["field"]) == (400, field), (route, resp)
        assert_no_worker_touched(agents, rid, route)


async def test_agent_refuses_bad_paths_with_403_before_the_engine(tmp_path):
    agent = await Agent.with_roots([tmp_path]).start()
    auth = {"Authorization": f"Bearer {TOKEN}"}
    version = agent.service.weight_version
    try:
        for name, path in bad_paths(tmp_path).items():
            for route, body in (
                ("/v1/agent/weights/disk", {"path": path, "version": "v9"}),
                ("/v1/agent/loras", {"name": "ad", "path": path}),
            ):
                resp = await agent.client.post(route, json=body, headers=auth)
                data = await resp.json()
                assert (resp.status, data["error"]["code"], data["error"]["field"]) == (
                    403,
                    "path_forbidden",
                    "path",
                ), (name, route, data)
        assert agent.calls == [] and agent.service.state().last_operations == []
        assert agent.service.weight_version == version and agent.service.state().loras == []
    finally:
        await agent.stop()


async def test_a_symlink_inside_the_roots_is_followed_not_refused(settled_fleet, tmp_path):
    """The check resolves links, it does not ban them: a link to a checkpoint in a root works."""
    ctl, agents = settled_fleet
    ckpt = write_checkpoint(tmp_path / "real" / "ckpt", 3)
    (tmp_path / "latest").symlink_to(ckpt)
    status, result = await ctl.call(
        "POST", "/v1/rl/update_weights", {"version": "v3", "source": {"kind": "disk", "path": str(tmp_path / "latest")}}
    )
    assert status == 200, result
    assert all(a.service.weight_version == "v3" for a in agents)


def test_path_checks_hold_without_a_shared_mount(tmp_path):
    """A controller that does not see the weights checks lexically; workers check links."""
    from rlcp.controlplane.api.errors import to_api_error
    from rlcp.controlplane.fleet.paths import check_path

    settings = controller_settings(tmp_path, [], allowed_roots=["/mnt/weights-not-mounted-here"])
    check = partial(check_path, roots=settings.allowed_roots)
    assert check("/mnt/weights-not-mounted-here/step-1", "path") == "/mnt/weights-not-mounted-here/step-1"
    assert check("/mnt/weights-not-mounted-here/a/../step-2", "path") == "/mnt/weights-not-mounted-here/step-2"
    for bad in ("/mnt/weights-not-mounted-here/../x", "step-1", "/mnt/weights-not-mounted-here-2/x"):
        with pytest.raises(Exception) as exc:
            check(bad, "path")
        assert to_api_error(exc.value).status == 403, bad
    assert os.path.realpath("/mnt/weights-not-mounted-here/step-1") == "/mnt/weights-not-mounted-here/step-1"
