"""Publishing a narrowed fence to a data plane that holds its own copy, before anyone is paused.

The Python gateway in the controller's process reads the fence from the registry on every
request, so a cordon is in force the moment it is made. A data plane that keeps its own copy
(Envoy, fed over xDS: `gateway/envoy/`) is told, and acknowledges, a moment later; an update
must not pause a member such a copy still sends rollouts to. So operations that narrow the
fence before a pause (`operations/weights.py`, `operations/sleep.py`) await `publish()` on
the controller's `FenceSync`, when one is set: it sends the fence as it is now and waits,
within its own deadline, for every connected copy to acknowledge it. What it answers goes in
the operation's record: how long it waited and who had not acknowledged by the deadline.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol


@dataclass(frozen=True)
class Published:
    version: str  # the fence's version as the data plane is sent it
    waited_s: float
    acked: list[str] = field(default_factory=list)  # the connected copies that acknowledged it
    unacked: dict[str, str] = field(default_factory=dict)  # copy -> why not, past the deadline

    def record(self) -> dict[str, object]:
        """The operation record's `fence_published` entry."""
        out: dict[str, object] = {"version": self.version, "waited_s": round(self.waited_s, 4), "acked": self.acked}
        if self.unacked:
            out["unacked"] = self.unacked
        return out


class FenceSync(Protocol):
    async def publish(self) -> Published:
        """Send every copy the fence as it is now; answer once each connected copy has
        acknowledged it, or its deadline has passed (then `unacked` names the laggards)."""
