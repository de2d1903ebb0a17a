"""Per-flavor request amendment: how a request reaches the one member the fence chose.

Most flavors serve inference on a port of their own, so the member's URL is the choice and
the body goes as it came. A Dynamo worker has no inference port: requests reach it through
Dynamo's frontend and its request plane, and the frontend's router would pick any instance,
fenced or not. Dynamo 1.6.1's frontend takes `nvext.backend_instance_id` (a u64) to send a
request to one instance, so for members of flavor `dynamo` the gateway forwards to the
frontend (the member's `inference_url`) with that field set to the member's instance id
(its member id, from the listing; which flavors go so is `workerspec.FLAVOR_REQUESTS`, carried
by the fence's table as `Target.pinned`), merged into whatever `nvext` the client sent
(`token_data`, `extra_fields` and the rest pass unchanged).

Checked against the running frontend (tests/e2e/test_dynamo_rollouts.py): a pinned request is
served by that instance only; an id the frontend does not know is answered
`400 {"message": "Invalid request", ...}` (a client's own bad field is named in the message
instead); a worker killed while the frontend still lists it is answered 503 "Service
temporarily unavailable", then 500 "Failed to generate completions". `pin_refused` names
those as this member's failure (not the client's), so the proxy tries another member and
never hands them on as an answer.

    check_client_nvext   the client's body, before any worker is chosen: 4xx naming the field
    pinned_body          the body with the member's pin merged in
    pin_refused          whether a frontend's answer refused the pin
"""

from __future__ import annotations

import json
from typing import Any

from rlcp.core.errors import BadRequestError

PIN_FIELD = "backend_instance_id"
_FRONTEND_REFUSAL = "Invalid request"  # Dynamo 1.6.1's whole message for an unknown instance id
_U64_MAX = 2**64 - 1


def check_client_nvext(body: dict[str, Any]) -> None:
    """`nvext`, if sent, is an object that leaves placement to the fence."""
    nvext = body.get("nvext")
    if nvext is None:
        return
    if not isinstance(nvext, dict):
        raise BadRequestError(f"nvext must be an object, got {type(nvext).__name__}", field="nvext")
    if nvext.get(PIN_FIELD) is not None:
        raise BadRequestError(
            f"nvext.{PIN_FIELD} is chosen by the gateway (the weight-version fence picks the worker); leave it out",
            field=f"nvext.{PIN_FIELD}",
        )


def instance_number(worker_id: str) -> int | None:
    """A member id as Dynamo's u64 instance id; None if it is not one."""
    if not worker_id.isdigit():
        return None
    number = int(worker_id)
    return number if number <= _U64_MAX else None


def pinned_body(body: bytes, worker_id: str) -> bytes:
    """`body` (a JSON object, checked by the app) with `nvext.backend_instance_id` = the member's
    instance. Raises `ValueError` naming the worker if its id is not a Dynamo instance id."""
    instance = instance_number(worker_id)
    if instance is None:
        raise ValueError(f"worker {worker_id} is of flavor dynamo but its id is not a Dynamo instance id (u64)")
    data = json.loads(body) if body.strip() else {}
    nvext = data.get("nvext")
    data["nvext"] = {**(nvext if isinstance(nvext, dict) else {}), PIN_FIELD: instance}
    return json.dumps(data, separators=(",", ":")).encode()


def pin_refused(status: int, payload: bytes) -> str | None:
    """Why the frontend could not serve the pinned instance (it does not know it, or cannot
    reach it), rather than refusing the client's request; None if it did not say so."""
    if status >= 500:
        return f"the frontend could not reach it (HTTP {status} {payload[:200].decode(errors='replace')})"
    if status != 400:
        return None
    try:
        answer = json.loads(payload)
    except ValueError:
        return None
    if isinstance(answer, dict) and answer.get("message") == _FRONTEND_REFUSAL:
        return f"the frontend refused the pin (HTTP 400 {_FRONTEND_REFUSAL}): it no longer lists that worker"
    return None
