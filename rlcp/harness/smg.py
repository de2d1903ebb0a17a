"""SMG 1.13 (the Shepherd model gateway, `smg` on PyPI) with its RL fan-out: a baseline for the benchmarks.

`SmgProcess` runs SMG's own `smg launch` (its console script is `smg.cli:main`; `python -m smg`
is the same entry) in front of stock `vllm serve` servers with `--enable-rl`, which mounts
`GET /v1/rl/workers` and the fan-out `POST /v1/rl/engine/{route}?selector=...`: one call that
SMG sends on to every matching worker's `/{route}`, answering a result per worker. SMG keeps
no weight version and holds no fence: what it offers is that relay and nothing more.

SMG is not a dependency of the project. Its wheel (37 MB, abi3, CPU-only fine) goes into a
directory of its own that only SMG's process puts on PYTHONPATH (`smg_home`), so the project's
venv does not change; `smg launch` needs nothing from the wheel's dependencies beyond
`setproctitle` and `pyyaml`, which the venv has:

    python -m pip install --no-deps --target .venv/smg-1.13.0 smg==1.13.0

(or `RLCP_SMG_TARGET=<dir>` for another directory). A Python that imports `smg` 1.13.0 itself
works too.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import sys
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import aiohttp

from rlcp.harness.http import call, free_port
from rlcp.harness.processes import REPO, child_env
from rlcp.harness.servers import HttpServerProcess

SMG_VERSION = "1.13.0"
INSTALL = f"python -m pip install --no-deps --target .venv/smg-{SMG_VERSION} smg=={SMG_VERSION}"


class SmgMissing(RuntimeError):
    """smg 1.13.0 is not installed where the harness looks; the message says how to install it."""


def smg_home() -> Path | None:
    """The directory to put on SMG's PYTHONPATH: `$RLCP_SMG_TARGET`, else `.venv/smg-1.13.0` in
    the repository, when it holds smg 1.13.0; None when this Python imports smg 1.13.0 itself.
    Raises `SmgMissing` (saying how to install it) otherwise."""
    target = Path(os.environ.get("RLCP_SMG_TARGET") or REPO / ".venv" / f"smg-{SMG_VERSION}")
    if (target / f"smg-{SMG_VERSION}.dist-info").is_dir():
        return target
    try:
        found = importlib.metadata.version("smg")
    except importlib.metadata.PackageNotFoundError:
        found = None
    if found == SMG_VERSION:
        return None
    seen = f"this Python has smg {found}" if found else "this Python has no smg"
    raise SmgMissing(
        f"smg {SMG_VERSION} is not installed: no {target}/smg-{SMG_VERSION}.dist-info and {seen}; "
        f"install it with `{INSTALL}` (from the repository) or point RLCP_SMG_TARGET at such a directory"
    )


class SmgProcess(HttpServerProcess):
    """`smg launch` with its RL routes on, over `worker_urls`, round robin, on loopback; ready
    when `GET /v1/rl/workers` lists every one of them. `control_timeout_s` is SMG's own deadline
    for one relayed engine call (`--rl-control-timeout-secs`)."""

    ready_path = "/v1/rl/workers"
    ready_poll_s = 0.05

    def __init__(
        self,
        worker_urls: Sequence[str],
        workdir: Path,
        *,
        name: str = "smg",
        control_timeout_s: float = 120.0,
        start_timeout_s: float = 60.0,
        **kw: Any,
    ) -> None:
        super().__init__({}, workdir, name=name, start_timeout_s=start_timeout_s, **kw)
        self.worker_urls, self.control_timeout_s = list(worker_urls), control_timeout_s
        self.home = smg_home()  # refuses before anything starts when SMG is missing
        self.port, self.metrics_port = free_port(), free_port()

    def argv(self) -> list[str]:
        return [
            sys.executable,
            "-m",
            "smg",
            "launch",
            *self.listen_args(),
            "--prometheus-host",
            "127.0.0.1",
            "--prometheus-port",
            str(self.metrics_port),
            "--worker-urls",
            *self.worker_urls,
            "--policy",
            "round_robin",
            "--enable-rl",
            "--rl-control-timeout-secs",
            str(int(self.control_timeout_s)),
            # Nothing here is SMG's own to measure: no breaker opening on a paused worker,
            # no tokenizer download (the machine is offline), no health probes in the timing.
            "--disable-circuit-breaker",
            "--disable-tokenizer-autoload",
            "--disable-health-check",
            "--log-level",
            "warn",
        ]

    def environment(self) -> dict[str, str]:
        extra = {} if self.home is None else {"PYTHONPATH": str(self.home)}
        return child_env(**extra, **self.extra_env)

    def probe(self) -> bool:
        """Ready once `GET /v1/rl/workers` lists every worker (its HTTP server alone is not enough)."""
        try:
            with urllib.request.urlopen(self.url + self.ready_path, timeout=self.ready_timeout_s) as resp:
                listed = {w.get("url") for w in json.loads(resp.read()).get("workers", [])}
        except (OSError, urllib.error.URLError, ValueError):
            return False
        return listed >= set(self.worker_urls)


class FanoutFailed(RuntimeError):
    """A fan-out that did not reach every worker with a 2xx."""


async def fanout(
    http: aiohttp.ClientSession,
    smg_url: str,
    route: str,
    body: Any = None,
    *,
    expect: int,
    method: str = "POST",
    params: dict[str, str] | None = None,
    selector: str = "engine=vllm",
    timeout_s: float = 120.0,
) -> dict[str, Any]:
    """`{method} /v1/rl/engine/{route}?selector=...` through SMG: each worker's answer body by
    worker id. Raises `FanoutFailed` unless all `expect` workers answered 2xx: SMG answers 207 with
    a `failed` list for a partial fan-out, which must not pass as done."""
    query = urllib.parse.urlencode({"selector": selector, **(params or {})})
    status, payload = await call(
        http, method, f"{smg_url}/v1/rl/engine/{route}?{query}", body=body, timeout_s=timeout_s
    )
    if status != 200 or not isinstance(payload, dict):
        raise FanoutFailed(f"{method} {route} through SMG answered {status}: {str(payload)[:500]}")
    results: dict[str, Any] = payload.get("results") or {}
    bad = {w: r.get("status") for w, r in results.items() if not 200 <= int(r.get("status", 0)) < 300}
    if payload.get("failed") or bad or len(results) != expect:
        raise FanoutFailed(
            f"{method} {route} through SMG: {len(results)} of {expect} answered, failed "
            f"{payload.get('failed')}, non-2xx {bad}"
        )
    return {w: r.get("body") for w, r in results.items()}
