"""Every deadline the controller puts on a worker, derived once, by name, from settings.

Two layers of deadline meet on each call: the engine's own (an agent bounds a pause by the
`timeout_s` it is sent) and ours on the call (fan-out cancels it). Ours is the engine's plus
a grace (`workers.deadline_grace_s`), so the worker's own answer ("did not quiesce within 5s",
naming what it waited for) arrives before our deadline fires and says less ("did not answer").
"""

from __future__ import annotations

from dataclasses import dataclass

from rlcp.controlplane.settings import ControllerSettings


@dataclass(frozen=True, kw_only=True)
class DriverDeadlines:
    """What a driver needs to bound its own calls."""

    weight_load_s: float  # a disk load, an adapter load, hashing every parameter
    grace_s: float  # our call deadline over the engine's own, so its answer comes first

    @property
    def load_and_hash_s(self) -> float:
        """A disk load answered with the new weights' checksums: hashing reads every parameter again."""
        return self.weight_load_s * 2


@dataclass(frozen=True, kw_only=True)
class Deadlines:
    """Named deadlines, in seconds."""

    call_s: float  # one short admin call (one attempt)
    pause_s: float  # default time for the fleet to quiesce
    weight_load_s: float  # default time for one disk load
    transfer_init_s: float  # every worker joining the trainer's group
    transfer_chunk_s: float  # start, one chunk, finish
    checkpoint_wait_s: float  # a checkpoint not on the workers yet: how long to look again
    grace_s: float  # our call deadline over the engine's own, so its answer comes first

    @classmethod
    def from_settings(cls, settings: ControllerSettings) -> Deadlines:
        w, t = settings.workers, settings.weight_transfer
        return cls(
            call_s=w.timeout_s,
            pause_s=w.pause_timeout_s,
            weight_load_s=w.weight_load_timeout_s,
            transfer_init_s=t.init_timeout_s,
            transfer_chunk_s=t.chunk_timeout_s,
            checkpoint_wait_s=w.checkpoint_wait_s,
            grace_s=w.deadline_grace_s,
        )

    @property
    def driver(self) -> DriverDeadlines:
        return DriverDeadlines(weight_load_s=self.weight_load_s, grace_s=self.grace_s)

    @property
    def control_s(self) -> float:
        """A short step across the fleet (status, resume, set desired, rename): one call
        and one retry's worth."""
        return self.call_s * 2

    @property
    def lora_s(self) -> float:
        """An adapter load reads from disk: longer than a control call."""
        return self.call_s * 3

    @property
    def checksums_s(self) -> float:
        """Hashing every parameter takes far longer than a control call."""
        return self.control_s * 10

    def pause(self, requested_s: float | None = None) -> float:
        """The engine's own bound on quiescing."""
        return requested_s or self.pause_s

    def load(self, requested_s: float | None = None) -> float:
        return requested_s or self.weight_load_s

    def load_step(self, requested_s: float | None, *, checksums: bool) -> float:
        """Our deadline on an update's load step: the load, plus hashing when a load's answer
        carries checksums. Hashing reads every parameter from memory once, so it is given no longer
        than the load (and no longer than a checksum step of its own)."""
        load_s = self.load(requested_s)
        return self.call_over(load_s + self._hashing(load_s, checksums))

    def update_in_one_call(self, requested_s: float | None, *, checksums: bool) -> float:
        """Our deadline on an update the worker takes in one call (the agent's
        `weights/update`): its pause, its load and the hashing, bounded as the three steps are,
        with one grace, since it is one answer. With `timeout_s: 3` and the default 5 s grace:
        3 + 3 + 3 + 5 = 14 s (a grace per phase had made it 19 s)."""
        load_s = self.load(requested_s)
        return self.call_over(self.pause(requested_s) + load_s + self._hashing(load_s, checksums))

    def _hashing(self, load_s: float, checksums: bool) -> float:
        return min(load_s, self.checksums_s) if checksums else 0.0

    def call_over(self, engine_s: float) -> float:
        """Our deadline on a call the engine bounds by `engine_s` itself."""
        return engine_s + self.grace_s

    def reconcile_action(self, kind: str) -> float:
        """A reconciler step: the engine's bound plus one short call."""
        if kind == "update_weights":
            return self.weight_load_s + self.call_s
        if kind in ("pause", "sleep"):
            return self.pause_s + self.call_s
        return self.control_s
