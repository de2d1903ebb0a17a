"""The agent's inference port, as the gateway meets it: the headers that fence a request by weight
version and say which weights sampled what, and the bodies of its refusals (version mismatch,
paused, weights changed, engine dead).
"""

from __future__ import annotations

import json

# On an agent's inference port: a request carrying this header is served only while the
# agent's weights are at that version, else refused 409 `weight_version_mismatch` before the
# engine sees it. The gateway sets it to the version its fence admitted the worker at, so a
# worker that restarted (or changed weights) since the controller last read it is skipped.
EXPECT_VERSION_HEADER = "X-RL-Expect-Weight-Version"


# On a non-streamed answer: which weights sampled which output tokens, as the engine tracked
# them; JSON, one list of `{"version", "start", "end"}` spans per choice (end exclusive).
WEIGHT_VERSIONS_HEADER = "X-RL-Weight-Versions"


VERSION_MISMATCH = "weight_version_mismatch"


# An agent's inference answers when its engine is dead: on arrival, a 503 with this error code
# (the request never reached an engine, another worker may take it); the 5xx of a request during
# which the engine died carries the header (the request may be what killed it: not resent).
ENGINE_DEAD = "engine_dead"


ENGINE_DIED_HEADER = "X-RL-Engine-Died"


# The agent's exit status once its engine has died (`exit_on_engine_death`): its supervisor restarts it.
EXIT_ENGINE_DIED = 3


def weight_versions_header(choices: list[list[tuple[str, int, int]]]) -> str:
    """The `X-RL-Weight-Versions` value for these (version, start, end) spans, per choice."""
    return json.dumps(
        [[{"version": v, "start": start, "end": end} for v, start, end in spans] for spans in choices],
        separators=(",", ":"),
    )


def version_mismatch_body(expected: str, served: str | None) -> dict[str, dict[str, str]]:
    return {
        "error": {
            "code": VERSION_MISMATCH,
            "field": EXPECT_VERSION_HEADER,
            "message": f"this worker's weights are at {served!r}, not {expected!r}",
        }
    }


def paused_refusal_body(expected: str) -> dict[str, dict[str, str]]:
    """A request for named weights arriving while the worker is paused: it would wait in the
    queue and may run after an update, on other weights; refused as a mismatch, so the gateway
    (or Envoy's retry) sends it to a worker in service."""
    return {
        "error": {
            "code": VERSION_MISMATCH,
            "field": EXPECT_VERSION_HEADER,
            "message": f"this worker is paused (an update may change its weights before the request "
            f"runs): not taken for weights {expected!r}",
        }
    }


def weights_changed_body(expected: str, served: str | None) -> dict[str, dict[str, str]]:
    """A request for named weights that waited in the engine's queue (admitted before a pause)
    while the weights changed: it would be computed by the new ones under the old label, so it
    is refused before its first token goes out, as a mismatch (the gateway, or Envoy's retry,
    sends it to a worker with the weights it was admitted for)."""
    return {
        "error": {
            "code": VERSION_MISMATCH,
            "field": EXPECT_VERSION_HEADER,
            "message": f"this worker's weights changed to {served!r} before the request's first token: "
            f"not computed for weights {expected!r}",
        }
    }


def engine_dead_body() -> dict[str, dict[str, str]]:
    return {
        "error": {
            "code": ENGINE_DEAD,
            "message": "this worker's engine has died (it is being restarted); the request did not reach it",
        }
    }
