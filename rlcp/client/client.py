"""Python client of the controller API, for trainers (one call per step) and for rlctl.

    ControlPlaneClientError     the root (`ControlPlaneError` still names it: its earlier name)
    ├── ControllerUnreachable   connect error or deadline (names the URL)
    ├── AuthError               401: missing or wrong token
    ├── RequestRejected         4xx: carries status, code, field, message
    │   └── MembershipChanged   409 `membership_changed`: the fleet moved under the broadcast
    │                           group; carries who joined, left and restarted (`change`)
    ├── OperationFailed         207/502: carries the OperationResult, every worker's result
    └── ConvergeTimeout         wait_converged ran out of time (names the workers behind)

Every call has a deadline. `SyncControlPlaneClient` wraps the async client for code
without an event loop (a training script). `ControllerWeightSyncClient` is vLLM's
`VLLMWeightSyncClient` protocol over the controller: hand it to a vLLM trainer-side
weight transfer engine and one broadcast from the trainer updates the whole fleet.
"""

from __future__ import annotations

import asyncio
import functools
import threading
import time
import types
from collections.abc import Callable, Coroutine
from typing import Any, Concatenate, Generic, ParamSpec, TypeVar, overload
from urllib.parse import quote, urlencode

import aiohttp

from rlcp.core.wire.agent.control import PauseMode
from rlcp.core.wire.controller import FleetsListing, FleetState, MembershipDelta, OperationResult, PlacementView

T = TypeVar("T")
P = ParamSpec("P")
_LONG_S = 1800.0  # an update transaction: a weight load per worker plus pause and verify


class ControlPlaneClientError(Exception):
    """Whatever went wrong in a call to the controller, as this client sees it (the daemon's own
    root error, `rlcp.controlplane.errors.ControlPlaneError`, is another thing)."""


# The name this root had before; trainers written against it catch it still.
ControlPlaneError = ControlPlaneClientError


class ControllerUnreachable(ControlPlaneClientError):
    pass


class AuthError(ControlPlaneClientError):
    pass


class RequestRejected(ControlPlaneClientError):
    def __init__(self, status: int, code: str, message: str, field: str | None) -> None:
        where = f" field {field!r}" if field else ""
        super().__init__(f"rejected ({status}){where}: {message}")
        self.status, self.code, self.message, self.field = status, code, message, field


class MembershipChanged(RequestRejected):
    """The weight-transfer group is stale: `change` names the members that joined, left or
    restarted since its init. Form the group again (init with the current members)."""

    def __init__(self, message: str, change: MembershipDelta) -> None:
        super().__init__(409, "membership_changed", message, None)
        self.change = change


class OperationFailed(ControlPlaneClientError):
    def __init__(self, result: OperationResult) -> None:
        failed = [f"{r.worker_id} ({r.phase}: {r.message})" for r in result.results if r.status in ("error", "timeout")]
        super().__init__(f"{result.kind} {result.status}: failed on {', '.join(failed) or 'no worker'}")
        self.result = result


class ConvergeTimeout(ControlPlaneClientError):
    pass


def _with_selector(path: str, selector: str | None) -> str:
    return path if selector is None else f"{path}?{urlencode({'selector': selector})}"


def _object(data: object, what: str) -> dict[str, Any]:
    """A JSON answer that must be an object (every read of the controller's API answers one)."""
    if not isinstance(data, dict):
        raise ControlPlaneClientError(f"{what}: the controller answered a {type(data).__name__}, not an object")
    return data


class ControlPlaneClient:
    def __init__(
        self,
        base_url: str,
        *,
        token: str | None = None,
        timeout_s: float = 30.0,
        session: aiohttp.ClientSession | None = None,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.timeout_s = timeout_s
        self._headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._session = session
        self._owns_session = session is None
        # The last state document and its ETag: a poll of an unchanged state is a 304, no body.
        self._state: tuple[str, dict[str, Any]] | None = None

    async def __aenter__(self) -> ControlPlaneClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        if self._owns_session and self._session is not None:
            await self._session.close()
            self._session = None

    async def _request(
        self,
        method: str,
        path: str,
        body: Any = None,
        timeout_s: float | None = None,
        etag: str | None = None,
        answer: dict[str, str | None] | None = None,
    ) -> object:
        """The answer's JSON (None for a 304); `answer["etag"]` gets its ETag when `answer` is given."""
        if self._session is None:
            # No session-wide limit: each call has its own deadline, and an update
            # transaction may rightly take longer than aiohttp's default 300 s.
            self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None))
        url = self.base_url + path
        deadline = timeout_s or self.timeout_s
        try:
            async with asyncio.timeout(deadline):
                headers = self._headers | ({"If-None-Match": etag} if etag else {})
                async with self._session.request(method, url, json=body, headers=headers) as resp:
                    status = resp.status
                    data = None if status == 304 else await resp.json(content_type=None)
                    if answer is not None:
                        answer["etag"] = resp.headers.get("ETag")
        except TimeoutError as exc:
            raise ControllerUnreachable(
                f"the controller at {self.base_url} did not answer within {deadline:g}s"
            ) from exc
        except aiohttp.ClientError as exc:
            raise ControllerUnreachable(f"cannot reach the controller at {self.base_url}: {exc}") from exc
        except ValueError as exc:
            raise ControlPlaneClientError(f"{method} {path}: the controller answered {status} without JSON") from exc
        if status == 401:
            raise AuthError("unauthorized: missing or wrong token")
        if status in (207, 502) and isinstance(data, dict) and "results" in data:
            raise OperationFailed(OperationResult.model_validate(data))
        if status >= 400:
            err = (data or {}).get("error", {}) if isinstance(data, dict) else {}
            if status == 409 and err.get("code") == "membership_changed":
                raise MembershipChanged(err.get("message", ""), MembershipDelta.model_validate(err))
            raise RequestRejected(status, err.get("code", "error"), err.get("message", str(data)), err.get("field"))
        return data

    # -- reads -------------------------------------------------------------------------
    async def state(self, selector: str | None = None) -> FleetState:
        return FleetState.model_validate(await self.state_raw(selector))

    async def state_raw(self, selector: str | None = None) -> dict[str, Any]:
        """The state document; polled again, a 304 when it has not changed (`If-None-Match`).
        With `selector` (a label selector), only the matching members' rows, read afresh."""
        if selector is not None:
            return _object(await self._request("GET", _with_selector("/v1/rl/state", selector)), "GET /v1/rl/state")
        answer: dict[str, str | None] = {}
        data = await self._request("GET", "/v1/rl/state", etag=self._state[0] if self._state else None, answer=answer)
        if data is None and self._state is not None:  # 304: unchanged
            return self._state[1]
        document = _object(data, "GET /v1/rl/state")
        if etag := answer.get("etag"):
            self._state = (etag, document)
        return document

    async def workers(self, selector: str | None = None) -> dict[str, Any]:
        return _object(await self._request("GET", _with_selector("/v1/rl/workers", selector)), "GET /v1/rl/workers")

    async def operations(self, limit: int = 64) -> list[OperationResult]:
        body = _object(await self._request("GET", f"/v1/rl/operations?limit={limit}"), "GET /v1/rl/operations")
        return [OperationResult.model_validate(op) for op in body["operations"]]

    async def placement(self) -> PlacementView:
        return PlacementView.model_validate(await self._request("GET", "/v1/rl/placement"))

    async def fleets(self) -> FleetsListing:
        """The controller's fleets (ask the root: a named fleet's base URL serves its own API only)."""
        return FleetsListing.model_validate(await self._request("GET", "/v1/rl/fleets"))

    # -- operations ----------------------------------------------------------------------
    async def scale(self, replicas: int | None) -> PlacementView:
        """Keep `replicas` agents placed (placement.kind ray); None hands the count back to the
        settings. Returns once the count is stored; the agents join as they start."""
        return PlacementView.model_validate(await self._request("PUT", "/v1/rl/placement", {"replicas": replicas}))

    async def set_staleness(self, bound: int) -> dict[str, Any]:
        """The gateway's staleness bound: how many versions behind the desired one it may still serve."""
        return _object(await self._request("POST", "/v1/rl/gateway/staleness", {"bound": bound}), "staleness")

    async def pause(
        self, mode: PauseMode = "keep", timeout_s: float | None = None, *, selector: str | None = None
    ) -> OperationResult:
        """Pause the fleet; with `selector`, only the matching members, held paused until resumed."""
        body: dict[str, Any] = (
            {"mode": mode}
            | ({"timeout_s": timeout_s} if timeout_s else {})
            | ({"selector": selector} if selector is not None else {})
        )
        return OperationResult.model_validate(
            await self._request("POST", "/v1/rl/pause", body, timeout_s=(timeout_s or 60) + 30)
        )

    async def resume(self, *, selector: str | None = None) -> OperationResult:
        """Resume the fleet (releasing every hold); with `selector`, only the matching members."""
        body = {"selector": selector} if selector is not None else {}
        return OperationResult.model_validate(await self._request("POST", "/v1/rl/resume", body))

    async def sleep(
        self,
        level: int = 1,
        *,
        mode: str = "abort",
        timeout_s: float | None = None,
        selector: str | None = None,
        worker_ids: list[str] | None = None,
    ) -> OperationResult:
        """Put members to sleep (all, or a selector's, or these ids): out of the gateway's fence and
        kept asleep until `wake_up`. Raises OperationFailed on 207/502."""
        body: dict[str, Any] = (
            {"level": level, "mode": mode}
            | ({"timeout_s": timeout_s} if timeout_s else {})
            | ({"selector": selector} if selector is not None else {})
            | ({"worker_ids": worker_ids} if worker_ids is not None else {})
        )
        return OperationResult.model_validate(
            await self._request("POST", "/v1/rl/sleep", body, timeout_s=(timeout_s or 60) + 60)
        )

    async def wake_up(
        self, *, tags: list[str] | None = None, selector: str | None = None, worker_ids: list[str] | None = None
    ) -> OperationResult:
        """Wake members asleep, verify them, return those that pass to service."""
        body: dict[str, Any] = (
            ({"tags": tags} if tags else {})
            | ({"selector": selector} if selector is not None else {})
            | ({"worker_ids": worker_ids} if worker_ids is not None else {})
        )
        # A wake may reload weights (level 2, or a fleet updated meanwhile): a load's time.
        return OperationResult.model_validate(await self._request("POST", "/v1/rl/wake_up", body, timeout_s=900))

    async def engine(
        self, route: str, *, worker: str | None = None, selector: str | None = None, body: dict[str, Any] | None = None
    ) -> OperationResult:
        """One allowlisted engine route (`POST /v1/rl/engine/{route}`) on a worker, a selector's
        members or the fleet. Raises OperationFailed on 207/502, RequestRejected (403) off the list,
        and RequestRejected with the engines' own 4xx (code `engine_rejected`) when every member it
        reached refused the request."""
        request = {k: v for k, v in (("worker", worker), ("selector", selector), ("body", body)) if v is not None}
        return OperationResult.model_validate(
            await self._request("POST", f"/v1/rl/engine/{quote(route, safe='')}", request)
        )

    async def update_weights(
        self,
        version: str,
        path: str,
        *,
        pause_mode: PauseMode = "keep",
        verify: bool = True,
        timeout_s: float | None = None,
        max_unavailable: int | str | None = None,
        wait: bool = True,
        expected_checksums: dict[str, str] | None = None,
    ) -> OperationResult:
        """One training step's update: pause, load, verify, resume. Raises OperationFailed on 207/502.

        `max_unavailable` (a count or "25%") makes it a rolling update. `wait=False` returns the
        running operation at once; follow it with `wait_operation`."""
        body: dict[str, Any] = {
            "version": version,
            "source": {"kind": "disk", "path": path},
            "pause_mode": pause_mode,
            "verify": verify,
            "wait": wait,
        }
        if timeout_s:
            body["timeout_s"] = timeout_s
        if max_unavailable is not None:
            body["strategy"] = {"type": "rolling", "max_unavailable": max_unavailable}
        if expected_checksums is not None:
            body["expected_checksums"] = expected_checksums
        deadline = timeout_s * 4 + 30 if timeout_s and wait else (_LONG_S if wait else None)
        return OperationResult.model_validate(await self._request("POST", "/v1/rl/update_weights", body, deadline))

    async def operation(self, operation_id: str) -> OperationResult:
        from urllib.parse import quote

        return OperationResult.model_validate(
            await self._request("GET", f"/v1/rl/operations/{quote(operation_id, safe='')}")
        )

    async def wait_operation(
        self,
        operation_id: str,
        *,
        poll_s: float = 0.5,
        timeout_s: float | None = None,
        on_update: Callable[[OperationResult], None] | None = None,
    ) -> OperationResult:
        """Poll an operation until it ends; `on_update` sees each read. Raises OperationFailed
        when some worker failed, ConvergeTimeout past `timeout_s`."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while True:
            op = await self.operation(operation_id)
            if on_update is not None:
                on_update(op)
            if op.status != "running":
                if op.status in ("partial", "failed", "interrupted"):
                    raise OperationFailed(op)
                return op
            if deadline is not None and time.monotonic() > deadline:
                raise ConvergeTimeout(f"operation {operation_id} still running after {timeout_s:g}s")
            await asyncio.sleep(poll_s)

    async def load_lora(self, name: str, path: str, version: str | None = None) -> OperationResult:
        body = {"name": name, "path": path, "version": version}
        return OperationResult.model_validate(await self._request("POST", "/v1/rl/loras", body, _LONG_S))

    async def unload_lora(self, name: str) -> OperationResult:
        from urllib.parse import quote

        return OperationResult.model_validate(await self._request("DELETE", f"/v1/rl/loras/{quote(name, safe='')}"))

    # -- broadcast updates (vLLM's weight-transfer protocol, fleet-wide) ---------------------
    async def transfer_info(self) -> dict[str, Any]:
        """`inference_world_size`, `trainer_world_size` (what the trainer's init_info needs) and the group."""
        return _object(await self._request("GET", "/v1/rl/weight_transfer"), "GET /v1/rl/weight_transfer")

    async def transfer_init(self, init_info: dict[str, Any], *, timeout_s: float = _LONG_S) -> OperationResult:
        """Every worker joins the trainer's group; returns once all have (the trainer joins beside it)."""
        return await self._op("POST", "/v1/rl/weight_transfer/init", {"init_info": init_info}, timeout_s)

    async def transfer_start(self, *, timeout_s: float = _LONG_S) -> OperationResult:
        return await self._op("POST", "/v1/rl/weight_transfer/start", {}, timeout_s)

    async def transfer_update(
        self, update_info: dict[str, Any] | list[dict[str, Any]], *, timeout_s: float = _LONG_S
    ) -> OperationResult:
        return await self._op("POST", "/v1/rl/weight_transfer/update", {"update_info": update_info}, timeout_s)

    async def transfer_finish(
        self, weight_version: str | None = None, *, checkpoint_path: str | None = None, timeout_s: float = _LONG_S
    ) -> OperationResult:
        """Ends the update; `checkpoint_path` names a disk copy of these weights for workers that join later."""
        body = {k: v for k, v in (("weight_version", weight_version), ("checkpoint_path", checkpoint_path)) if v}
        return await self._op("POST", "/v1/rl/weight_transfer/finish", body, timeout_s)

    async def transfer_shutdown(self) -> OperationResult:
        return await self._op("POST", "/v1/rl/weight_transfer/shutdown", {}, None)

    async def _op(self, method: str, path: str, body: Any, timeout_s: float | None) -> OperationResult:
        return OperationResult.model_validate(await self._request(method, path, body, timeout_s))

    async def wait_converged(
        self, version: str | None = None, *, timeout_s: float = 300.0, poll_s: float = 0.5
    ) -> FleetState:
        """Poll until every member is at the desired state (and at `version`, if given)."""
        deadline = time.monotonic() + timeout_s
        while True:
            st = await self.state()
            if st.applied.converged and (version is None or st.applied.weight_version == version):
                return st
            if time.monotonic() > deadline:
                behind = [w.id for w in st.workers if not w.ready or (version and w.weight_version != version)]
                raise ConvergeTimeout(f"not converged after {timeout_s:g}s; behind: {', '.join(behind) or 'none'}")
            await asyncio.sleep(poll_s)


class _Blocking(Generic[P, T]):
    """A coroutine method of `ControlPlaneClient`, as a blocking method of `SyncControlPlaneClient`
    with the same parameters: the call runs on the sync client's own event loop."""

    def __init__(self, method: Callable[Concatenate[ControlPlaneClient, P], Coroutine[Any, Any, T]]) -> None:
        self._method = method

    @overload
    def __get__(self, obj: None, owner: type[SyncControlPlaneClient]) -> _Blocking[P, T]: ...

    @overload
    def __get__(self, obj: SyncControlPlaneClient, owner: type[SyncControlPlaneClient]) -> Callable[P, T]: ...

    def __get__(
        self, obj: SyncControlPlaneClient | None, owner: type[SyncControlPlaneClient]
    ) -> _Blocking[P, T] | Callable[P, T]:
        if obj is None:
            return self
        method, client = self._method, obj._client

        @functools.wraps(types.MethodType(method, client))  # the async call's name, docstring and parameters
        def call(*args: P.args, **kwargs: P.kwargs) -> T:
            return obj._run(method(client, *args, **kwargs))

        return call


class SyncControlPlaneClient:
    """The same calls, blocking: an event loop of its own on a daemon thread."""

    def __init__(self, base_url: str, *, token: str | None = None, timeout_s: float = 30.0) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="controlplane-client", daemon=True)
        self._thread.start()
        self._client = ControlPlaneClient(base_url, token=token, timeout_s=timeout_s)

    def _run(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    def close(self) -> None:
        self._run(self._client.close())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=5)

    def __enter__(self) -> SyncControlPlaneClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # Every public call of the async client (tests/client/test_client_sync.py holds the two lists equal).
    state = _Blocking(ControlPlaneClient.state)
    state_raw = _Blocking(ControlPlaneClient.state_raw)
    workers = _Blocking(ControlPlaneClient.workers)
    operations = _Blocking(ControlPlaneClient.operations)
    placement = _Blocking(ControlPlaneClient.placement)
    set_staleness = _Blocking(ControlPlaneClient.set_staleness)
    fleets = _Blocking(ControlPlaneClient.fleets)
    scale = _Blocking(ControlPlaneClient.scale)
    pause = _Blocking(ControlPlaneClient.pause)
    sleep = _Blocking(ControlPlaneClient.sleep)
    wake_up = _Blocking(ControlPlaneClient.wake_up)
    resume = _Blocking(ControlPlaneClient.resume)
    engine = _Blocking(ControlPlaneClient.engine)
    update_weights = _Blocking(ControlPlaneClient.update_weights)
    operation = _Blocking(ControlPlaneClient.operation)
    wait_operation = _Blocking(ControlPlaneClient.wait_operation)
    load_lora = _Blocking(ControlPlaneClient.load_lora)
    unload_lora = _Blocking(ControlPlaneClient.unload_lora)
    transfer_info = _Blocking(ControlPlaneClient.transfer_info)
    transfer_init = _Blocking(ControlPlaneClient.transfer_init)
    transfer_start = _Blocking(ControlPlaneClient.transfer_start)
    transfer_update = _Blocking(ControlPlaneClient.transfer_update)
    transfer_finish = _Blocking(ControlPlaneClient.transfer_finish)
    transfer_shutdown = _Blocking(ControlPlaneClient.transfer_shutdown)
    wait_converged = _Blocking(ControlPlaneClient.wait_converged)


class ControllerWeightSyncClient:
    """vLLM's `VLLMWeightSyncClient` (a structural protocol) backed by the controller.

        engine = WeightTransferTrainerFactory.trainer_init(
            init_info, client=ControllerWeightSyncClient(url, token=token), source=ModuleSource(model))
        engine.send_weights(weight_version="step-7")

    The trainer's `init_info.world_size` must be `trainer_world_size()`. Each call raises
    `OperationFailed` (with every worker's result) when any worker fails its part; the
    controller has then ended the update and said which worker failed in which phase.
    Calls may come from several threads at once (a trainer engine runs `update_weights`
    beside its broadcast). `last_result` holds the latest operation result.

    A call refused with 409 `membership_changed` raises `MembershipChanged` and leaves its
    `change` in `membership_change` too; so does an init refused for its world size when a
    member joined or left since `trainer_world_size` read it (the change names them, and its
    `group_epoch` is the epoch the size was read at). The trainer engine makes some calls in a
    thread beside its collective (init beside the rendezvous, the chunk beside the broadcast):
    refused there, the engine raises its own error once the collective gives up, and the
    refusal dies with the thread, so the caller reads it here (`rlcp.rl.sync.BroadcastSync`
    forms the group again from it). `begin_round` clears it.
    """

    def __init__(
        self, base_url: str, *, token: str | None = None, timeout_s: float = _LONG_S, checkpoint_path: str | None = None
    ) -> None:
        self._client = SyncControlPlaneClient(base_url, token=token, timeout_s=timeout_s)
        self.timeout_s = timeout_s
        self.checkpoint_path = checkpoint_path  # set per step when the trainer also saves to disk
        self.last_result: OperationResult | None = None
        self.membership_change: MembershipDelta | None = None
        self._sized: tuple[int, list[str]] | None = None  # the membership `trainer_world_size` read
        self._after_start: Callable[[], None] | None = None  # `begin_round`'s

    def begin_round(self, checkpoint_path: str | None, *, after_start: Callable[[], None] | None = None) -> None:
        """Before a round (start, chunks, finish): the disk copy its finish names, no change seen
        yet, and what to call once its start has succeeded (None: nothing)."""
        self.checkpoint_path, self.membership_change, self._after_start = checkpoint_path, None, after_start

    def _noting_change(self, call: Callable[[], OperationResult]) -> None:
        try:
            self.last_result = call()
        except MembershipChanged as exc:
            self.membership_change = exc.change
            raise

    def trainer_world_size(self) -> int:
        info = self._client.transfer_info()
        self._sized = (int(info["membership_epoch"]), list(info["members"]))
        return int(info["trainer_world_size"])

    def init_weight_transfer_engine(self, init_info: dict[str, Any]) -> None:
        try:
            self.last_result = self._client.transfer_init(init_info, timeout_s=self.timeout_s)
        except RequestRejected as exc:
            if exc.status != 422 or exc.field != "init_info.world_size" or (moved := self._moved_since_sized()) is None:
                raise
            # The world size was right when read: a member joined or left before the init arrived.
            self.membership_change = moved
            raise MembershipChanged(f"{moved.describe()} (since the world size was read)", moved) from exc

    def _moved_since_sized(self, info: dict[str, Any] | None = None) -> MembershipDelta | None:
        """Who joined or left since `trainer_world_size` was read; None if no one did (or it was not)."""
        if self._sized is None:
            return None
        epoch, members = self._sized
        info = info if info is not None else self._client.transfer_info()
        now, then = set(info["members"]), set(members)
        if int(info["membership_epoch"]) == epoch and now == then:  # the set moves with answering, too
            return None
        return MembershipDelta(
            joined=sorted(now - then),
            left=sorted(then - now),
            restarted=[],
            group_epoch=epoch,
            membership_epoch=int(info["membership_epoch"]),
        )

    def await_membership_change(self, within_s: float, *, poll_s: float = 0.25) -> MembershipDelta | None:
        """After a round that failed with no refusal in hand: who joined or left since the group
        was sized, once the controller has closed the failed update; None if nothing moved within
        `within_s`. A member SIGKILLed mid-broadcast fails the round before anyone can refuse it
        (its call fails, the collective breaks), and discovery unlists it a moment later (a
        listing's next poll, a pod's readiness probe): this waits for that moment, so the caller
        can form the group again instead of failing the push. The change found is kept in
        `membership_change` too. Errors reading the controller count as "nothing moved"."""
        deadline = time.monotonic() + within_s
        while True:
            try:
                info = self._client.transfer_info()
            except ControlPlaneClientError:
                info = None
            group = info.get("group") if info is not None else None
            closed = not (isinstance(group, dict) and group.get("updating"))
            if info is not None and closed and (moved := self._moved_since_sized(info)) is not None:
                self.membership_change = moved
                return moved
            if time.monotonic() + poll_s > deadline:
                return None
            time.sleep(poll_s)

    def start_weight_update(self) -> None:
        self._noting_change(lambda: self._client.transfer_start(timeout_s=self.timeout_s))
        if self._after_start is not None:
            self._after_start()

    def update_weights(self, update_info: dict[str, Any] | list[dict[str, Any]]) -> None:
        self._noting_change(lambda: self._client.transfer_update(update_info, timeout_s=self.timeout_s))

    def finish_weight_update(self, weight_version: str | None = None) -> None:
        self._noting_change(
            lambda: self._client.transfer_finish(
                weight_version, checkpoint_path=self.checkpoint_path, timeout_s=self.timeout_s
            )
        )

    def shutdown_weight_transfer_engine(self) -> None:
        self.last_result = self._client.transfer_shutdown()

    def state(self) -> FleetState:
        return self._client.state()

    def close(self) -> None:
        self._client.close()

    def __enter__(self) -> ControllerWeightSyncClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
