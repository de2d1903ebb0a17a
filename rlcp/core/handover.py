"""One URL for two applications: a request one application has no route for, answered by the other.

The controller's API and the inference gateway are two aiohttp applications on two ports (in
one process by default). A client written for one vLLM server knows one base URL, so each
port answers the other's routes too (docs/controller.md, "One URL"). The middleware here sits
in each application, after the error middleware and before the token check, and looks only at
requests its own application does not route (a 404, or a 405 for the method):

- with a peer in this process (`PEER`, a `Peer`), a request the peer does route (or, for a
  path this application does not know, one the peer serves with another method: its 405
  names the methods) runs through the peer application whole -- the peer's middlewares (its
  token check, its error shape, the controller's leadership guard) and its handler -- as if it
  had come to the peer's own port; nothing crosses a socket;
- with no peer, a `fallback` decides (the standalone gateway forwards to its controller over
  HTTP; the controller without a gateway says where inference is served);
- otherwise the application's own 404/405 stands.

aiohttp has no public call for "run this request through that application": `hand_over` is the
one place that calls `Application._handle` (what aiohttp's own server calls for each request)
on `Request.clone()` (the same connection, headers and body stream, routed by the peer).
tests/controlplane/api/test_one_url.py holds the installed aiohttp to it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from aiohttp import web
from aiohttp.typedefs import Handler, Middleware
from multidict import CIMultiDict

from rlcp.core import tracing

HANDED_OVER = frozenset({404, 405})


@dataclass(frozen=True)
class Peer:
    """The other application of this process, and the largest body it takes (its own limit,
    not the one of the port the request came to)."""

    app: web.Application
    client_max_size: int
    # The peer's work runs to its end when the client goes away: the gateway's site cancels a
    # handler whose client left, the controller's does not, and an update handed over from the
    # gateway's port must not be stopped half-way by a trainer's client timeout.
    outlives_client: bool = False


PEER = web.AppKey("handover_peer", Peer)
_OUTLIVING: set[asyncio.Future[web.StreamResponse]] = set()
# Given a request its application does not route: an answer, or None to leave the 404/405.
Fallback = Callable[[web.Request], Awaitable[web.StreamResponse | None]]


async def hand_over(request: web.Request, peer: Peer) -> web.StreamResponse:
    """`request` answered by `peer.app`, middlewares and all. The clone carries this call's
    request id and trace, so the peer's log lines and answer name the ones this port gave it."""
    headers = CIMultiDict(request.headers)
    headers.update(tracing.outgoing_headers())
    clone = request.clone(headers=headers, client_max_size=peer.client_max_size)
    if not peer.outlives_client:
        return await peer.app._handle(clone)
    task = asyncio.ensure_future(peer.app._handle(clone))
    _OUTLIVING.add(task)  # the loop holds tasks weakly: this one may have no awaiter left
    task.add_done_callback(_OUTLIVING.discard)
    return await asyncio.shield(task)


def make_handover_middleware(*, fallback: Fallback | None = None) -> Middleware:
    @web.middleware
    async def handover_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        missed = request.match_info.http_exception
        if missed is None or missed.status not in HANDED_OVER:
            return await handler(request)
        peer = request.config_dict.get(PEER)
        if peer is not None:
            theirs = (await peer.app.router.resolve(request)).http_exception
            # The peer's 405 (with its `Allow`) says more than a 404 here: the path is the peer's.
            if theirs is None or (missed.status == 404 and theirs.status == 405):
                return await hand_over(request, peer)
        elif fallback is not None:
            answer = await fallback(request)
            if answer is not None:
                return answer
        return await handler(request)

    return handover_middleware
