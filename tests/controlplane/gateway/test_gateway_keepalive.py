"""The gateway's connections to its workers."""

from __future__ import annotations

import aiohttp
import uvicorn

from rlcp.controlplane.gateway.app import new_session
from rlcp.controlplane.gateway.metrics import GatewayMetrics
from rlcp.controlplane.gateway.send import Sender
from rlcp.controlplane.settings.gateway import GatewaySettings


async def test_the_gateway_lets_go_of_an_idle_connection_before_a_worker_closes_it() -> None:
    """A pooled connection kept past the worker's keep-alive may be reused just as the worker
    closes it: that try fails ("Can not write request body"), and counts against the request's
    attempts and the worker's breaker. The default is under vLLM's and uvicorn's (SGLang's), and
    the gateway's upstream pool (inference) and its session (its own calls) keep what the setting
    says (the pool's idle drop itself: upstream/test_upstream_client.py)."""
    import vllm.envs  # here, not at the top: importing vLLM costs every collecting process ~7 s

    default = GatewaySettings().upstream_idle_timeout_s
    assert default < vllm.envs.VLLM_HTTP_TIMEOUT_KEEP_ALIVE
    assert default < uvicorn.Config(app=None).timeout_keep_alive
    for idle_s, session in ((default, new_session()), (2.5, new_session(2.5))):
        async with session:
            assert isinstance(session.connector, aiohttp.TCPConnector)
            assert session.connector._keepalive_timeout == idle_s
        sender = Sender(
            settings=GatewaySettings(upstream_idle_timeout_s=idle_s),
            metrics=GatewayMetrics(),
            own_tokens=(),
            in_flight={},
            routed={},
            failed={},
        )
        assert sender.upstream.idle_s == idle_s
