"""The `workers` section: how the controller calls the workers' admin APIs (`workers/`)."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field, SecretStr

from rlcp.core.settings import Section, read_token


class WorkerCallSettings(Section):
    """How the controller calls workers' admin APIs."""

    token: SecretStr | None = Field(None, description="Bearer token of the workers' admin APIs.")
    token_file: Path | None = None
    max_concurrency: int = Field(64, ge=1, description="Calls in flight at once across the fleet.")
    timeout_s: float = Field(10.0, gt=0, description="Deadline of one short admin call, in seconds.")
    attempts: int = Field(3, ge=1, description="Tries of an idempotent call.")
    retry_budget_s: float = Field(30.0, gt=0, description="All tries of one call together, in seconds.")
    pause_timeout_s: float = Field(60.0, gt=0, description="Default deadline to quiesce, in seconds.")
    weight_load_timeout_s: float = Field(600.0, gt=0, description="Deadline of a disk weight load, in seconds.")
    checkpoint_wait_s: float = Field(
        10.0,
        ge=0,
        description="How long a disk update waits, before pausing anyone, for its checkpoint to be "
        "there on the workers (shared storage that shows files a moment late), in seconds; checked every 0.25 s.",
    )
    deadline_grace_s: float = Field(
        5.0,
        gt=0,
        description="Our deadline on a call the engine bounds itself (a "
        "pause, a load) is the engine's plus this, so the worker's own answer, naming "
        "what it waited for, comes first; in seconds.",
    )

    def resolved_token(self) -> str | None:
        return read_token(self.token, self.token_file)
