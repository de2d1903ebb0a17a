"""The agent's operation records: each mutating operation leaves one record, one metric
observation and one log line, whatever its outcome.

The last `KEPT` records are shown in `GET /v1/agent/state` (newest first); the metrics count
operations by kind and outcome (`rlcp/agent/metrics.py`). An outcome is `timeout` for a
deadline the engine missed, `cancelled` when the task running it was cancelled before it ended
(the caller went away, the agent is stopping: the engine may be half way), `error` for any
other failure (the error's message recorded), else `ok`. The log line carries the operation's
id and kind, bound for every line logged meanwhile.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections import deque
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import UTC, datetime

import structlog

from rlcp.agent.errors import DeadlineError
from rlcp.agent.metrics import AgentMetrics
from rlcp.core.errors import ApiError
from rlcp.core.wire.agent.state import OperationKind, OperationRecord, OperationStatus

log = structlog.get_logger("rlcp.agent.records")
KEPT = 32


class OperationRecords:
    def __init__(self, metrics: AgentMetrics) -> None:
        self._metrics = metrics
        self._records: deque[OperationRecord] = deque(maxlen=KEPT)

    def recent(self) -> list[OperationRecord]:
        """The last records, newest first."""
        return list(self._records)[::-1]

    @asynccontextmanager
    async def record(self, kind: OperationKind, **fields: str | None) -> AsyncIterator[None]:
        """Record the operation run inside; `fields` go to its log line."""
        op_id = uuid.uuid4().hex[:12]
        started, t0 = datetime.now(UTC), time.perf_counter()
        status: OperationStatus = "ok"
        message: str | None = None
        with structlog.contextvars.bound_contextvars(operation_id=op_id, operation=kind):
            try:
                yield
            except DeadlineError as exc:
                status, message = "timeout", exc.message
                raise
            except asyncio.CancelledError:
                status, message = "cancelled", "cancelled before it finished"
                raise
            except ApiError as exc:
                status, message = "error", exc.message
                raise
            except Exception as exc:  # recorded, then the middleware answers 500
                status, message = "error", f"{type(exc).__name__}: {exc}"
                raise
            finally:
                duration = time.perf_counter() - t0
                self._records.append(
                    OperationRecord(
                        id=op_id,
                        kind=kind,
                        status=status,
                        started_at=started,
                        duration_s=round(duration, 6),
                        message=message,
                    )
                )
                self._metrics.observe(kind, status, duration)
                log.info("operation", status=status, duration_s=round(duration, 4), error=message, **fields)
