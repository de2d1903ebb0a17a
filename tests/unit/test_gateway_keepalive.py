"""The gateway's connections to its workers."""

from __future__ import annotations


async def test_the_gateway_lets_go_of_an_idle_connection_before_a_worker_closes_it() -> None:
    """A pooled connection kept past the worker's keep-alive may be reused just as the worker
    closes it: that try fails ("Can not write request body"), and counts against the request's
    attempts and the worker's breaker. The gateway's is under vLLM's and uvicorn's (SGLang's)."""
    import uvicorn
    import vllm.envs

    from rlcp.controlplane.gateway.app import UPSTREAM_KEEPALIVE_S, new_session

    assert UPSTREAM_KEEPALIVE_S < vllm.envs.VLLM_HTTP_TIMEOUT_KEEP_ALIVE
    assert UPSTREAM_KEEPALIVE_S < uvicorn.Config(app=None).timeout_keep_alive
    async with new_session() as session:
        assert session.connector is not None and session.connector._keepalive_timeout == UPSTREAM_KEEPALIVE_S
