"""The `leader_election` section: one replica leads through a Lease (`leadership/lease.py`)."""

from __future__ import annotations

from pydantic import Field, model_validator

from rlcp.controlplane.k8s.pod import pod_identity, pod_namespace
from rlcp.core.settings import Section


class LeaderElectionSettings(Section):
    """One replica leads through a coordination.k8s.io/v1 Lease (client-go's algorithm)."""

    enabled: bool = Field(False, description="Off: this replica always leads (a single controller).")
    lease_name: str = Field("rl-controlplane", min_length=1, description="Name of the Lease.")
    namespace: str = Field(default_factory=pod_namespace, description="Namespace of the Lease; default the pod's own.")
    identity: str = Field(
        default_factory=pod_identity,
        min_length=1,
        description="This replica's holder identity; default env POD_NAME, else the hostname.",
    )
    lease_duration_s: float = Field(
        15.0, gt=0, description="How long others wait after the last renewal seen before taking the Lease, in seconds."
    )
    renew_deadline_s: float = Field(
        10.0,
        gt=0,
        description="The leader steps down when it has not renewed for this long, in seconds; below lease_duration_s.",
    )
    retry_period_s: float = Field(2.0, gt=0, description="Interval between tries to acquire or renew, in seconds.")

    @model_validator(mode="after")
    def _check(self) -> LeaderElectionSettings:
        # The old leader must stop before anyone else may start: renew_deadline < lease_duration.
        if self.renew_deadline_s >= self.lease_duration_s:
            raise ValueError("leader_election.renew_deadline_s must be below lease_duration_s")
        if self.retry_period_s >= self.renew_deadline_s:
            raise ValueError("leader_election.retry_period_s must be below renew_deadline_s")
        return self
