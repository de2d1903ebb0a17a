"""What a run shows: one line per step, a JSONL log, and the reward plotted against step and time."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path

from rlcp.rl.loop import MISMATCH_TOLERANCE, StepRecord


def step_line(r: StepRecord, steps: int) -> str:
    """`step 3/20  reward 0.031  |Δlogprob| mean 2e-06 max 2e-05 (512 tok)  versions step-2=512  ...`"""
    if r.mismatch_max is None:
        mismatch = "|Δlogprob| -"
    else:
        flag = "" if r.mismatch_max <= MISMATCH_TOLERANCE else "  MISMATCH"
        mismatch = f"|Δlogprob| mean {r.mismatch_mean:.1e} max {r.mismatch_max:.1e} ({r.compared} tok){flag}"
    versions = " ".join(f"{v}={n}" for v, n in sorted(r.versions.items()))
    pushed = (
        ""
        if r.pushed is None
        else f"  pushed {r.pushed}"
        if r.sync_error is None
        else f"  push of {r.pushed} FAILED: {r.sync_error[:300]}"
    )
    stale = f"  off-policy {r.off_policy} dropped {r.dropped}" if r.off_policy or r.dropped else ""
    if r.foreign:
        stale += f"  FOREIGN {r.foreign} (weights never pushed)"
    members = ""
    if len(r.mismatch_by_worker) > 1 or r.membership or r.reforms:
        members = "\n    max |Δlogprob| by member: " + " ".join(
            f"{w}={d:.1e}" for w, d in sorted(r.mismatch_by_worker.items())
        )
    if r.reforms:
        members += f"  push re-formed the group {r.reforms}x"
    if r.membership:
        members += "  membership: " + "; ".join(r.membership)
    return (
        f"step {r.step}/{steps}  reward {r.reward:.3f}  {mismatch}  versions {versions}{stale}  "
        f"sample {r.sample_s:.2f}s train {r.train_s:.2f}s sync {r.sync_s:.2f}s{pushed}{members}"
    )


def write_jsonl(records: Sequence[StepRecord], path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r.as_json(), sort_keys=True) + "\n" for r in records))
    return path


def read_jsonl(path: Path) -> list[StepRecord]:
    return [StepRecord(**json.loads(line)) for line in path.read_text().splitlines() if line.strip()]


def plot_runs(runs: Mapping[str, Sequence[StepRecord]], path: Path, title: str = "Reward through the fleet") -> Path:
    """The reward of each run against step (left) and wall-clock seconds (right), as a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (by_step, by_time) = plt.subplots(1, 2, figsize=(10, 3.8), sharey=True)
    for label, records in runs.items():
        by_step.plot([r.step for r in records], [r.reward for r in records], marker=".", label=label)
        by_time.plot([r.wall_s for r in records], [r.reward for r in records], marker=".", label=label)
        # Membership changes, drawn where they landed: in the step (left) and at its end (right).
        for r in records:
            if not r.membership:
                continue
            text = "\n".join(c.split(" (+")[0] for c in r.membership)
            for ax, x in ((by_step, r.step), (by_time, r.wall_s)):
                ax.axvline(x, color="grey", linestyle="--", linewidth=0.8)
                ax.text(x, 0.98, text, rotation=90, va="top", ha="right", fontsize=7, color="dimgrey")
    by_step.set_xlabel("step")
    by_time.set_xlabel("wall-clock (s)")
    by_step.set_ylabel("reward (share of target tokens)")
    for ax in (by_step, by_time):
        ax.grid(alpha=0.3)
        ax.set_ylim(-0.02, 1.02)
    by_step.legend(loc="lower right", fontsize=8)
    fig.suptitle(title)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
