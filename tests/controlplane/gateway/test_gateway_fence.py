"""The gateway's pure parts: the version fence, the routing table built from it, and the
balancer (least outstanding, rendezvous-hash affinity). No sockets: states are built here."""

from __future__ import annotations

import itertools
import math
from collections import Counter

import pytest

from rlcp.controlplane.fleet.desired import admitted_versions
from rlcp.controlplane.gateway.balancing.factory import make_policy
from rlcp.controlplane.gateway.balancing.least_load import LeastLoad
from rlcp.controlplane.gateway.balancing.policy import BalancingPolicy
from rlcp.controlplane.gateway.balancing.session_affinity import SessionAffinity, rank_for_session
from rlcp.controlplane.gateway.fence import fence, in_fence
from rlcp.controlplane.gateway.routing import Router, build_table
from rlcp.controlplane.settings.gateway import GatewaySettings
from rlcp.controlplane.workerspec import FLAVOR_DRIVERS, FLAVOR_REQUESTS
from rlcp.core.wire.agent.state import RequestCounts
from rlcp.core.wire.controller import AppliedState, DesiredState, FleetState, WorkerView


def worker(
    wid: str,
    version: str | None,
    *,
    ready: bool = True,
    paused: bool | None = False,
    reachable: bool = True,
    url: str | None = "default",
    alive: bool | None = True,
) -> WorkerView:
    return WorkerView(
        id=wid,
        admin_url=f"http://127.0.0.1:1/{wid}",
        inference_url=f"http://127.0.0.1:2/{wid}/" if url == "default" else url,
        flavor="agent",
        world_size=1,
        reachable=reachable,
        ready=ready,
        serving=ready and paused is False,
        paused=paused,
        requests=None,
        weight_version=version,
        loras={},
        engine_alive=alive,
    )


def state(
    workers: list[WorkerView],
    desired: str | None,
    applied: list[str],
    bound: int = 0,
    phase: str = "serving",
    pause_state: str = "running",
) -> FleetState:
    return FleetState(
        phase=phase,
        quiesced=False,
        pause_state=pause_state,
        requests=RequestCounts(running=0, waiting=0, frozen=0),
        desired=DesiredState(weight_version=desired, applied_versions=applied, staleness_bound=bound),
        applied=AppliedState(weight_version=None, converged=False, verified=False),
        membership_epoch=1,
        discovery_synced=True,
        last_operation=None,
        workers=workers,
    )


# -- admitted versions: the desired one, then k before it in the order they were applied -------------------
@pytest.mark.parametrize(
    ("desired", "applied", "bound", "expected"),
    [
        (None, ["v1", "v2"], 3, []),  # nothing desired: no version list
        ("v3", ["v1", "v2", "v3"], 0, ["v3"]),  # k=0: the desired version only
        ("v3", ["v1", "v2", "v3"], 1, ["v3", "v2"]),
        ("v3", ["v1", "v2", "v3"], 5, ["v3", "v2", "v1"]),  # fewer applied than k
        ("v1", ["v1", "v2", "v1"], 2, ["v1", "v2"]),  # back to an old version: no duplicates
        ("v2", ["v1", "v2", "v3", "v2"], 2, ["v2", "v3", "v1"]),  # application order, not name order
        ("v9", [], 2, ["v9"]),  # desired but not yet applied
    ],
)
def test_admitted_versions(desired, applied, bound, expected) -> None:
    assert admitted_versions(desired, applied, bound) == expected


def test_admitted_versions_never_exceed_the_bound() -> None:
    applied = [f"v{i}" for i in range(40)]
    for bound in range(0, 32):
        got = admitted_versions("v39", applied, bound)
        assert len(got) == bound + 1 and got[0] == "v39" and len(set(got)) == len(got)


# -- members inside the fence ---------------------------------------------------------------------------
def test_in_fence_desired_version_needs_ready() -> None:
    assert in_fence(worker("a", "v2"), "v2", ["v2"])
    assert not in_fence(worker("a", "v2", ready=False), "v2", ["v2"])


@pytest.mark.parametrize(
    "kwargs",
    [
        {"reachable": False},
        {"paused": True},
        {"paused": None},
        {"url": None},
        {"url": ""},
        {"alive": False},
    ],
)
def test_in_fence_refuses_what_cannot_serve(kwargs) -> None:
    assert not in_fence(worker("a", "v2", **kwargs), "v2", ["v2", "v1"])
    assert not in_fence(worker("a", "v1", **kwargs), "v2", ["v2", "v1"])


def test_an_older_admitted_version_serves_though_not_ready_for_the_desired_one() -> None:
    # Its readiness is gated on the desired version, so it is not ready; inside the bound it serves.
    behind = worker("a", "v1", ready=False)
    assert in_fence(behind, "v2", ["v2", "v1"])
    assert not in_fence(behind, "v2", ["v2"])
    assert not in_fence(worker("a", "v0"), "v2", ["v2", "v1"])  # outside the bound
    assert not in_fence(worker("a", None), "v2", ["v2", "v1"])  # base weights, never updated


def test_nothing_desired_routes_to_ready_members() -> None:
    assert in_fence(worker("a", None), None, [])
    assert not in_fence(worker("a", None, ready=False), None, [])


def test_fence_over_a_state_and_a_per_request_bound() -> None:
    ws = [
        worker("a", "v3"),
        worker("b", "v2", ready=False),
        worker("c", "v1", ready=False),
        worker("d", "v3", paused=True),
        worker("e", None),
    ]
    st = state(ws, "v3", ["v1", "v2", "v3"], bound=1)
    admitted, inside = fence(st)
    assert admitted == ["v3", "v2"] and [w.id for w in inside] == ["a", "b"]
    admitted, inside = fence(st, 0)  # the request asks for the desired version only
    assert admitted == ["v3"] and [w.id for w in inside] == ["a"]
    admitted, inside = fence(st, 2)
    assert [w.id for w in inside] == ["a", "b", "c"]


# -- the routing table and why it is empty -------------------------------------------------------------
def test_table_routes_strip_the_trailing_slash_and_keep_the_version() -> None:
    table = build_table(state([worker("a", "v1")], "v1", ["v1"]))
    assert table.desired == "v1" and table.why_empty == ""
    route = table.routes["a"]
    assert route.url == "http://127.0.0.1:2/a" and route.weight_version == "v1"


@pytest.mark.parametrize(
    ("st", "why"),
    [
        (state([], "v1", ["v1"]), "no members"),
        (state([worker("a", "v1", paused=True)], "v1", ["v1"], phase="updating"), "the fleet is updating"),
        (state([worker("a", "v1", paused=True)], "v1", ["v1"], phase="degraded", pause_state="paused"), "paused"),
        (state([worker("a", "v0")], "v1", ["v0", "v1"], phase="degraded"), "'v1'"),
    ],
)
def test_an_empty_table_says_why(st: FleetState, why: str) -> None:
    table = build_table(st)
    assert not table.routes and why in table.why_empty


class CountingSource:
    def __init__(self, st: FleetState) -> None:
        self.generation, self.st, self.reads = 1, st, 0

    def current(self) -> tuple[int, FleetState]:
        self.reads += 1
        return self.generation, self.st


def test_router_rebuilds_only_when_the_generation_moves(monkeypatch: pytest.MonkeyPatch) -> None:
    import rlcp.controlplane.gateway.routing as routing

    builds = Counter()
    real = routing.build_table

    def counted(st, bound=None):
        builds[bound] += 1
        return real(st, bound)

    monkeypatch.setattr(routing, "build_table", counted)
    source = CountingSource(state([worker("a", "v2"), worker("b", "v1", ready=False)], "v2", ["v1", "v2"]))
    router = Router(source)
    first = router.table()
    assert router.table() is first and builds[None] == 1
    assert set(router.table(1).routes) == {"a", "b"} and builds[1] == 1
    source.st = state([worker("a", "v2", paused=True)], "v2", ["v1", "v2"], phase="pausing")
    assert router.table() is first  # same generation: the cached table, by design
    source.generation += 1
    assert not router.table().routes and builds[None] == 2


def test_router_before_any_state() -> None:
    class Empty:
        def current(self):
            return None

    router = Router(Empty())
    assert router.table() is None and router.state() is None


# -- balancing ------------------------------------------------------------------------------------------
def order(
    members: list[str],
    load: dict[str, int],
    *,
    session: str | None = None,
    exclude: frozenset[str] = frozenset(),
    load_factor: float | None = None,
    policy: BalancingPolicy | None = None,
) -> list[str]:
    """The order a request would try the members in: the policy's successive picks, each
    leaving out those picked before (as the proxy does, try by try)."""
    policy = policy or SessionAffinity(load_factor=load_factor, without_key=LeastLoad())
    out: list[str] = []
    while (pick := policy.pick(members, load, key=session, exclude=exclude | set(out))) is not None:
        out.append(pick)
    return out


def test_least_outstanding_first_ties_in_turn() -> None:
    assert order(["a", "b", "c"], {"a": 2, "b": 0, "c": 1}) == ["b", "c", "a"]
    # Idle: each turn starts at another member, so one request at a time still spreads.
    least = LeastLoad()
    firsts = [least.pick(["a", "b", "c"], {}, exclude=frozenset()) for _ in range(6)]
    assert Counter(firsts) == {"a": 2, "b": 2, "c": 2}
    assert sorted(order(["a", "b", "c"], {"b": 0}, exclude=frozenset({"b"}))) == ["a", "c"]  # ties: in turn
    assert order([], {}) == []


def test_the_factory_makes_each_policy_from_the_settings() -> None:
    bounded = make_policy(GatewaySettings(affinity_load_factor=1.5))
    assert isinstance(bounded, SessionAffinity) and bounded.load_factor == 1.5
    assert isinstance(bounded.without_key, LeastLoad)  # a request without a session key
    assert isinstance(make_policy(GatewaySettings(), "least_load"), LeastLoad)
    with pytest.raises(ValueError, match="available: \\['least_load', 'session_affinity'\\]"):
        make_policy(GatewaySettings(), "random")  # type: ignore[arg-type]


def test_session_ranking_is_stable_and_spreads() -> None:
    members = [f"w{i}" for i in range(4)]
    keys = [f"session-{i}" for i in range(2000)]
    owner = {k: rank_for_session(k, members)[0] for k in keys}
    assert owner == {k: order(members, {}, session=k)[0] for k in keys}  # the load plays no part
    assert all(rank_for_session(k, list(reversed(members)))[0] == owner[k] for k in keys)  # nor the order
    spread = Counter(owner.values())
    assert min(spread.values()) > 2000 / 4 * 0.8, spread


def test_a_member_leaving_moves_only_its_sessions() -> None:
    members = [f"w{i}" for i in range(5)]
    keys = [f"s{i}" for i in range(3000)]
    before = {k: rank_for_session(k, members)[0] for k in keys}
    for gone in members:
        left = [m for m in members if m != gone]
        after = {k: rank_for_session(k, left)[0] for k in keys}
        moved = {k for k in keys if before[k] != after[k]}
        assert moved == {k for k in keys if before[k] == gone}
        # ...and they go where their own ranking said next, spread over the rest.
        assert all(after[k] == rank_for_session(k, members)[1] for k in moved)
    # A member joining takes sessions only for itself.
    grown = [*members, "w5"]
    after = {k: rank_for_session(k, grown)[0] for k in keys}
    assert all(after[k] in (before[k], "w5") for k in keys)


def test_failover_order_for_a_session_excludes_the_failed() -> None:
    members = ["a", "b", "c"]
    for key in (f"k{i}" for i in range(50)):
        ranked = order(members, {}, session=key)
        assert order(members, {}, session=key, exclude=frozenset(ranked[:1])) == ranked[1:]


def test_every_permutation_of_loads_picks_a_least_loaded() -> None:
    for loads in itertools.product(range(3), repeat=3):
        counts = dict(zip("abc", loads, strict=True))
        first = order(list("abc"), counts)[0]
        assert counts[first] == min(loads)


def test_the_table_carries_each_flavors_request_path() -> None:
    # Worked out once per table: the proxy asks no driver which flavor goes how.
    members = [worker(f"w-{f}", "v1").model_copy(update={"flavor": f}) for f in sorted(FLAVOR_DRIVERS)]
    routes = build_table(state(members, "v1", ["v1"])).routes
    assert {t.flavor: (t.pinned, t.names_version) for t in routes.values()} == {
        "agent": (False, False),
        "dynamo": (True, False),
        "sglang": (False, True),
        "vllm": (False, False),
    }
    assert set(FLAVOR_REQUESTS) <= set(FLAVOR_DRIVERS)


def test_a_member_reporting_a_name_no_header_can_carry_is_never_inside_the_fence() -> None:
    # Its version goes into X-RL-Expect-Weight-Version: a control character there would make every
    # request routed to it fail in the HTTP client (a 500), so it is left out, and the 503 says why.
    odd = [worker("w0", "v\u0001x"), worker("w1", "v1\n")]
    assert not in_fence(odd[0], None, []) and not in_fence(odd[1], None, [])
    table = build_table(state(odd + [worker("w2", "v1")], None, []))
    assert set(table.routes) == {"w2"}
    table = build_table(state(odd, None, []))
    assert not table.routes and "not a valid name" in table.why_empty and "w0" in table.why_empty


def test_bounded_load_keeps_a_session_home_until_its_worker_is_over_the_bound() -> None:
    members = ["w0", "w1", "w2", "w3"]
    key = "hot-session"
    home, second = rank_for_session(key, members)[:2]
    # Within the bound: the session's own worker (cap ceil(1.25 x 5 / 4) = 2, it has 1).
    assert order(members, dict.fromkeys(members, 1), session=key, load_factor=1.25)[0] == home
    # Its worker over ceil(1.25 x (outstanding + 1) / 4): its next worker in its own order.
    load = {home: 4, second: 0}
    assert order(members, load, session=key, load_factor=1.25)[0] == second  # cap ceil(1.25 * 5 / 4) = 2
    assert order(members, load, session=key, load_factor=1.25)[-1] == home  # still tried, last
    assert order(members, load, session=key)[0] == home  # plain affinity ignores load
    # Every worker at the bound: the session's own order, unchanged.
    even = dict.fromkeys(members, 3)
    assert order(members, even, session=key, load_factor=1.0) == rank_for_session(key, members)


def test_bounded_load_spreads_skewed_sessions() -> None:
    # Zipf-skewed keys, each request out while the next arrive: plain affinity piles the hot
    # keys on their workers; bounded load keeps every worker within the bound.
    import random

    members = ["w0", "w1", "w2", "w3"]
    keys = random.Random(3).choices(
        [f"s{k}" for k in range(64)], weights=[1 / (k + 1) ** 1.2 for k in range(64)], k=400
    )
    for factor, bound in ((None, None), (1.25, 1.25)):
        out: dict[str, int] = dict.fromkeys(members, 0)
        for key in keys:
            out[order(members, out, session=key, load_factor=factor)[0]] += 1
        if bound is not None:
            assert max(out.values()) <= math.ceil(bound * len(keys) / len(members))
        else:
            assert max(out.values()) > 1.25 * len(keys) / len(members)  # the skew this test is about
