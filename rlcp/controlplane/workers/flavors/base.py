"""What every driver holds: its worker's spec, the transport that reaches it, its deadlines."""

from __future__ import annotations

from rlcp.controlplane.deadlines import DriverDeadlines
from rlcp.controlplane.workers.spec import WorkerSpec
from rlcp.controlplane.workers.transport import WorkerTransport


class DriverBase:
    def __init__(self, *, spec: WorkerSpec, transport: WorkerTransport, deadlines: DriverDeadlines) -> None:
        self.spec = spec
        self.transport = transport
        self.deadlines = deadlines
