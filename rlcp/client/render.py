"""rlctl's tables: FleetState and OperationResult drawn with rich. No I/O here."""

from __future__ import annotations

from typing import Any

from rich.console import Console, Group
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

from rlcp.core.wire.controller import (
    FleetsListing,
    FleetState,
    GatewayWorkerView,
    OperationResult,
    PlacementView,
    WorkerView,
)

_STATUS_STYLE = {
    "ok": "green",
    "skipped": "dim",
    "error": "red",
    "timeout": "red",
    "partial": "yellow",
    "failed": "red",
    "running": "cyan",
    "interrupted": "magenta",
}
_PHASE_STYLE = {"serving": "green", "paused": "yellow", "degraded": "yellow", "failed": "red", "sleeping": "blue"}


def _yn(value: bool | None) -> str:
    return {True: "yes", False: "no", None: "?"}[value]


def _status(
    reachable: bool,
    ready: bool,
    serving: bool,
    paused: bool | None,
    fence: GatewayWorkerView | None,
    cordoned: bool = False,
    held: bool = False,
    sleeping: bool = False,
) -> Text:
    """One word for the worker, and whether the gateway sends it rollouts (`+gw`)."""
    if not reachable:
        word, style = "unreachable", "red"
    elif sleeping:  # before cordoned: a member asleep is also out of the fence
        word, style = "asleep", "blue"
    elif cordoned:
        word, style = "updating", "cyan"
    elif serving:
        word, style = "serving", "green"
    elif paused:
        word, style = ("held" if held else "paused"), "yellow"  # held: by a selector-scoped pause
    else:
        word, style = ("ready" if ready else "not ready"), ("" if ready else "yellow")
    if fence is not None and fence.in_fence:
        word += " +gw" if fence.circuit == "closed" else " +gw ejected"  # ejected: outlier detection
    return Text(word, style=style)


def state_view(st: FleetState) -> Group:
    # Ids and versions are what an operator acts on: never cut them, whatever the terminal's
    # width (rlctl is read in 80 columns too); free text goes below the table, where it wraps.
    workers, notes = _workers_table(st)
    return Group(_summary(st), workers, *notes)


def _summary(st: FleetState) -> Table:
    """The fleet's phase, versions, requests, and its gateway's, Envoys' and update's lines."""
    summary = Table.grid(padding=(0, 2))
    for _ in range(2):
        summary.add_column(style="bold")
        summary.add_column(no_wrap=True)
    summary.add_row(
        "phase",
        Text(st.phase, style=_PHASE_STYLE.get(st.phase, "cyan")),
        "pause state",
        f"{st.pause_state}, quiesced {_yn(st.quiesced)}",
    )
    summary.add_row("desired", str(st.desired.weight_version), "applied", str(st.applied.weight_version))
    summary.add_row("converged", _yn(st.applied.converged), "verified", _yn(st.applied.verified))
    if st.sleeping:
        summary.add_row("asleep", f"{st.sleeping} of {len(st.workers)}", "", "")
    summary.add_row(
        "requests",
        f"run {st.requests.running} wait {st.requests.waiting} frozen {st.requests.frozen}",
        "epoch",
        str(st.membership_epoch),
    )
    _add_data_plane_rows(summary, st)
    u = st.update
    if u is not None:
        p, b = u.progress, u.bubble
        steps = f", wave {min(p.waves_done + (u.status == 'running'), p.waves)}/{p.waves}" if p is not None else ""
        summary.add_row(
            "update",
            f"{u.version} {u.status}{steps}",
            "capacity",
            f"min {b.min_serving}/{b.members}, mean {b.mean_capacity:.0%}" if b is not None else "-",
        )
    return summary


def _add_data_plane_rows(summary: Table, st: FleetState) -> None:
    """The inference gateway's counts, and each Envoy's last ACKed fence version (Envoy as the data plane)."""
    gw = st.gateway
    if gw is not None:
        summary.add_row("gateway", gw.url or "-", "admits", ", ".join(gw.allowed_versions) or "any ready")
        summary.add_row(
            "rollouts",
            f"routed {gw.routed} held {gw.held} rejected {gw.rejected}",
            "staleness",
            str(gw.staleness_bound),
        )
    ev = st.envoy
    if ev is not None:  # Envoy as the data plane: each Envoy's last ACKed fence version
        summary.add_row("envoy fence", ev.fence_version, "xds", ev.xds_url or "-")
        for e in ev.envoys:
            acked = "current" if e.acked_version == ev.fence_version else f"behind ({e.acked_version or 'none'})"
            summary.add_row(
                f"envoy {e.node}",
                acked + ("" if e.connected else ", disconnected") + (", refused last" if e.nacked else ""),
                "",
                "",
            )


def _workers_table(st: FleetState) -> tuple[Table, list[Text]]:
    """A row per worker, and the free-text notes (labels, adapters, what went wrong) below it."""
    gw = st.gateway
    in_fence = {w.worker_id: w for w in gw.workers} if gw is not None else {}
    fleet = "" if st.fleet == "default" else f"fleet {st.fleet}: "
    workers = Table(title=f"{fleet}{len(st.workers)} workers", title_justify="left")
    workers.add_column("", no_wrap=True, min_width=1)
    workers.add_column("worker", no_wrap=True, min_width=max([6, *(len(w.id) for w in st.workers)]))
    workers.add_column("status", no_wrap=True, min_width=11)
    workers.add_column("r/w/f", no_wrap=True)
    workers.add_column("version", no_wrap=True, min_width=max([7, *(len(str(w.weight_version)) for w in st.workers)]))
    notes: list[Text] = []
    for w in st.workers:
        stale = w.weight_version != st.desired.weight_version and st.desired.weight_version is not None
        bad = not w.reachable or (w.last_result is not None and w.last_result.status in ("error", "timeout"))
        mark = Text("✗", style="red") if bad else (Text("!", style="yellow") if stale or not w.ready else "")
        reqs = f"{w.requests.running}/{w.requests.waiting}/{w.requests.frozen}" if w.requests else "-"
        workers.add_row(
            mark,
            w.id,
            _status(w.reachable, w.ready, w.serving, w.paused, in_fence.get(w.id), w.cordoned, w.held, w.sleeping),
            reqs,
            Text(str(w.weight_version), style="yellow" if stale else ""),
        )
        notes += _worker_notes(w, bad)
    return workers, notes


def _worker_notes(w: WorkerView, bad: bool) -> list[Text]:
    notes: list[Text] = []
    if w.labels:  # below the table: labels are free text of any length
        notes.append(Text(f"{w.id}: labels {labels_text(w.labels)}", style="dim"))
    if w.loras:
        notes.append(
            Text(f"{w.id}: adapters " + ", ".join(f"{n}@{v}" if v else n for n, v in w.loras.items()), style="dim")
        )
    if bad or (not w.ready and w.not_ready_reason):
        what = (
            f"{w.last_result.phase} {w.last_result.status}: {w.last_result.message or ''}"
            if w.last_result is not None and w.last_result.status != "ok"
            else (w.not_ready_reason or w.last_error or "")
        )
        notes.append(Text(f"{w.id}: {what}", style="red" if bad else "yellow"))
    return notes


def update_progress(console: Console) -> Progress:
    """The bar `rlctl` follows an update with: waves, and members updated of all."""
    return Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[note]}"),
        TimeElapsedColumn(),
        console=console,
    )


def progress_fields(op: OperationResult) -> dict[str, Any]:
    """One read of a running operation, as the bar's fields."""
    p = op.progress
    if p is None:
        return {"description": f"{op.kind}: {op.status}", "note": ""}
    note = f"{p.failed} failed" if p.failed else ""
    if p.halted:
        note = "halted"
    members = op.bubble.members if op.bubble is not None else None
    wave = min(p.waves_done + 1, p.waves) if op.status == "running" else p.waves_done
    return {
        "description": f"{p.strategy} wave {wave}/{p.waves}",
        "total": members,
        "completed": p.updated + p.failed,
        "note": note,
    }


def bubble_line(op: OperationResult) -> str | None:
    """The bubble of an update, in one line: who served meanwhile."""
    b = op.bubble
    if b is None:
        return None
    return (
        f"bubble: {b.min_serving}/{b.members} serving at least, mean capacity {b.mean_capacity:.0%}, "
        f"{b.worker_seconds_out:.1f} worker-seconds out of service"
    )


def operation_table(op: OperationResult) -> Table:
    title = f"{op.kind} {op.id}: {op.status}" + (f" in {op.duration_s:.2f}s" if op.duration_s is not None else "")
    interrupted = f"interrupted: {op.detail.get('interrupted')}" if op.status == "interrupted" else None
    captions = [line for line in (bubble_line(op), op.progress and op.progress.halted, interrupted) if line]
    table = Table(
        title=Text(title, style=_STATUS_STYLE.get(op.status, "")),
        title_justify="left",
        caption="\n".join(captions) or None,
        caption_justify="left",
    )
    for col in ("worker", "status", "phase", "duration", "message"):
        table.add_column(col)
    for r in op.results:
        table.add_row(
            r.worker_id,
            Text(r.status, style=_STATUS_STYLE.get(r.status, "")),
            r.phase,
            f"{r.duration_s:.3f}s",
            r.message or "",
        )
    return table


def operations_table(ops: list[OperationResult]) -> Table:
    table = Table(title="recent operations", title_justify="left")
    for col in ("id", "kind", "status", "started", "duration", "failed workers"):
        table.add_column(col)
    notes = []
    for op in ops:
        failed = [r.worker_id for r in op.results if r.status in ("error", "timeout")]
        table.add_row(
            op.id,
            op.kind,
            Text(op.status, style=_STATUS_STYLE.get(op.status, "")),
            op.started_at.strftime("%H:%M:%S"),
            f"{op.duration_s:.2f}s" if op.duration_s is not None else "-",
            ", ".join(failed) or "-",
        )
        if op.status == "interrupted":  # what it was doing, and why it has no end
            doing = ", ".join(f"{k} {v}" for k, v in op.detail.items() if k != "interrupted" and v is not None)
            notes.append(f"{op.id} {op.kind}{f' ({doing})' if doing else ''}: {op.detail.get('interrupted', '')}")
    table.caption = "\n".join(notes) or None
    table.caption_justify = "left"
    return table


def workers_table(listing: dict[str, Any]) -> Table:
    table = Table(
        title=f"namespace {listing.get('namespace')}, epoch {listing.get('membership_epoch')}", title_justify="left"
    )
    for col in ("instance_id", "flavor", "admin_url", "world_size", "version", "ready", "serving", "labels"):
        table.add_column(col)
    for w in listing.get("workers", []):
        table.add_row(
            str(w.get("instance_id")),
            str(w.get("flavor")),
            str(w.get("admin_url")),
            str(w.get("world_size")),
            str(w.get("weight_version")),
            _yn(w.get("ready")),
            _yn(w.get("serving")),
            labels_text(w.get("labels") or {}),
        )
    return table


def labels_text(labels: dict[str, str]) -> str:
    """As a selector would name them: `role=policy,zone=a`."""
    return ",".join(f"{k}={v}" for k, v in sorted(labels.items()))


def fleets_table(listing: FleetsListing) -> Table:
    table = Table(title="fleets", title_justify="left")
    for col in ("fleet", "path", "selector", "members", "serving", "phase", "desired", "applied", "models"):
        table.add_column(col)
    for f in listing.fleets:
        applied = f.applied.weight_version or ("mixed" if f.members else "-")
        table.add_row(
            f.name,
            f.path or "/",
            f.selector or "(the rest)",
            str(f.members),
            str(f.serving),
            f.phase,
            f.desired_version or "-",
            applied + ("" if f.applied.converged else " (converging)"),
            ", ".join(f.models) or "-",
        )
    return table


def placement_table(view: PlacementView) -> Table | Text:
    if view.kind == "none":
        return Text("placement: none (this controller places no agents)")
    table = Table(
        title=f"placement {view.kind}: {view.replicas} agents (from the {view.replicas_from}, at most "
        f"{view.max_replicas}); {'leading' if view.leading else 'not leading: the leader places'}",
        title_justify="left",
    )
    for col in ("placed", "groups", "last pass", "took", "error"):
        table.add_column(col)
    table.add_row(
        ", ".join(view.placed) or "-",
        ", ".join(view.groups) or "-",
        view.last_pass_at.strftime("%H:%M:%S") if view.last_pass_at else "never",
        f"{view.last_pass_s:.2f}s" if view.last_pass_s is not None else "-",
        Text(view.last_error, style="red") if view.last_error else "-",
    )
    return table
