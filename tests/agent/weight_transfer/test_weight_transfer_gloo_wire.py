"""The gloo backend's wire without an engine: `init_info` as `nccl` clients send it (TRL's
`packed: true`), and the bytes two ranks of a real gloo group move, packed and unpacked.

No vLLM engine runs here (the engine-side path is `test_weight_transfer_gloo.py`, marked
vllm): its tests import vLLM's weight-transfer base classes, and the two ranks are two
threads of this process on a loopback TCPStore.
"""

from __future__ import annotations

import threading
from dataclasses import asdict
from types import ModuleType
from typing import TYPE_CHECKING, Any

import pytest

from rlcp.harness.http import free_port

if TYPE_CHECKING:
    import torch

    from rlcp.agent.weight_transfer.gloo_wire import GlooGroup

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def gloo() -> ModuleType:
    """The backend (`rlcp.agent.weight_transfer.cpu_gloo`), imported when a test here runs, not
    when the file is collected: it imports vLLM's config (~13 s), which every pytest process of
    the full run would otherwise pay to collect this file. torch likewise."""
    from rlcp.agent.weight_transfer import cpu_gloo

    return cpu_gloo


@pytest.fixture(scope="module")
def wire() -> ModuleType:
    """The bytes on the wire (`rlcp.agent.weight_transfer.gloo_wire`), imported the same way."""
    from rlcp.agent.weight_transfer import gloo_wire

    return gloo_wire


# What TRL 1.16.0 sends to `/init_weight_transfer_engine` on vLLM >= 0.28 (trl/generation/vllm_client.py,
# `init_communicator`); the controller sets `rank_offset` per worker.
TRL_INIT_INFO = {"master_address": "127.0.0.1", "master_port": 29500, "rank_offset": 1, "world_size": 3, "packed": True}


def test_trl_init_info_is_accepted_and_packs(gloo: ModuleType) -> None:
    info = gloo.GlooWeightTransferInitInfo(**TRL_INIT_INFO)  # what vLLM's parse_init_info does
    assert info.packed is True
    assert gloo.wire_limit(info) == gloo.DEFAULT_BUFFER_SIZE_BYTES


def test_nccl_wire_keys_mean_what_they_mean_in_nccl(gloo: ModuleType) -> None:
    unpacked = gloo.GlooWeightTransferInitInfo(**{**TRL_INIT_INFO, "packed": False})
    assert gloo.wire_limit(unpacked) == 1  # every tensor alone
    sized = gloo.GlooWeightTransferInitInfo(**TRL_INIT_INFO, packed_buffer_size_bytes=4096, packed_num_buffers=3)
    assert gloo.wire_limit(sized) == 4096
    assert gloo.wire_limit(gloo.GlooWeightTransferInitInfo(**TRL_INIT_INFO, buffer_size_bytes=2048)) == 2048


@pytest.mark.parametrize(
    ("extra", "says"),
    [
        ({"packed": "yes"}, "packed must be true or false"),
        ({"buffer_size_bytes": 1024, "packed_buffer_size_bytes": 2048}, "not both"),
        ({"packed_num_buffers": 0}, "must be positive"),
        ({"packed_buffer_size_bytes": 0}, "must be positive"),
    ],
)
def test_bad_wire_keys_are_refused_naming_them(gloo: ModuleType, extra: dict[str, Any], says: str) -> None:
    with pytest.raises(ValueError, match=says):
        gloo.GlooWeightTransferInitInfo(**{**TRL_INIT_INFO, **extra})


def test_the_trainer_ships_its_layout_to_the_workers(gloo: ModuleType) -> None:
    trainer = gloo.GlooTrainerInitInfo(
        master_address="127.0.0.1", master_port=1, world_size=2, rank=0, packed=False, packed_num_buffers=4
    )
    assert gloo.wire_limit(trainer) == 1
    assert trainer.packed_num_buffers == 4


class _Counting:
    """A GlooGroup that counts its broadcasts."""

    def __init__(self, group: GlooGroup) -> None:
        self.group, self.broadcasts = group, 0

    def broadcast(self, wire: torch.Tensor) -> Any:
        self.broadcasts += 1
        return self.group.broadcast(wire)


def _tensors() -> dict[str, torch.Tensor]:
    import torch  # with the backend: not at collection

    g = torch.Generator().manual_seed(0)
    return {
        "a": torch.randn(3, 5, generator=g),
        "b": torch.randn(7, generator=g).to(torch.bfloat16),
        "c": torch.randint(0, 100, (4, 2), generator=g),
        "d": torch.randn(2, 2, generator=g),
    }


@pytest.mark.parametrize(("packed", "broadcasts"), [(True, 1), (False, 4)])
def test_two_ranks_move_the_same_tensors_packed_or_one_by_one(
    gloo: ModuleType, wire: ModuleType, packed: bool, broadcasts: int
) -> None:
    tensors = _tensors()
    info = gloo.GlooWeightTransferInitInfo(
        master_address="127.0.0.1", master_port=free_port(), rank_offset=1, world_size=2, timeout_s=30, packed=packed
    )
    meta = gloo.GlooWeightTransferUpdateInfo(**_update_info(tensors)).metadata()
    limit = gloo.wire_limit(info)
    received: dict[str, torch.Tensor] = {}
    sent: list[_Counting] = []
    errors: list[BaseException] = []

    def rank(r: int) -> None:
        try:
            group = wire.GlooGroup(
                master_address=info.master_address,
                master_port=info.master_port,
                rank=r,
                world_size=2,
                timeout_s=info.timeout_s,
            )
            counting = _Counting(group)
            try:
                if r == 0:
                    sent.append(counting)
                    wire.send_tensors(counting, iter(tensors.items()), meta, limit)  # type: ignore[arg-type]
                else:
                    wire.receive_tensors(
                        counting,  # type: ignore[arg-type]
                        meta,
                        limit,
                        lambda pairs: received.update((n, t.clone()) for n, t in pairs),
                        info.packed_num_buffers,
                    )
            finally:
                group.close()
        except BaseException as exc:  # noqa: BLE001 - handed to the test's thread
            errors.append(exc)

    threads = [threading.Thread(target=rank, args=(r,), name=f"gloo-rank-{r}") for r in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors
    assert sent[0].broadcasts == broadcasts
    assert received.keys() == tensors.keys()
    for name, tensor in tensors.items():
        assert received[name].equal(tensor), name


def _update_info(tensors: dict[str, torch.Tensor]) -> dict[str, Any]:
    return {
        "names": list(tensors),
        "dtype_names": [str(t.dtype).removeprefix("torch.") for t in tensors.values()],
        "shapes": [list(t.shape) for t in tensors.values()],
    }


def test_update_info_round_trips(gloo: ModuleType) -> None:
    info = gloo.GlooWeightTransferUpdateInfo(**_update_info(_tensors()))
    assert asdict(gloo.GlooWeightTransferUpdateInfo.from_metadata(info.metadata())) == asdict(info)
