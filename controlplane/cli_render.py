"""rlctl's tables: FleetState and OperationResult drawn with rich. No I/O here."""

from __future__ import annotations

from rich.console import Group
from rich.table import Table
from rich.text import Text

from controlplane.state import FleetState, OperationResult

_STATUS_STYLE = {"ok": "green", "skipped": "dim", "error": "red", "timeout": "red", "partial": "yellow",
                 "failed": "red", "running": "cyan"}
_PHASE_STYLE = {"serving": "green", "paused": "yellow", "degraded": "yellow", "failed": "red"}


def _yn(value: bool | None) -> str:
    return {True: "yes", False: "no", None: "?"}[value]


def state_view(st: FleetState) -> Group:
    summary = Table.grid(padding=(0, 2))
    summary.add_row("phase", Text(st.phase, style=_PHASE_STYLE.get(st.phase, "cyan")),
                    "quiesced", _yn(st.quiesced), "pause state", st.pause_state)
    summary.add_row("desired", str(st.desired.weight_version), "applied", str(st.applied.weight_version),
                    "membership epoch", str(st.membership_epoch))
    summary.add_row("converged", _yn(st.applied.converged), "verified", _yn(st.applied.verified),
                    "requests", f"running {st.requests.running}  waiting {st.requests.waiting}  "
                                f"frozen {st.requests.frozen}")
    workers = Table(title=f"{len(st.workers)} workers", title_justify="left")
    for col in ("", "worker", "reachable", "ready", "serving", "paused", "run/wait/frozen", "version", "loras",
                "last result"):
        workers.add_column(col)
    for w in st.workers:
        stale = w.weight_version != st.desired.weight_version and st.desired.weight_version is not None
        bad = not w.reachable or (w.last_result is not None and w.last_result.status in ("error", "timeout"))
        mark = Text("✗", style="red") if bad else (Text("!", style="yellow") if stale or not w.ready else "")
        reqs = f"{w.requests.running}/{w.requests.waiting}/{w.requests.frozen}" if w.requests else "-"
        last = "-"
        if w.last_result is not None:
            last = f"{w.last_result.phase} {w.last_result.status}"
            if w.last_result.message:
                last += f": {w.last_result.message[:60]}"
        elif w.last_error:
            last = w.last_error[:60]
        loras = ", ".join(f"{n}@{v}" if v else n for n, v in w.loras.items()) or "-"
        workers.add_row(mark, w.id, _yn(w.reachable), _yn(w.ready), _yn(w.serving), _yn(w.paused), reqs,
                        Text(str(w.weight_version), style="yellow" if stale else ""), loras,
                        Text(last, style=_STATUS_STYLE.get(w.last_result.status, "") if w.last_result else "dim"))
    return Group(summary, workers)


def operation_table(op: OperationResult) -> Table:
    title = f"{op.kind} {op.id}: {op.status}" + (f" in {op.duration_s:.2f}s" if op.duration_s is not None else "")
    table = Table(title=Text(title, style=_STATUS_STYLE.get(op.status, "")), title_justify="left")
    for col in ("worker", "status", "phase", "duration", "message"):
        table.add_column(col)
    for r in op.results:
        table.add_row(r.worker_id, Text(r.status, style=_STATUS_STYLE.get(r.status, "")), r.phase,
                      f"{r.duration_s:.3f}s", r.message or "")
    return table


def operations_table(ops: list[OperationResult]) -> Table:
    table = Table(title="recent operations", title_justify="left")
    for col in ("id", "kind", "status", "started", "duration", "failed workers"):
        table.add_column(col)
    for op in ops:
        failed = [r.worker_id for r in op.results if r.status in ("error", "timeout")]
        table.add_row(op.id, op.kind, Text(op.status, style=_STATUS_STYLE.get(op.status, "")),
                      op.started_at.strftime("%H:%M:%S"),
                      f"{op.duration_s:.2f}s" if op.duration_s is not None else "-", ", ".join(failed) or "-")
    return table


def workers_table(listing: dict) -> Table:
    table = Table(title=f"namespace {listing.get('namespace')}, epoch {listing.get('membership_epoch')}",
                  title_justify="left")
    for col in ("instance_id", "flavor", "admin_url", "world_size", "version", "ready", "serving"):
        table.add_column(col)
    for w in listing.get("workers", []):
        table.add_row(str(w.get("instance_id")), str(w.get("flavor")), str(w.get("admin_url")),
                      str(w.get("world_size")), str(w.get("weight_version")), _yn(w.get("ready")),
                      _yn(w.get("serving")))
    return table
