"""A request log written by a stock `vllm serve` itself, to count round trips from the workers' side.

vLLM's server takes extra ASGI middleware by import path (`--middleware`, its own documented
hook); `log_requests` is one that changes nothing and prints one line per request, with when the
server began handling it and when its answer was ready. uvicorn's own access log has neither
time, so it can count requests but not say which ones overlapped.

Each line carries the request's `X-Request-ID`, which the controller passes on to every worker
call an operation makes: a test that sends its operation with an id of its own picks out exactly
that operation's requests, whatever else (a status poll) reached the server meanwhile.

`read` takes the lines back out of the server's log; `rounds` counts the sequential rounds a run
of requests took: requests whose handling overlapped on the server were in flight together (one
round), and a request that began only after all earlier ones ended had to wait for them. A quick
request sent together with others may end before its sibling even begins, so a request whose id
starts with `HOLD_PREFIX` is held `HOLD_S` before its answer goes back: siblings sent together
overlap then, while a request that waited for another's answer still cannot. (Held 50 ms, one
of six reads sent together was seen to begin after another ended, at a load average of 20.)
Other requests (rollouts, the status poll) are not held.

Imported inside the vLLM server process: keep it free of anything heavy.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

PREFIX = "rlcp-access "
MIDDLEWARE = "rlcp.harness.access_log.log_requests"  # the value of `--middleware`
HOLD_PREFIX = "rt-"  # request ids whose requests are held (counted operations)
HOLD_S = 0.3  # longer than a loaded machine takes to begin handling a request sent with others


async def log_requests(request: Any, call_next: Callable[[Any], Awaitable[Any]]) -> Any:
    """vLLM `--middleware` (an `@app.middleware("http")` function): one line per request."""
    start = time.time()
    response = await call_next(request)
    request_id = request.headers.get("x-request-id")
    if request_id and request_id.startswith(HOLD_PREFIX):
        await asyncio.sleep(HOLD_S)
    query = request.url.query
    print(
        PREFIX
        + json.dumps(
            {
                "method": request.method,
                "path": request.url.path + (f"?{query}" if query else ""),
                "status": response.status_code,
                "request_id": request_id,
                "start": start,
                "end": time.time(),
            }
        ),
        flush=True,
    )
    return response


@dataclass(frozen=True)
class Entry:
    method: str
    path: str
    status: int
    request_id: str | None
    start: float
    end: float

    @property
    def route(self) -> str:
        return f"{self.method} {self.path.split('?')[0]}"


def read(log_path: Path, *, request_id: str | None = None) -> list[Entry]:
    """The requests the server logged (those carrying `request_id`, if given), in the order
    their answers were ready."""
    lines = [line for line in log_path.read_text(errors="replace").splitlines() if line.startswith(PREFIX)]
    entries = [Entry(**json.loads(line[len(PREFIX) :])) for line in lines]
    return [e for e in entries if request_id is None or e.request_id == request_id]


def rounds(entries: list[Entry]) -> int:
    """Sequential rounds: groups of requests whose handling overlapped."""
    count, busy_until = 0, float("-inf")
    for e in sorted(entries, key=lambda e: e.start):
        if e.start > busy_until:
            count += 1
        busy_until = max(busy_until, e.end)
    return count
