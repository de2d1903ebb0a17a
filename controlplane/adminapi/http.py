"""HTTP mechanics shared by every AdminAPI flavor.

One aiohttp session per process (passed in), a deadline on every call, and tenacity
retries with exponential backoff and jitter on connect errors, 5xx, 408 and 429 -- for
idempotent calls only: a collective call (joining a weight-transfer group, a broadcast
chunk) is never blindly retried, since the other side may already be in it. A connection
lost after the worker began to answer is not retried either: the worker has done the work
(a weight load of minutes), and doing it again would not make the answer arrive; the
reconciler reads the worker's state instead.

Errors leave as `WorkerCallError` subclasses naming the worker and the reason:

    WorkerCallError
    ├── WorkerUnreachable     connect refused / reset / DNS, before any answer
    ├── WorkerConnectionLost  the connection broke after the status line arrived
    ├── WorkerTimeout         the deadline passed
    └── WorkerRejected        the worker answered an error (status and its message)
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from dataclasses import dataclass
from typing import Any

import aiohttp
from tenacity import (AsyncRetrying, retry_if_exception, stop_after_attempt, stop_after_delay,
                      wait_exponential_jitter)

_RETRY_STATUSES = frozenset({408, 429, 500, 502, 503, 504})


class WorkerCallError(Exception):
    kind = "error"

    def __init__(self, worker_id: str, reason: str, *, status: int | None = None) -> None:
        super().__init__(f"{worker_id}: {reason}")
        self.worker_id = worker_id
        self.reason = reason
        self.status = status


class WorkerUnreachable(WorkerCallError):
    pass


class WorkerConnectionLost(WorkerCallError):
    """The worker received the request and began to answer (`status`), then the connection broke."""


class WorkerTimeout(WorkerCallError):
    kind = "timeout"


class WorkerRejected(WorkerCallError):
    pass


def _retryable(exc: BaseException) -> bool:
    if isinstance(exc, WorkerUnreachable):
        return True
    return isinstance(exc, WorkerRejected) and exc.status in _RETRY_STATUSES


@dataclass(frozen=True, kw_only=True)
class CallPolicy:
    """Deadlines and retries of admin calls; built from the controller's settings."""

    timeout_s: float = 10.0  # one attempt
    attempts: int = 3
    retry_budget_s: float = 30.0  # all attempts together
    backoff_initial_s: float = 0.1
    backoff_max_s: float = 2.0


class WorkerHTTP:
    """Calls to one worker: base URL, bearer token, deadline, retries."""

    def __init__(self, *, session: aiohttp.ClientSession, worker_id: str, base_url: str,
                 token: str | None, policy: CallPolicy) -> None:
        self.session = session
        self.worker_id = worker_id
        self.base_url = base_url.rstrip("/")
        self.policy = policy
        self._headers = {"Authorization": f"Bearer {token}"} if token else {}

    async def request(self, method: str, path: str, *, json_body: Any = None, params: dict | None = None,
                      timeout_s: float | None = None, retry: bool = True) -> Any:
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

    async def _once(self, method: str, path: str, json_body: Any, params: dict | None,
                    timeout_s: float | None) -> Any:
        deadline = timeout_s if timeout_s is not None else self.policy.timeout_s
        url = self.base_url + path
        answered: int | None = None  # the status, once the worker's status line arrived
        try:
            async with asyncio.timeout(deadline):
                async with self.session.request(method, url, json=json_body, params=params,
                                                headers=self._headers) as resp:
                    answered = resp.status
                    text = await resp.text()
        except TimeoutError as exc:
            raise WorkerTimeout(self.worker_id, f"{method} {path} did not answer within {deadline:g}s") from exc
        except aiohttp.ClientError as exc:
            if answered is not None:
                raise WorkerConnectionLost(
                    self.worker_id, f"{method} {path}: the connection broke after the worker answered {answered} "
                                    f"(the request reached it): {type(exc).__name__}: {exc}", status=answered) from exc
            raise WorkerUnreachable(self.worker_id, f"{method} {path}: {type(exc).__name__}: {exc}") from exc
        body = _parse(text)
        if resp.status >= 400:
            raise WorkerRejected(self.worker_id, f"{method} {path} answered {resp.status}: {_message(body, text)}",
                                 status=resp.status)
        return body


def _parse(text: str) -> Any:
    if not text:
        return None
    try:
        return json.loads(text)
    except ValueError:
        return text


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
