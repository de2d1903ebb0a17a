"""The `reconcile` section: how often members are read and the reconciler looks for work (`reconcile/`)."""

from __future__ import annotations

from pydantic import Field

from rlcp.core.settings import Section


class ReconcileSettings(Section):
    poll_interval_s: float = Field(1.0, gt=0, description="How often every member's status is read, in seconds.")
    seen_refresh_s: float = Field(
        10.0,
        gt=0,
        description="How often the state document shows the last_seen of "
        "workers whose reads found nothing new, in seconds: such a read changes nothing "
        "else, so readers polling with If-None-Match get 304s between changes.",
    )
    interval_s: float = Field(1.0, gt=0, description="How often the reconciler looks for work, in seconds.")
    backoff_initial_s: float = Field(1.0, gt=0, description="First retry delay of a failing worker, in seconds.")
    backoff_max_s: float = Field(30.0, gt=0, description="Longest retry delay, in seconds.")
    yield_timeout_s: float = Field(
        120.0,
        gt=0,
        description="How long an API operation waits for the reconciler "
        "to yield (it stops between actions) before answering 409, in seconds.",
    )
