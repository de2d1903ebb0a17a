"""The adversarial fuzzing suite (issue 22): what an adversary sends, on every JSON route.

`tests/fuzz/api` explores each route's schema with schemathesis; this suite aims where such
exploration rarely lands, and where the 74 unexpected 500s and the two fleet-wide outages of
issue 22 were. For every route with a JSON body of the controller, the agent and the gateway,
hypothesis draws a body valid for the route's schema (schemathesis' positive strategy over
the served document), then one attack:

- a string in it (or a new field) replaced by a hostile one: control characters (NUL,
  \\x01, \\x1f, DEL), a trailing newline, whitespace, line and paragraph separators, a lone
  surrogate, non-ASCII, 5,000 characters;
- every path field pointed at a directory symlinked out of the roots, a real directory whose
  weights file is a symlink out of them, a directory that does not exist, or one without
  weights;
- a field nested past the depth limit; bytes that are not UTF-8;
- a Content-Encoding that lies (plain bytes labelled gzip or deflate), a truncated gzip
  stream, bytes after its end, a coding nobody decodes.

Asserted for every example: no 5xx; a body-level attack (depth, bytes, encoding) is a 4xx;
and after every rejected call (4xx) no worker's pause flag, weight version, desired version
or adapters changed. The servers are the controller (with its gateway) over two real agents
on SimEngine and one of those agents directly, on loopback, the reconciler stopped once the
fleet settled (its own calls would change workers under a case). Deterministic (a fixed
seed); `RLCP_FUZZ_ATTACKS` (default 25 per route) widens it. The counts are written to
`bench/out/fuzz_adversarial.json` and stated in docs/reliability.md.
"""

from __future__ import annotations

import asyncio
import gzip
import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import hypothesis.strategies as st
import pytest
import requests
import schemathesis
import structlog
from hypothesis import HealthCheck, Phase, given, seed, settings
from schemathesis.generation import GenerationMode

from rlcp.agent.admin.openapi import ROUTES as AGENT_ROUTES
from rlcp.agent.admin.openapi import agent_document
from rlcp.controlplane.api.handling import CONTROLLER
from rlcp.controlplane.api.openapi import ROUTES as CONTROLLER_ROUTES
from rlcp.controlplane.api.openapi import controller_document
from rlcp.controlplane.assembly import GATEWAY, assemble
from rlcp.controlplane.gateway.app import ROUTES as GATEWAY_ROUTES
from rlcp.controlplane.gateway.app import gateway_document
from rlcp.harness.checkpoints import write_adapter, write_checkpoint
from rlcp.harness.controller import CTL_TOKEN, controller_settings
from rlcp.harness.live import LiveLoop, serve
from rlcp.harness.simfleet import TOKEN, SimAgent
from rlcp.harness.waiting import wait_for

# One xdist worker runs the whole module, in its order: with the cases split over two, a worker can
# get the controller's accepted `POST /v1/rl/pause` without the `POST /v1/rl/resume` after it, and
# its gateway cases meet a paused fleet (10 answered 503 in one CI run). `Fleet.serve_again` too.
pytestmark = [pytest.mark.fuzz, pytest.mark.timeout(900), pytest.mark.xdist_group("adversarial")]

ATTACKS = int(os.environ.get("RLCP_FUZZ_ATTACKS", "60"))
# Record every outcome without failing on the first: to measure a build (an older one, say).
COUNT_ONLY = os.environ.get("RLCP_FUZZ_COUNT_ONLY") == "1"
SEED = int(os.environ.get("RLCP_FUZZ_SEED", "20260101"))
_PATH_KEYS = ("path", "weight_dir", "lora_path", "checkpoint_path", "weights_path")
# Free-form payloads whose contents only an engine judges (vLLM's weight-transfer info): a hostile
# string there is valid input, and what the engine says of it is the engine's business.
_OPAQUE = ("init_info", "update_info")
HOSTILE_NAMES = [
    "v\x00",
    "v\x01x",
    "v\x1f",
    "v\x7f",
    "v5\n",
    "\tv",
    "a b",
    " ",
    "",
    "v\u2028",
    "v\ud800x",
    "\udfff",
    "v\u00e9",
    "x" * 5000,
    "v\r\nX-Injected: 1",
]
hostile = st.one_of(
    st.sampled_from(HOSTILE_NAMES),
    st.text(alphabet=st.characters(categories=["Cc", "Cs", "Zs", "Zl", "Zp"]), min_size=1, max_size=6).map(
        lambda s: "v" + s
    ),
)
BODY_ATTACKS = ("nest", "bad-utf8", "gzip-lie", "deflate-lie", "gzip-truncated", "gzip-trailing", "unknown-coding")
PATH_ATTACKS = ("escape-dir", "escape-file", "missing", "no-weights")
attack = st.one_of(
    st.tuples(st.just("string"), st.integers(min_value=0, max_value=1000), hostile),
    st.tuples(st.just("path"), st.sampled_from(PATH_ATTACKS), st.just("")),
    st.tuples(st.sampled_from(BODY_ATTACKS), st.integers(min_value=65, max_value=20_000), st.just("")),
)
log = structlog.get_logger(__name__)
# Figures, per server: inputs tried, 5xx seen, rejected calls after which some worker changed.
FIGURES: dict[str, dict[str, Any]] = {}


class Fleet:
    """The controller (and its gateway) over two SimEngine agents with OpenAI ports, on a loop
    of its own; the reconciler stopped once the fleet is converged."""

    def __init__(self, base: Path) -> None:
        self.live = LiveLoop()
        self.root = base / "weights"
        self.dirs = _attack_dirs(self.root, base / "outside")
        self.agents: list[SimAgent] = [
            self.live.run(SimAgent(f"a{i}", [self.root], serve_inference=True).start()) for i in range(2)
        ]
        settings = controller_settings(
            base,
            [a.spec() for a in self.agents],
            allowed_roots=[str(self.root)],
            gateway={"port": 0, "hold_timeout_s": 1},
            weight_transfer={"init_timeout_s": 2, "chunk_timeout_s": 2, "idle_timeout_s": 3600},
        )
        self.app = assemble(settings, token=CTL_TOKEN)
        self.runner, self.controller_url = self.live.run(serve(self.app))
        self.live.run(self._settle())
        self.gateway_url = self.app[GATEWAY].url
        self.urls = {"controller": self.controller_url, "agent": self.agents[0].url, "gateway": self.gateway_url}
        self.auth = {
            "controller": {"Authorization": f"Bearer {CTL_TOKEN}"},
            "agent": {"Authorization": f"Bearer {TOKEN}"},
            "gateway": {},
        }

    async def _settle(self) -> None:
        ctl, gateway = self.app[CONTROLLER], self.app[GATEWAY]
        await wait_for(
            lambda: (
                ctl.registry.membership.synced
                and all(r.reachable for r in ctl.members())
                and not any(ctl.reconciler.needs_work(r) for r in ctl.members())
                and gateway.router.table() is not None
                and len(gateway.router.table().routes) == 2
            ),
            what="fleet settled, both workers inside the fence",
        )
        for task in asyncio.all_tasks():
            if task.get_name() == "reconciler":
                task.cancel()

    def serve_again(self) -> None:
        """A worker serving inside the gateway's fence again, whatever earlier cases did: a fleet
        an accepted pause left without one (the controller's, an agent's `prepare`) is resumed the
        way an operator would, through the admin APIs; the reconciler stays stopped."""

        async def restore() -> None:
            gateway = self.app[GATEWAY]
            if (table := gateway.router.table()) is not None and table.routes:
                return
            async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as http:
                for url, auth in ((self.controller_url + "/v1/rl/resume", self.auth["controller"]),) + tuple(
                    (a.url + "/resume", self.auth["agent"]) for a in self.agents if a.service.paused
                ):
                    async with http.post(url, json={}, headers=auth) as resp:
                        log.info("fuzz_fleet_resumed", url=url, status=resp.status)
            await wait_for(
                lambda: (table := gateway.router.table()) is not None and table.routes,
                timeout_s=30,
                what="a worker back inside the gateway's fence",
            )

        self.live.run(restore())

    def snapshot(self) -> list[tuple]:
        async def read() -> list[tuple]:
            return [
                (
                    a.service.paused,
                    a.engine.served_version,
                    a.service.desired_weight_version,
                    sorted((info.name, info.version) for info in a.service.state().loras),
                )
                for a in self.agents
            ]

        return self.live.run(read())

    def close(self) -> None:
        self.live.run(self.runner.cleanup())
        for a in self.agents:
            self.live.run(a.stop())
        self.live.close()


def _attack_dirs(root: Path, outside: Path) -> dict[str, Path]:
    real = write_checkpoint(outside / "ckpt", 1)
    (root / "escape-dir").parent.mkdir(parents=True, exist_ok=True)
    (root / "escape-dir").symlink_to(outside)
    escape_file = root / "escape-file"
    escape_file.mkdir()
    (escape_file / "model.safetensors").symlink_to(real / "model.safetensors")
    return {
        "escape-dir": root / "escape-dir",
        "escape-file": escape_file,
        "missing": root / "not-there",
        "no-weights": write_adapter(root / "no-weights"),
    }


@pytest.fixture(scope="module")
def adversarial_fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    stack = Fleet(tmp_path_factory.mktemp("adversarial"))
    yield stack
    stack.close()
    out = Path(__file__).resolve().parents[2] / "bench" / "out"
    out.mkdir(parents=True, exist_ok=True)
    (out / "fuzz_adversarial.json").write_text(json.dumps(FIGURES, indent=2, sort_keys=True))


def _body_routes(routes: Any) -> list[tuple[str, str]]:
    return sorted({(r.method, r.path) for r in routes if r.body is not None and "{" not in r.path})


_DOCUMENTS = {
    "controller": controller_document(auth_reads=False),
    "agent": agent_document(auth_reads=False),
    "gateway": gateway_document(secured=False),
}
_SCHEMAS = {name: schemathesis.openapi.from_dict(doc) for name, doc in _DOCUMENTS.items()}
_REFUSED_BY_BODY = {("controller", "POST", "/collective_rpc")}
CASES = (
    [("controller", *r) for r in _body_routes(CONTROLLER_ROUTES)]
    + [("agent", *r) for r in _body_routes(AGENT_ROUTES)]
    + [("gateway", *r) for r in _body_routes(GATEWAY_ROUTES)]
)


def _body_strategy(server: str, method: str, path: str) -> st.SearchStrategy[Any]:
    operation = _SCHEMAS[server][path][method]
    # An optional body left out (schemathesis' NotSet) is attacked as `{}`.
    return operation.as_strategy(generation_mode=GenerationMode.POSITIVE).map(
        lambda case: case.body if isinstance(case.body, dict | list) else {}
    )


def _string_slots(body: Any, under: tuple = ()) -> list[tuple]:
    """Paths (key tuples) to every string in the body, outside opaque payloads."""
    if isinstance(body, dict):
        return [p for k, v in body.items() if k not in _OPAQUE for p in _string_slots(v, (*under, k))]
    if isinstance(body, list):
        return [p for i, v in enumerate(body) for p in _string_slots(v, (*under, i))]
    return [under] if isinstance(body, str) else []


def _set(body: Any, where: tuple, value: Any) -> None:
    for key in where[:-1]:
        body = body[key]
    body[where[-1]] = value


def _attacked(body: Any, kind: str, arg: Any, text: str, dirs: dict[str, Path]) -> tuple[bytes, dict[str, str], bool]:
    """(bytes, headers, whether the answer must be a 4xx) for one attack on a valid body."""
    body = json.loads(json.dumps(body)) if body is not None else {}
    if not isinstance(body, dict):
        body = {}
    if kind == "path":
        paths = [p for p in _string_slots(body) if p and p[-1] in _PATH_KEYS]
        for where in paths:
            _set(body, where, str(dirs[arg]))
        if paths:
            return json.dumps(body).encode(), {}, False
        kind, arg, text = "string", 0, "v\x01x"
    if kind == "string":
        slots = _string_slots(body)
        if slots:
            _set(body, slots[arg % len(slots)], text)
        else:
            body["x\x01" if arg % 2 else "x"] = text
        return json.dumps(body).encode(), {}, False
    raw = json.dumps(body).encode()
    if kind == "nest":
        depth = arg
        return (
            json.dumps({**body, "n": 0}).encode().replace(b'"n": 0', b'"n": ' + b"[" * depth + b"]" * depth),
            {},
            True,
        )
    if kind == "bad-utf8":
        at = raw.find(b'"') + 1
        return raw[:at] + b"\xff\xfe" + raw[at:], {}, True
    if kind == "gzip-lie":
        return raw, {"Content-Encoding": "gzip"}, True
    if kind == "deflate-lie":
        return raw, {"Content-Encoding": "deflate"}, True
    if kind == "gzip-truncated":
        return gzip.compress(raw)[:-4], {"Content-Encoding": "gzip"}, True
    if kind == "gzip-trailing":
        return gzip.compress(raw) + b"{}", {"Content-Encoding": "gzip"}, True
    assert kind == "unknown-coding"
    return raw, {"Content-Encoding": "x-rot13"}, True


def _wait_ended(url: str, location: str, headers: dict[str, str], timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while requests.get(url + location, headers=headers, timeout=10).json()["status"] == "running":
        assert time.monotonic() < deadline, f"{location} still running"
        time.sleep(0.02)


@pytest.mark.parametrize("server,method,path", CASES, ids=[f"{s} {m} {p}" for s, m, p in CASES])
def test_an_attack_is_never_a_5xx_and_a_rejected_one_touches_no_worker(adversarial_fleet, server, method, path):
    figures = FIGURES.setdefault(server, {"tried": 0, "5xx": [], "touched_by_rejected": [], "accepted": 0})
    url, auth = adversarial_fleet.urls[server] + path, adversarial_fleet.auth[server]
    if server == "gateway":  # rollouts need a serving fleet; what the admin cases left is not this case's premise
        adversarial_fleet.serve_again()

    @seed(SEED)
    @settings(
        max_examples=ATTACKS,
        database=None,
        derandomize=True,
        deadline=None,
        phases=[Phase.explicit, Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    @given(body=_body_strategy(server, method, path), how=attack)
    def one(body: Any, how: tuple[str, Any, str]) -> None:
        kind, arg, text = how
        data, headers, must_refuse = _attacked(body, kind, arg, text, adversarial_fleet.dirs)
        before = adversarial_fleet.snapshot()
        response = requests.request(
            method, url, data=data, timeout=60, headers={"Content-Type": "application/json", **auth, **headers}
        )
        figures["tried"] += 1
        label = f"{server} {method} {path} {kind}"
        # `/collective_rpc` names an engine method in its body: one outside vLLM's weight protocol
        # has no fleet meaning, a 501 by design (saying what to call instead), touching no worker.
        documented = response.status_code == 501 and (server, method, path) in _REFUSED_BY_BODY
        if response.status_code >= 500 and not documented:
            figures["5xx"].append([label, response.status_code, response.text[:300]])
        if response.status_code == 202:
            _wait_ended(adversarial_fleet.urls[server], response.headers["Location"], auth)
        touched = False
        if 400 <= response.status_code < 500 or documented:
            after = adversarial_fleet.snapshot()
            if after != before:
                touched = True
                figures["touched_by_rejected"].append([label, response.status_code, str(before), str(after)])
        else:
            figures["accepted"] += 1
        if COUNT_ONLY:
            return
        assert response.status_code < 500 or documented, (label, response.status_code, response.text[:500])
        if must_refuse:
            assert 400 <= response.status_code < 500 or documented, (label, response.status_code, response.text[:300])
        assert not touched, (label, response.status_code, response.text[:300], before, adversarial_fleet.snapshot())

    one()
