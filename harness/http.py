"""HTTP helpers for talking to agents and controllers on loopback."""

from __future__ import annotations

import json
import socket
from typing import Any

import aiohttp


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


async def call(session: aiohttp.ClientSession, method: str, url: str, *, body: Any = None,
               headers: dict | None = None, data: bytes | None = None, timeout_s: float = 120.0) -> tuple[int, Any]:
    """One HTTP call with a deadline; returns (status, parsed JSON body or text)."""
    async with session.request(method, url, json=body, data=data, headers=headers,
                               timeout=aiohttp.ClientTimeout(total=timeout_s)) as resp:
        text = await resp.text(errors="replace")
        try:
            return resp.status, json.loads(text)
        except ValueError:
            return resp.status, text


def free_port() -> int:
    """A port free on 127.0.0.1 right now (for a process that must come back on the same address)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# What a call to a process that is restarting (or frozen past the call's deadline) may raise.
CONNECTION_ERRORS = (aiohttp.ClientError, TimeoutError)
