"""What a worker's answer says beyond its bytes: read by the gateway before it hands the answer
on. Pure code over the status, headers and body.

- which weights made it: the engine's per-choice version spans, when the body carries them
  (vLLM's tokens-in/tokens-out answers, SGLang's `meta_info` / `metadata`), for the
  `X-RL-Weight-Versions` header (an agent sets the header itself);
- whether it names other weights than the fence chose its member at (SGLang: an answer from a
  member restarted on other weights since the fence last saw it);
- whether it refuses the request for its weights (an agent's 409 `weight_version_mismatch`);
- whether the engine is dead, before (an agent's 503 `engine_dead`) or during the request.

Each returns why (a message or a `TryFailed`), or None when the answer is to be handed on.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from rlcp.controlplane.gateway.retry import RetryReason, TryFailed
from rlcp.controlplane.gateway.routing import Target
from rlcp.core.wire.agent.inference import ENGINE_DEAD, ENGINE_DIED_HEADER, VERSION_MISMATCH

# What vLLM answers (HTTP 500) for a request that meets a dead EngineCore
# (`vllm.v1.engine.exceptions.EngineDeadError`); a stock server has no way to say whether the
# engine was dead before the request arrived, so it counts as died during it.
_VLLM_ENGINE_DEAD = b"EngineCore encountered an issue"


def engine_death(status: int, headers: Mapping[str, str], payload: bytes) -> TryFailed | None:
    """The worker's engine is dead, by its 5xx answer (`headers`: case-insensitive): before
    (`ENGINE_DEAD`) or during (`ENGINE_DIED`) this request; None for any other 5xx (which goes
    to the client unchanged)."""
    if ENGINE_DIED_HEADER in headers or _VLLM_ENGINE_DEAD in payload:
        error = _error_of(payload)
        message = str(error.get("message")) if error is not None else payload[:200].decode(errors="replace")
        return TryFailed(message, RetryReason.ENGINE_DIED, status=status)
    if status == 503 and (error := _error_of(payload)) is not None and error.get("code") == ENGINE_DEAD:
        return TryFailed(f"engine dead: {error.get('message')}", RetryReason.ENGINE_DEAD, status=503)
    return None


def _error_of(payload: bytes) -> dict[str, Any] | None:
    """The `error` object of a JSON error answer (vLLM's, an agent's), or None."""
    try:
        error = json.loads(payload).get("error")
    except (ValueError, AttributeError):
        return None
    return error if isinstance(error, dict) else None


def version_refusal(payload: bytes) -> str | None:
    """An agent's refusal of a request that expected other weights (its 409's body), as the
    reason; None for any other 409 (which goes to the client unchanged)."""
    try:
        error = json.loads(payload)["error"]
        return str(error["message"]) if error.get("code") == VERSION_MISMATCH else None
    except (ValueError, TypeError, KeyError, AttributeError):
        return None


def weight_versions(payload: bytes, content_type: str) -> str | None:
    """The engine's version spans in the body (vLLM's tokens-in/tokens-out answers carry them
    per choice), as the header's JSON: one list of spans per choice."""
    if content_type != "application/json" or b"weight_versions" not in payload:
        return None
    try:
        body = json.loads(payload)
    except ValueError:
        return None
    if not isinstance(body, dict):
        return None
    choices = [c.get("weight_versions") for c in body.get("choices") or [] if isinstance(c, dict)]
    if not any(choices):
        # SGLang: one request's spans in `meta_info` (native /generate, a list for a batch) or
        # `metadata` (its OpenAI routes).
        metas = body.get("meta_info"), body.get("metadata")
        choices = [m.get("weight_versions") for m in metas if isinstance(m, dict)]
        if not any(choices):
            return None
    return json.dumps([c or [] for c in choices], separators=(",", ":"))


def other_version(payload: bytes, route: Target) -> str | None:
    """Why an answer that names its weights' version (SGLang's `meta_info` / `metadata`
    `weight_version`) cannot be vouched for: it names another version than the fence chose the
    member at. None when it names that one or none."""
    try:
        body = json.loads(payload)
    except ValueError:
        return None
    answers = body if isinstance(body, list) else [body]  # /generate answers a list for a batch
    for answer in answers:
        if not isinstance(answer, dict):
            continue
        for key in ("meta_info", "metadata"):
            meta = answer.get(key)
            said = meta.get("weight_version") if isinstance(meta, dict) else None
            if said is not None and str(said) != route.weight_version:
                return (
                    f"worker {route.worker_id} answered from weights {said!r}, not {route.weight_version!r} "
                    "the fence chose it at (it restarted or moved since)"
                )
    return None


def weights_changed(route: Target, in_service: bool, now: str | None) -> str | None:
    """Why a pinned member's answer cannot be vouched for, given what the state says of it now
    (`Router.member_now`): it left service (an update cordoned or paused it) or its weights
    changed while it held the request."""
    if in_service and now == route.weight_version:
        return None
    if now != route.weight_version:
        return (
            f"worker {route.worker_id}'s weights changed from {route.weight_version!r} to {now!r} while it "
            "held the request, so its answer may come from either"
        )
    return (
        f"worker {route.worker_id} left service (an update) while it held the request, so its answer may "
        "come from the next weights"
    )
