"""The blocking client offers every call of the async one, with the same parameters."""

from __future__ import annotations

import inspect

from rlcp.client.client import ControlPlaneClient, SyncControlPlaneClient, _Blocking


def test_the_sync_client_has_every_public_call_of_the_async_one() -> None:
    calls = {
        name
        for name, fn in inspect.getmembers(ControlPlaneClient, inspect.iscoroutinefunction)
        if not name.startswith("_")
    } - {"close"}  # close: the sync client's own, which also stops its loop
    blocking = {name for name, value in vars(SyncControlPlaneClient).items() if isinstance(value, _Blocking)}
    assert blocking == calls


def test_a_blocking_call_keeps_the_signature_and_docstring() -> None:
    with SyncControlPlaneClient("http://127.0.0.1:9") as client:
        method = client.update_weights
        params = list(inspect.signature(method).parameters)
        assert params == list(inspect.signature(ControlPlaneClient.update_weights).parameters)[1:]
        assert method.__doc__ == ControlPlaneClient.update_weights.__doc__
