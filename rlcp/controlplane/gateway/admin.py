"""A standalone gateway's admin routes: every request it has no route for, forwarded to the
controller it follows (`gateway.follow_url`), so a replica's URL is the whole fleet's (docs/gateway.md,
"One URL").

The request goes on as it came (method, path, query, body, the client's own `Authorization`:
the controller authorizes it, never this gateway's `follow_token`), and the controller's
answer comes back as it answered, its 404 for a path it does not serve included. Each forward
has two deadlines: connecting (`gateway.controller_connect_timeout_s`) and the whole call
(`gateway.controller_timeout_s`). A controller that cannot be reached is a 503
`controller_unavailable` naming it (with `Retry-After`), one that does not answer in time a 504
`controller_timeout`: never a 500.

A gateway in the controller's process does not come here: it hands such requests to the
controller's application directly (`rlcp.core.handover`).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import aiohttp
from aiohttp import web
from multidict import CIMultiDict

from rlcp.core import tracing
from rlcp.core.errors import ApiError
from rlcp.core.handover import Fallback
from rlcp.core.http import HOP_BY_HOP

_HOP_OUT = HOP_BY_HOP | {"date", "server"}  # the answer's Date and Server are this process's


class ControllerUnavailableError(ApiError):
    status = 503
    code = "controller_unavailable"

    @property
    def headers(self) -> dict[str, str] | None:
        return {"Retry-After": "1"}


class ControllerTimeoutError(ApiError):
    status = 504
    code = "controller_timeout"


@dataclass(frozen=True)
class ControllerLink:
    """The controller a standalone gateway forwards admin requests to, and the deadlines."""

    url: str
    session: aiohttp.ClientSession
    timeout_s: float
    connect_timeout_s: float


def forward_to_controller(link: ControllerLink) -> Fallback:
    base = link.url.rstrip("/")
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=link.connect_timeout_s)

    async def forward(request: web.Request) -> web.StreamResponse | None:
        missed = request.match_info.http_exception
        if missed is None or missed.status != 404:
            return None  # a 405: the gateway serves the path, with another method
        data = await request.read()
        headers = CIMultiDict((k, v) for k, v in request.headers.items() if k.lower() not in HOP_BY_HOP)
        headers.update(tracing.outgoing_headers())
        what = f"{request.method} {request.path}"
        try:
            async with asyncio.timeout(link.timeout_s):
                async with link.session.request(
                    request.method,
                    base + request.path_qs,
                    data=data or None,
                    headers=headers,
                    allow_redirects=False,
                    timeout=timeout,
                ) as resp:
                    payload = await resp.read()
        except aiohttp.ClientError as exc:
            # First: a connect timeout is a ClientError and a TimeoutError both, and it means
            # unreachable, as a refusal does.
            raise ControllerUnavailableError(
                f"the controller at {base} (gateway.follow_url), which answers {what} for this gateway, "
                f"cannot be reached: {type(exc).__name__}: {exc}"
            ) from exc
        except TimeoutError as exc:
            raise ControllerTimeoutError(
                f"the controller at {base} did not answer {what} within {link.timeout_s:g}s"
            ) from exc
        # The gateway's session hands bodies on as they came (`new_session`); one that decoded
        # them must not pass on the encoding it undid.
        dropped = _HOP_OUT | ({"content-encoding"} if link.session.auto_decompress else set())
        answer = CIMultiDict((k, v) for k, v in resp.headers.items() if k.lower() not in dropped)
        return web.Response(status=resp.status, body=payload, headers=answer)

    return forward
