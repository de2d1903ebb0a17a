"""The deadline arithmetic of a disk update, as pure code: what `timeout_s` bounds each step
by (docs/controller.md, "Round trips per worker"). A SIGSTOPped agent once made an update
with `timeout_s: 3` answer after 19 s: the one-call update counted a grace per phase."""

from __future__ import annotations

from rlcp.controlplane.deadlines import Deadlines


def _deadlines(**kw: float) -> Deadlines:
    base = {
        "call_s": 10.0,
        "pause_s": 60.0,
        "weight_load_s": 300.0,
        "transfer_init_s": 60.0,
        "transfer_chunk_s": 60.0,
        "checkpoint_wait_s": 10.0,
        "grace_s": 5.0,
    }
    return Deadlines(**(base | kw))


def test_an_update_in_one_call_is_its_pause_load_and_hashing_plus_one_grace() -> None:
    d = _deadlines()
    assert d.update_in_one_call(3.0, checksums=True) == 3 + 3 + 3 + 5
    assert d.update_in_one_call(3.0, checksums=False) == 3 + 3 + 5
    # Without timeout_s: the settings' bounds; hashing no longer than a checksum step (200 s here).
    assert d.update_in_one_call(None, checksums=True) == 60 + 300 + 200 + 5


def test_the_three_step_path_gives_each_call_its_own_grace() -> None:
    d = _deadlines()
    assert d.call_over(d.pause(3.0)) == 8  # the pause
    assert d.load_step(3.0, checksums=True) == 3 + 3 + 5  # the load and its hashing
    assert d.load_step(3.0, checksums=False) == 8
    assert d.load_step(None, checksums=True) == 300 + 200 + 5
