"""What the sources that poll a member list over HTTP share (`http_listing`: a
`GET /v1/rl/workers` listing; `ray`: the dashboard's state API): one GET under one deadline,
every way it can fail turned into the source's own `PollFailed`, and the loop that yields
each good list and backs off from failures.

A failed poll yields nothing: the consumer keeps the last membership, because a flaky
endpoint must never empty the fleet.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

import aiohttp
import structlog

from rlcp.controlplane.workerspec import WorkerSpec

log = structlog.get_logger("rlcp.controlplane.discovery.polling")

T = TypeVar("T")


class PollFailed(ValueError):
    """The answer as a whole is unusable (unreachable, non-200, malformed): a failed poll.
    Each source raises its own subclass."""


def backoff_s(failures: int, *, interval_s: float, max_backoff_s: float) -> float:
    """Delay before the next poll after `failures` failures in a row: doubling from the
    poll interval, capped, with jitter so many controllers do not retry in lockstep.
    Never shorter than the interval: failing must not make us poll faster."""
    cap = max(max_backoff_s, interval_s)
    ceiling = min(cap, interval_s * 2 ** min(failures, 32))  # bounded exponent: no overflow
    return max(interval_s, random.uniform(ceiling / 2, ceiling))


def good_entries(
    entries: Iterable[Any], parse: Callable[[Any], tuple[WorkerSpec | None, str]], *, key: str, event: str
) -> list[WorkerSpec]:
    """The specs `parse` makes of `entries` (each: a spec, or None and why not). A bad entry, or a
    second one with an id already taken (`key` names what the id is made of), is logged as `event`
    and skipped, so one bad entry cannot take the rest of the fleet down."""
    specs: dict[str, WorkerSpec] = {}
    for index, entry in enumerate(entries):
        spec, reason = parse(entry)
        if spec is not None and spec.id in specs:
            reason, spec = f"duplicate {key} {spec.id!r}", None
        if spec is None:
            log.warning(event, index=index, entry=entry, reason=reason)
            continue
        specs[spec.id] = spec
    return list(specs.values())


async def get_json(
    session: aiohttp.ClientSession,
    url: str,
    *,
    timeout_s: float,
    error: type[PollFailed],
    headers: Mapping[str, str] | None = None,
    params: Any = None,
) -> Any:
    """One GET under one deadline, its body as JSON; every way it can fail becomes `error`."""
    try:
        async with asyncio.timeout(timeout_s):
            async with session.get(url, params=params, headers=headers) as resp:
                if resp.status != 200:
                    raise error(f"HTTP {resp.status} {resp.reason or ''}".rstrip())
                return await resp.json(content_type=None)  # be lenient about the header
    except PollFailed:
        raise
    except TimeoutError as exc:
        raise error(f"no answer within {timeout_s}s") from exc
    except aiohttp.ClientError as exc:
        raise error(f"{type(exc).__name__}: {exc}") from exc
    except ValueError as exc:  # the body is not JSON
        raise error(f"answer is not JSON: {exc}") from exc


async def poll_repeatedly(
    poll: Callable[[], Awaitable[T]],
    *,
    source: str,
    url: str,
    interval_s: float,
    max_backoff_s: float,
    iterations: int | None = None,
) -> AsyncIterator[T]:
    """Each good answer of `poll`, every `interval_s`; a `PollFailed` is logged
    (`<source>_poll_failed`) and waited out with a growing backoff. `iterations`: a test seam,
    stop after this many polls."""
    polls = failures = 0
    while iterations is None or polls < iterations:
        polls += 1
        try:
            value = await poll()
        except PollFailed as exc:
            failures += 1
            delay = backoff_s(failures, interval_s=interval_s, max_backoff_s=max_backoff_s)
            log.warning(
                f"{source}_poll_failed", url=url, reason=str(exc), failures=failures, retry_in_s=round(delay, 3)
            )
        else:
            if failures:
                log.info(f"{source}_poll_recovered", url=url, after_failures=failures)
            failures, delay = 0, interval_s
            yield value
        if iterations is None or polls < iterations:
            await asyncio.sleep(delay)


@dataclass(frozen=True)
class HttpPoll:
    """One source's GET and its loop: the endpoint (`url`, `params`, a bearer `token`), the
    deadline of one poll, the poll interval and backoff, what a failure is raised as (`error`)
    and logged as (`<source>_poll_failed`). `iterations`: a test seam, stop after this many polls."""

    session: aiohttp.ClientSession
    url: str
    source: str
    error: type[PollFailed]
    interval_s: float = 5.0
    timeout_s: float = 5.0
    max_backoff_s: float = 30.0
    token: str | None = None
    params: Any = None
    iterations: int | None = None

    def __post_init__(self) -> None:
        if self.interval_s <= 0 or self.timeout_s <= 0:
            raise ValueError("interval_s and timeout_s must be positive")

    @property
    def headers(self) -> Mapping[str, str]:
        return {"Authorization": f"Bearer {self.token}"} if self.token else {}

    async def get(self) -> Any:
        """One GET under one deadline, its body as JSON; every way it can fail becomes `error`."""
        return await get_json(
            self.session, self.url, timeout_s=self.timeout_s, headers=self.headers, params=self.params, error=self.error
        )

    def repeat(self, poll: Callable[[], Awaitable[T]]) -> AsyncIterator[T]:
        """Each good answer of `poll` (a `get` and its parse), every poll interval."""
        return poll_repeatedly(
            poll,
            source=self.source,
            url=self.url,
            interval_s=self.interval_s,
            max_backoff_s=self.max_backoff_s,
            iterations=self.iterations,
        )
