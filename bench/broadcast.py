"""`python -m bench.broadcast`: the CPU weight-transfer backend's throughput between two processes.

`rlcp/agent/weight_transfer/cpu_gloo.py` moves weights from a trainer (rank 0) to engines
over gloo (its wire, `gloo_wire.py`): `send_tensors` on rank 0, `receive_tensors` on the others, small tensors
packed into buffers, two broadcasts in flight. Here two processes run both sides
directly (no engine: what is measured is the transfer), against the baseline in the
same run and the same pair of processes: a plain `torch.distributed` gloo group
broadcasting each tensor, in order, into a freshly allocated tensor -- the same bytes,
the obvious way. Two payloads: a few large tensors, and many small ones (a model's
norms, biases and small projections).

Throughput is bytes over the receiver's time from a shared barrier to the last byte
in place; each figure is the median of `--repeats` transfers, the two methods
interleaved so that load from others on the machine hits both alike.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

from bench.common import median, plot, report, table
from rlcp.harness.http import free_port


def payloads(large_count: int, large_mb: float, small_count: int, small_kb: float) -> dict[str, list[tuple[int, ...]]]:
    """Shapes (float32) of each payload."""
    large = int(large_mb * 1e6 / 4)
    # Small tensors vary in size, as a model's do: 1/4x .. 2x of small_kb, mean ~ small_kb.
    sizes = [max(1, int(small_kb * 1e3 / 4 * f)) for f in (0.25, 0.5, 1.0, 2.0, 1.25)]
    return {"large": [(large,)] * large_count, "small": [(sizes[i % len(sizes)],) for i in range(small_count)]}


def _rank_main(
    rank: int,
    ports: tuple[int, int],
    shapes: dict[str, list[tuple[int, ...]]],
    repeats: int,
    buffer_bytes: int,
    results: Any,
) -> None:
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    import torch
    import torch.distributed as dist
    from vllm.distributed.weight_transfer.base import ParamMeta

    from rlcp.agent.weight_transfer.gloo_wire import GlooGroup, receive_tensors, send_tensors

    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{ports[0]}", rank=rank, world_size=2, timeout=timedelta(seconds=120)
    )
    ours = GlooGroup(master_address="127.0.0.1", master_port=ports[1], rank=rank, world_size=2, timeout_s=120)
    out: dict[str, Any] = {}
    for name, shape_list in shapes.items():
        metas = [ParamMeta(f"t{i}", torch.float32, s) for i, s in enumerate(shape_list)]
        tensors = [torch.randn(s) for s in shape_list] if rank == 0 else []
        nbytes = sum(m.shape[0] * 4 for m in metas)
        checksum_sent = float(sum(t.sum().item() for t in tensors)) if rank == 0 else None
        times: dict[str, list[float]] = {"plain": [], "ours": []}
        for rep in range(repeats + 1):  # the first round warms up both
            for method in ("plain", "ours"):
                received: list[torch.Tensor] = []
                dist.barrier()
                t0 = time.perf_counter()
                if method == "plain":
                    for m, t in zip(metas, tensors or [None] * len(metas)):
                        buf = t if rank == 0 else torch.empty(m.shape, dtype=m.dtype)
                        dist.broadcast(buf, src=0)
                        received.append(buf)
                elif rank == 0:
                    send_tensors(ours, iter((m.name, t) for m, t in zip(metas, tensors)), metas, buffer_bytes)
                else:
                    receive_tensors(ours, metas, buffer_bytes, lambda pairs: received.extend(t for _, t in pairs))
                elapsed = time.perf_counter() - t0
                if rank == 1 and rep == 0:  # the bytes arrived intact, once per method
                    out.setdefault(f"{name}_received_sum", {})[method] = float(sum(t.sum().item() for t in received))
                if rep > 0:
                    times[method].append(elapsed)
        out[name] = {"bytes": nbytes, "tensors": len(metas), "times_s": times, "checksum_sent": checksum_sent}
    dist.barrier()
    ours.close()
    dist.destroy_process_group()
    results.put((rank, out))


def run(shapes: dict[str, list[tuple[int, ...]]], repeats: int, buffer_bytes: int) -> dict[str, Any]:
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    ports = (free_port(), free_port())
    procs = [
        ctx.Process(target=_rank_main, args=(r, ports, shapes, repeats, buffer_bytes, results), daemon=True)
        for r in (0, 1)
    ]
    for p in procs:
        p.start()
    got: dict[int, dict[str, Any]] = {}
    deadline = time.monotonic() + 600
    while len(got) < 2:
        if time.monotonic() > deadline or any(p.exitcode not in (None, 0) for p in procs):
            for p in procs:
                p.kill()
            raise RuntimeError(f"a rank failed: exit codes {[p.exitcode for p in procs]}")
        try:
            rank, out = results.get(timeout=1)
            got[rank] = out
        except Exception:
            continue
    for p in procs:
        p.join(timeout=30)
    sender, receiver = got[0], got[1]
    rows = []
    for name in shapes:
        r = receiver[name]
        sums = receiver[f"{name}_received_sum"]
        sent = sender[name]["checksum_sent"]
        for method, s in sums.items():
            if abs(s - sent) > 1e-3 * max(1.0, abs(sent)):
                raise RuntimeError(f"{name}/{method}: received sum {s} != sent {sent}")
        plain, ours = median(r["times_s"]["plain"]), median(r["times_s"]["ours"])
        rows.append(
            {
                "payload": name,
                "tensors": r["tensors"],
                "bytes": r["bytes"],
                "times_s": r["times_s"],
                "plain_mb_s": r["bytes"] / plain / 1e6,
                "ours_mb_s": r["bytes"] / ours / 1e6,
                "ratio_ours_vs_plain": plain / ours,
            }
        )
    return {"rows": rows}


def render(rows: list[dict[str, Any]]) -> str:
    return table(
        ["payload", "tensors", "MB", "plain gloo MB/s", "cpu_gloo MB/s", "cpu_gloo / plain"],
        [
            [r["payload"], r["tensors"], r["bytes"] / 1e6, r["plain_mb_s"], r["ours_mb_s"], r["ratio_ours_vs_plain"]]
            for r in rows
        ],
    )


def draw(rows: list[dict[str, Any]], out_dir: Path) -> Path:
    def d(ax: Any) -> None:
        x = range(len(rows))
        ax.bar([i - 0.2 for i in x], [r["plain_mb_s"] for r in rows], 0.4, label="plain torch.distributed gloo")
        ax.bar([i + 0.2 for i in x], [r["ours_mb_s"] for r in rows], 0.4, label="cpu_gloo send/receive_tensors")
        ax.set_xticks(list(x), [f"{r['tensors']} x {r['bytes'] / r['tensors'] / 1e6:.2g} MB" for r in rows])
        ax.set_ylabel("MB/s (median)")
        ax.set_title("CPU broadcast, 2 processes on loopback")
        ax.legend(fontsize=8)

    return plot("broadcast", d, out_dir)


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--large-count", type=int, default=4)
    p.add_argument("--large-mb", type=float, default=52.0)
    p.add_argument("--small-count", type=int, default=1203)
    p.add_argument("--small-kb", type=float, default=64.0, help="mean size of a small tensor")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--buffer-mb", type=float, default=4 * 1.048576, help="cpu_gloo's packing buffer (default 4 MiB)")
    p.add_argument("--out", type=Path, default=None, help="output folder (default bench/out)")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    a = parse(argv)
    shapes = payloads(a.large_count, a.large_mb, a.small_count, a.small_kb)
    result = run(shapes, a.repeats, int(a.buffer_mb * 1e6))
    result["params"] = {k: v for k, v in vars(a).items() if k != "out"}
    return report("broadcast", result, a.out, text=render(result["rows"]), draw=lambda out: draw(result["rows"], out))


if __name__ == "__main__":
    main()
