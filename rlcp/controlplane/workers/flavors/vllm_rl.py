"""vLLM's RL weight-transfer routes, shared by the flavors that serve them unchanged
(the agent and stock vLLM). Collective calls: never retried, since the other side may
already be in the group."""

from __future__ import annotations

from typing import Any

from rlcp.controlplane.workers.capabilities import TransferWire
from rlcp.controlplane.workers.flavors.base import DriverBase


class VllmWeightTransferRoutes(DriverBase):
    """The broadcast-peer capability over vLLM's own routes."""

    transfer_wire: TransferWire = "vllm"  # vLLM's weight-transfer engines on the worker side

    def init_info_problem(self, init_info: dict[str, Any]) -> tuple[str, str] | None:
        return None  # vLLM's engine checks its own (a 4xx of the worker's, passed on)

    def update_info_problem(self, chunk: dict[str, Any]) -> tuple[str, str] | None:
        return None

    async def init_weight_transfer(self, init_info: dict[str, Any], timeout_s: float) -> None:
        await self.transport.request(
            "POST", "/init_weight_transfer_engine", json_body={"init_info": init_info}, timeout_s=timeout_s, retry=False
        )

    async def start_weight_update(self) -> None:
        await self.transport.request("POST", "/start_weight_update", retry=False)

    async def update_weights(self, update_info: dict[str, Any] | list[dict[str, Any]], timeout_s: float) -> None:
        await self.transport.request(
            "POST", "/update_weights", json_body={"update_info": update_info}, timeout_s=timeout_s, retry=False
        )

    async def finish_weight_update(self, version: str | None) -> None:
        await self.transport.request(
            "POST", "/finish_weight_update", json_body={"weight_version": version}, retry=False
        )

    async def shutdown_weight_transfer(self) -> None:
        # Leaving a group twice is harmless, so this one is retried.
        await self.transport.request("POST", "/shutdown_weight_transfer_engine")

    async def update_weight_version(self, version: str) -> None:
        await self.transport.request("POST", "/update_weight_version", json_body={"new_version": version})
