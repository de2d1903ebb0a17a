"""What the fleet serves: `GET /v1/models` on the gateway and on the controller's
vLLM-compatible facade, one answer for both.

It is the union of every reachable member's own `GET /v1/models`, merged by id, so each card
is vLLM's (`max_model_len` included, which renderers' `generate()` reads to refuse an
overlong prompt before sending it). A member with no inference URL to ask (a Dynamo worker)
counts with what discovery named it (its model) and the adapters it reports. Trainers check
their model name here before the first rollout (prime-rl's `wait_for_ready` against its admin
URL), far more often than the answer changes, so it is kept while the fleet's state document
is the same one (a load or unload of an adapter makes a new one) and for at most `TTL_S`.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable, Mapping
from typing import Any

import aiohttp

from rlcp.core.wire.controller.state import FleetState

Card = dict[str, Any]
TTL_S = 2.0  # a client checks its model name far more often than the fleet's models change
READ_TIMEOUT_S = 5.0  # one member's /v1/models; an unreachable one serves nothing, the rest still answer


class ServedModels:
    def __init__(self, *, ttl_s: float = TTL_S) -> None:
        self._ttl_s = ttl_s
        self._cards: list[Card] | None = None
        self._at = 0.0
        self._seen: FleetState | None = None  # the document the cards were read under

    async def cards(
        self, state: FleetState | None, session: aiohttp.ClientSession, *, named: Mapping[str, str] | None = None
    ) -> list[Card]:
        """`named`: worker id -> the model discovery named it, for members with no inference URL."""
        if self._cards is not None and state is self._seen and time.monotonic() - self._at < self._ttl_s:
            return self._cards
        workers = [w for w in (state.workers if state else []) if w.reachable]
        urls = sorted({w.inference_url.rstrip("/") for w in workers if w.inference_url})
        answers = await asyncio.gather(*(read_cards(session, u) for u in urls))
        unasked = [(named[w.id], w.loras) for w in workers if not w.inference_url and named and w.id in named]
        self._cards, self._at, self._seen = merge_cards(answers, unasked), time.monotonic(), state
        return self._cards


def merge_cards(answers: Iterable[list[Card]], unasked: Iterable[tuple[str, Iterable[str]]] = ()) -> list[Card]:
    """Every card once, by id (the first member's wins), sorted; then the models and adapters
    of members that could not be asked, where no member listed them."""
    merged: dict[str, Card] = {}
    for cards in answers:
        for card in cards:
            merged.setdefault(card["id"], card)
    for model, adapters in unasked:
        merged.setdefault(model, {"id": model, "object": "model", "owned_by": "rl-controlplane", "parent": None})
        for name in adapters:
            merged.setdefault(name, {"id": name, "object": "model", "owned_by": "rl-controlplane", "parent": model})
    return [merged[k] for k in sorted(merged)]


async def read_cards(session: aiohttp.ClientSession, url: str) -> list[Card]:
    """One member's model cards; none when it cannot be read."""
    try:
        async with session.get(url + "/v1/models", timeout=aiohttp.ClientTimeout(total=READ_TIMEOUT_S)) as resp:
            body = await resp.json() if resp.status == 200 else {}
    except (aiohttp.ClientError, TimeoutError, ValueError):
        return []
    data = body.get("data") if isinstance(body, dict) else None
    return [c for c in data or [] if isinstance(c, dict) and isinstance(c.get("id"), str)]
