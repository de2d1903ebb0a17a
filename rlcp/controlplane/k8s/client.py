"""The connection to the Kubernetes API, and the one place its errors are translated.

One `kubernetes_asyncio.client.ApiClient` per process (one aiohttp session, like the
workers' session), built from, in order: an explicit `kubernetes.api_url` (tests, `kubectl
proxy`), the in-cluster service account when running in a pod, else a kubeconfig.

Every call goes through `call()`: the client's own `_request_timeout` plus an
`asyncio.timeout` around it (the library's timeout does not cover every step, e.g. token
refresh), and exceptions leave as this tree, each message naming the object and reason:

    K8sError
    ├── K8sNotFound      404
    ├── K8sConflict      409  stale resourceVersion, or AlreadyExists on create
    ├── K8sGone          410  resourceVersion too old (compacted): re-list
    └── K8sUnavailable   anything else: connect error, deadline, 5xx, 403, ...
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Awaitable
from typing import Any, TypeVar

import aiohttp
from kubernetes_asyncio import client, config
from kubernetes_asyncio.client.exceptions import ApiException

from rlcp.controlplane.settings.kubernetes import KubernetesApiSettings

T = TypeVar("T")


class K8sError(Exception):
    """A Kubernetes API call failed; `status` is the HTTP status when there was one."""

    def __init__(self, message: str, *, status: int | None = None, reason: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.reason = reason


class K8sNotFound(K8sError):
    pass


class K8sConflict(K8sError):
    pass


class K8sGone(K8sError):
    pass


class K8sUnavailable(K8sError):
    pass


def in_cluster() -> bool:
    """Kubernetes sets these in every container; the service account files come with them."""
    return bool(os.environ.get("KUBERNETES_SERVICE_HOST") and os.environ.get("KUBERNETES_SERVICE_PORT"))


async def make_api_client(settings: KubernetesApiSettings, *, user_agent: str) -> client.ApiClient:
    """An ApiClient for this process; the caller closes it. Must run inside the event loop
    (the client opens its aiohttp session here)."""
    configuration = client.Configuration()
    if settings.api_url:
        configuration.host = settings.api_url.rstrip("/")
    elif in_cluster():
        # Reads two small files (token, CA); re-reads the token when it rotates.
        config.load_incluster_config(  # type: ignore[no-untyped-call]  # the library's config module has no annotations
            client_configuration=configuration
        )
    else:
        # persist_config=False: a refreshed token is never written back into the user's file.
        await config.load_kube_config(
            config_file=str(settings.kubeconfig) if settings.kubeconfig else None,
            context=settings.context,
            client_configuration=configuration,
            persist_config=False,
        )
    api = client.ApiClient(configuration)
    # The API server's audit log and our fake tell replicas apart by this.
    api.user_agent = user_agent
    return api


def translate(exc: BaseException, what: str) -> K8sError:
    """Map a client exception to our tree; `what` names the call and object."""
    if isinstance(exc, ApiException):
        status, reason, message = exc.status, exc.reason, _status_message(exc)
        text = f"{what}: HTTP {status} {reason or ''}: {message}".rstrip(": ")
        if status == 404:
            return K8sNotFound(text, status=status, reason=reason)
        if status == 409:
            return K8sConflict(text, status=status, reason=_status_reason(exc) or reason)
        if status == 410:
            return K8sGone(text, status=status, reason=reason)
        return K8sUnavailable(text, status=status, reason=reason)
    if isinstance(exc, TimeoutError):
        return K8sUnavailable(f"{what}: no answer before the deadline")
    return K8sUnavailable(f"{what}: {type(exc).__name__}: {exc}")


async def call(what: str, awaitable: Awaitable[T], *, timeout_s: float) -> T:
    """Await one API call under a deadline; failures leave as `K8sError`. The caller passes
    `_request_timeout=timeout_s` to the client method as well, so the socket is closed too."""
    try:
        async with asyncio.timeout(timeout_s + 1.0):  # a little over the client's own timeout
            return await awaitable
    except (ApiException, aiohttp.ClientError, TimeoutError, OSError) as exc:
        raise translate(exc, what) from exc


def _status_body(exc: ApiException) -> dict[str, Any]:
    try:
        body = json.loads(exc.body) if exc.body else {}
    except (TypeError, ValueError):
        return {}
    return body if isinstance(body, dict) else {}


def _status_message(exc: ApiException) -> str:
    return str(_status_body(exc).get("message") or "")


def _status_reason(exc: ApiException) -> str | None:
    reason = _status_body(exc).get("reason")
    return str(reason) if reason else None
