"""One call followed across processes: its request id and its W3C trace context.

A call to any of our processes gets an `X-Request-ID` (the caller's own when it sent a usable
one, else one made here) and a trace (the caller's `traceparent` when it sent a valid one,
else a new trace). Both are bound to every log line of the call (`request_id`, `trace_id`;
`rlcp.core.http`'s middleware) and the request id is echoed on the answer. Every call to another
process that the call causes -- the front's to the core, the core's to each worker -- carries
them on (`outgoing_headers`), with a new parent span id per outgoing call as W3C Trace Context
asks, so one trainer update can be followed from the trainer's call through the controller
into each agent's log by one id.

The ids live in context variables: the fan-out's tasks inherit the handler's context, so a
worker call made on behalf of a request needs nothing passed to it; a call made by a
background loop (the status poller, the reconciler) has none and carries none.
"""

from __future__ import annotations

import random
import re
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar, Token
from typing import NamedTuple

REQUEST_ID_HEADER = "X-Request-ID"
TRACEPARENT_HEADER = "traceparent"
# A caller's request id is kept only if it is short and safe anywhere we put it (a header, a
# log line): otherwise a fresh one replaces it rather than echoing what we cannot vouch for.
_REQUEST_ID = re.compile(r"[A-Za-z0-9._:/+=@-]{1,128}")
# W3C Trace Context, version 00: trace id and parent id, lowercase hex, not all zeros.
_TRACEPARENT = re.compile(r"00-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})")
# Ids name a call, they guard nothing: a non-cryptographic generator is enough (W3C asks trace ids
# to be random, not secret) and costs a fraction of `secrets` (which was ~3% of the gateway's CPU
# per proxied request). Its own instance, seeded from the OS, so nothing seeding `random` repeats them.
_ids = random.Random()


def _hex(bits: int) -> str:
    # Never all zeros (W3C: invalid). `to_bytes().hex()`: the same digits as a `0{bits // 4}x`
    # format, at a third of its cost (the nested format spec was ~2% of the gateway's CPU).
    return (_ids.getrandbits(bits) or 1).to_bytes(bits // 8).hex()


class CallContext(NamedTuple):  # immutable, and built per call: a tuple is half a frozen dataclass's cost
    request_id: str
    trace_id: str
    flags: str = "01"  # sampled: ours is a log trail, no collector decides to drop it


_current: ContextVar[CallContext | None] = ContextVar("rlcore_call_context", default=None)


def from_headers(headers: Mapping[str, str]) -> CallContext:
    """The context of an incoming call: the caller's ids where usable, fresh ones elsewhere."""
    given = headers.get(REQUEST_ID_HEADER)
    request_id = given if given is not None and _REQUEST_ID.fullmatch(given) else _hex(48)
    given = headers.get(TRACEPARENT_HEADER)
    match = _TRACEPARENT.fullmatch(given.strip()) if given else None
    if match and match.group(1) != "0" * 32 and match.group(2) != "0" * 16:
        return CallContext(request_id, match.group(1), match.group(3))
    return CallContext(request_id, _hex(128))


@contextmanager
def bound(ctx: CallContext) -> Iterator[CallContext]:
    token = _current.set(ctx)
    try:
        yield ctx
    finally:
        _current.reset(token)


def bind(ctx: CallContext) -> Token[CallContext | None]:
    """`bound` without a context manager, for a hot path: undo with `unbind(token)`."""
    return _current.set(ctx)


def unbind(token: Token[CallContext | None]) -> None:
    _current.reset(token)


def current() -> CallContext | None:
    return _current.get()


def outgoing_headers() -> dict[str, str]:
    """Headers for a call this one causes: the same request id and trace, a new span."""
    ctx = _current.get()
    if ctx is None:
        return {}
    return {REQUEST_ID_HEADER: ctx.request_id, TRACEPARENT_HEADER: f"00-{ctx.trace_id}-{_hex(64)}-{ctx.flags}"}
