"""How a driver reaches its worker: the transport seam, and its HTTP implementation.

`WorkerTransport` owns what every call needs whatever carries it: a deadline on every call,
error translation, and tenacity
retries with exponential backoff and jitter on connect errors, 5xx, 408 and 429 -- for
idempotent calls only: a collective call (joining a weight-transfer group, a broadcast
chunk) is never blindly retried, since the other side may already be in it. A connection
lost after the worker began to answer is not retried either: the worker has done the work
(a weight load of minutes), and doing it again would not make the answer arrive; the
reconciler reads the worker's state instead. Nor is a refused connection: nothing listens
at the worker's address (a dead process, a pod gone), it will not within a backoff's
second or two, and meanwhile the operation holds every healthy member paused; the worker
fails its call at once, and the reconciler converges it when it is back.

Errors leave as `WorkerCallError` subclasses naming the worker and the reason:

    WorkerCallError
    ├── WorkerUnreachable     connect reset / DNS / a connect error, before any answer
    │   └── WorkerRefused     the connection was refused: nothing listens (never retried)
    ├── WorkerConnectionLost  the connection broke after the status line arrived
    ├── WorkerTimeout         the deadline passed
    └── WorkerRejected        the worker answered an error (status and its message)

Subclasses only carry bytes (`exchange`): `HttpTransport` over the process's one aiohttp
session, and `MemoryTransport`, which hands each call to an in-process handler, so operation
and reconcile logic can be tested without sockets (httpx's `MockTransport` is the model).
"""

from __future__ import annotations

import asyncio
import errno
import json
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import aiohttp
from tenacity import AsyncRetrying, retry_if_exception, stop_after_attempt, stop_after_delay, wait_exponential_jitter

from rlcp.core import deadline
from rlcp.core.tracing import outgoing_headers

_RETRY_STATUSES = frozenset({408, 429, 500, 502, 503, 504})


class WorkerCallError(Exception):
    """`code` is stable and machine-readable (`WorkerResult.code`): the class's own, or for
    a rejection the worker's error code when it sent one (`path_unavailable`, ...)."""

    kind = "error"
    code = "worker_error"

    def __init__(self, worker_id: str, reason: str, *, status: int | None = None, code: str | None = None) -> None:
        super().__init__(f"{worker_id}: {reason}")
        self.worker_id = worker_id
        self.reason = reason
        self.status = status
        if code is not None:
            self.code = code


class WorkerUnreachable(WorkerCallError):
    code = "unreachable"


class WorkerRefused(WorkerUnreachable):
    """Nothing listens at the worker's address: the connection was refused (code `unreachable`)."""


class WorkerConnectionLost(WorkerCallError):
    """The worker received the request and began to answer (`status`), then the connection broke."""

    code = "connection_lost"


class WorkerTimeout(WorkerCallError):
    kind = "timeout"
    code = "timeout"


class WorkerRejected(WorkerCallError):
    code = "rejected"


def _retryable(exc: BaseException) -> bool:
    if isinstance(exc, WorkerUnreachable):
        return not isinstance(exc, WorkerRefused)
    return isinstance(exc, WorkerRejected) and exc.status in _RETRY_STATUSES


@dataclass(frozen=True, kw_only=True)
class CallPolicy:
    """Deadlines and retries of admin calls; built from the controller's settings."""

    timeout_s: float = 10.0  # one attempt
    attempts: int = 3
    retry_budget_s: float = 30.0  # all attempts together
    backoff_initial_s: float = 0.1
    backoff_max_s: float = 2.0


Exchange = tuple[int, Any, str]  # status, parsed body (None when empty), raw text


class WorkerTransport:
    """Calls to one worker: deadline, retries, errors; `exchange` carries one attempt."""

    def __init__(self, *, worker_id: str, policy: CallPolicy) -> None:
        self.worker_id = worker_id
        self.policy = policy

    async def exchange(self, method: str, path: str, json_body: Any, params: dict[str, Any] | None) -> Exchange:
        """Send one request, return the answer; raise `WorkerUnreachable` (nothing arrived)
        or `WorkerConnectionLost` (the answer broke off). The deadline is the caller's."""
        raise NotImplementedError

    async def request(
        self,
        method: str,
        path: str,
        *,
        json_body: Any = None,
        params: dict[str, Any] | None = None,
        timeout_s: float | None = None,
        retry: bool = True,
    ) -> Any:
        """One logical call; returns the parsed JSON body (or None when empty).

        `retry=False` for collective calls (the peer may already be in the group) and for
        status reads (the next poll is the retry, and a dead worker should cost one deadline).
        """
        if not retry or self.policy.attempts <= 1:
            return await self._once(method, path, json_body, params, timeout_s)
        # The first attempt runs bare: building a tenacity loop per call cost the fan-out
        # ~10% of its CPU at 1024 workers (bench/fanout.py), and nearly every call succeeds.
        started = time.monotonic()
        try:
            return await self._once(method, path, json_body, params, timeout_s)
        except WorkerCallError as exc:
            budget_s = self.policy.retry_budget_s - (time.monotonic() - started)
            if not _retryable(exc) or budget_s <= 0:
                raise
        p = self.policy
        # The schedule goes on from the first attempt: waits of initial, 2x initial, ... (with jitter).
        await asyncio.sleep(min(p.backoff_max_s, p.backoff_initial_s + random.uniform(0, 1)))
        retrying = AsyncRetrying(
            retry=retry_if_exception(_retryable),
            stop=stop_after_attempt(p.attempts - 1) | stop_after_delay(max(0.0, budget_s)),
            wait=wait_exponential_jitter(initial=p.backoff_initial_s * 2, max=p.backoff_max_s),
            reraise=True,
        )
        async for attempt in retrying:
            with attempt:
                return await self._once(method, path, json_body, params, timeout_s)
        raise AssertionError("unreachable")  # AsyncRetrying re-raises the last error

    async def _once(
        self, method: str, path: str, json_body: Any, params: dict[str, Any] | None, timeout_s: float | None
    ) -> Any:
        limit_s = timeout_s if timeout_s is not None else self.policy.timeout_s
        try:
            # Time this process's loop was held is not counted against the worker (`rlcp.core.deadline`).
            async with deadline.timeout(limit_s):
                status, body, text = await self.exchange(method, path, json_body, params)
        except TimeoutError as exc:
            raise WorkerTimeout(self.worker_id, f"{method} {path} did not answer within {limit_s:g}s") from exc
        if status >= 400:
            raise WorkerRejected(
                self.worker_id,
                f"{method} {path} answered {status}: {_message(body, text)}",
                status=status,
                code=_error_code(body),
            )
        return body


class HttpTransport(WorkerTransport):
    """Over the process's one aiohttp session, with the worker's bearer token."""

    def __init__(
        self, *, session: aiohttp.ClientSession, worker_id: str, base_url: str, token: str | None, policy: CallPolicy
    ) -> None:
        super().__init__(worker_id=worker_id, policy=policy)
        self.session = session
        self.base_url = base_url.rstrip("/")
        self._headers = {"Authorization": f"Bearer {token}"} if token else {}

    async def exchange(self, method: str, path: str, json_body: Any, params: dict[str, Any] | None) -> Exchange:
        answered: int | None = None  # the status, once the worker's status line arrived
        try:
            # The request id and trace of the call this one serves, if any (`rlcp.core.tracing`).
            headers = self._headers | outgoing_headers()
            async with self.session.request(
                method, self.base_url + path, json=json_body, params=params, headers=headers
            ) as resp:
                answered = resp.status
                text = await resp.text()
        except aiohttp.ClientError as exc:
            if answered is not None:
                raise WorkerConnectionLost(
                    self.worker_id,
                    f"{method} {path}: the connection broke after the worker answered {answered} "
                    f"(the request reached it): {type(exc).__name__}: {exc}",
                    status=answered,
                ) from exc
            unreachable = WorkerRefused if _refused(exc) else WorkerUnreachable
            raise unreachable(self.worker_id, f"{method} {path}: {type(exc).__name__}: {exc}") from exc
        return answered, _parse(text), text


def _refused(exc: aiohttp.ClientError) -> bool:
    """The connection was refused (at every address the name resolved to, alike)."""
    return isinstance(exc, aiohttp.ClientConnectorError) and exc.os_error.errno == errno.ECONNREFUSED


MemoryHandler = Callable[[str, str, dict[str, Any], Any], Awaitable[tuple[int, Any]]]


class MemoryTransport(WorkerTransport):
    """Hands each call to `handler(method, path, params, json_body) -> (status, body)` in this
    process. A handler raising `ConnectionError` is an unreachable worker (`ConnectionRefusedError`:
    a refused one, not retried); one that never returns runs into the call's deadline, as a
    hung worker does."""

    def __init__(self, *, worker_id: str, handler: MemoryHandler, policy: CallPolicy) -> None:
        super().__init__(worker_id=worker_id, policy=policy)
        self.handler = handler

    async def exchange(self, method: str, path: str, json_body: Any, params: dict[str, Any] | None) -> Exchange:
        try:
            status, body = await self.handler(method, path, {k: str(v) for k, v in (params or {}).items()}, json_body)
        except ConnectionError as exc:
            unreachable = WorkerRefused if isinstance(exc, ConnectionRefusedError) else WorkerUnreachable
            raise unreachable(self.worker_id, f"{method} {path}: {type(exc).__name__}: {exc}") from exc
        text = "" if body is None else body if isinstance(body, str) else json.dumps(body)
        return status, body, text


def _parse(text: str) -> Any:
    if not text:
        return None
    try:
        return json.loads(text)
    except ValueError:
        return text


def _error_code(body: Any) -> str | None:
    """The worker's own error code (`{"error": {"code"}}`, ours and vLLM's shape), if it is a
    short token: it becomes part of our answer, so nothing long or odd is passed on."""
    err = body.get("error") if isinstance(body, dict) else None
    code = err.get("code") if isinstance(err, dict) else None
    if isinstance(code, str) and 0 < len(code) <= 64 and code.replace("_", "").isalnum() and code.isascii():
        return code
    return None


def _message(body: Any, text: str) -> str:
    """The worker's own error message, from any of the shapes workers use."""
    if isinstance(body, dict):
        err = body.get("error")
        if isinstance(err, dict) and "message" in err:
            return str(err["message"])
        for key in ("error", "message", "detail"):
            if key in body:
                return str(body[key])
    return text[:300]
