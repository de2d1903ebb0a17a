"""The agent's own errors, on the shared taxonomy (`rlcp.core.errors`):

ApiError
├── EngineCallError   502      the engine refused or failed a primitive
├── EngineDeadError   503      the engine is not alive
└── DeadlineError     504      an engine call ran past its deadline
"""

from __future__ import annotations

from rlcp.core.errors import ApiError


class EngineCallError(ApiError, status=502, code="engine_error"): ...


class EngineDeadError(ApiError, status=503, code="engine_dead"): ...


class DeadlineError(ApiError, status=504, code="deadline_exceeded"): ...
