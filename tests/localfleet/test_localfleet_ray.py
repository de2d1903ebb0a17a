"""`python -m rlcp.localfleet --sim --ray`: the local fleet on a local Ray head (loopback only),
its agents placed by the controller as actors (placement.kind ray) and found through the
dashboard (discovery.kind ray). Run as a user runs it; every Ray process is gone afterwards."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest

from rlcp.harness.processes import REPO, run_to_end

pytestmark = [pytest.mark.ray, pytest.mark.timeout(240), pytest.mark.xdist_group("ray")]


def _processes_naming(marker: str) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if marker.encode() in (entry / "cmdline").read_bytes():
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


def test_two_steps_on_a_placed_sim_fleet(tmp_path: Path) -> None:
    run = run_to_end(
        [
            sys.executable,
            "-m",
            "rlcp.localfleet",
            "--sim",
            "--ray",
            "--agents",
            "2",
            "--steps",
            "2",
            "--port",
            "0",
            "--gateway-port",
            "0",
            "--workdir",
            str(tmp_path),
        ],
        cwd=REPO,
        timeout_s=200,
    )
    out = run.stdout
    assert run.returncode == 0, out
    for k in (1, 2):
        assert re.search(rf"^step {k}/2 +ok .*applied=step-{k} +converged=yes +verified=yes", out, re.M), out
    last_step = out[out.index("step 2/2") :]
    assert re.findall(r"^ +(rlcp-agent-\d) +version=step-2 +ready=yes +paused=no", last_step, re.M) == [
        "rlcp-agent-0",
        "rlcp-agent-1",
    ], out
    assert "summary: 2/2 steps ok" in out
    files = re.search(r"files (\S+?);", out)
    assert files, out
    assert _processes_naming(files.group(1)) == [], "every Ray process stopped"
    assert sorted(json.loads((tmp_path / "pids.json").read_text())) == ["controller"]
