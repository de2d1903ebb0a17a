"""The controller image (images/controller.Containerfile), built with buildah and run with no
container engine, as the chart runs it.

The build is `scripts/build-images.sh --local-base controller`: the Containerfile users build,
handed a Debian base made on this machine (scripts/image-base.sh), since no registry is
reachable. The run (tests/images/support.py) starts the image's entrypoint from the image's own
root filesystem, read-only, as its user (10001), with the chart's mounts: the config file and the
two tokens read-only, a writable /tmp. The controller serves /healthz and /readyz over a static
fleet of SimEngine agents running on this machine, and exits cleanly on SIGTERM.

Select with `-m images`. The first run on a machine installs buildah and mmdebstrap (apt) and
makes the base's root filesystem (about 30 s), cached in /var/cache/rlcp-images.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest
import yaml

from tests.images.support import (
    REPO,
    Bind,
    BuiltImage,
    HostAgents,
    build_image,
    emptydir,
    http_get,
    image_rootfs,
    require_image_tools,
    run_in_image,
    start_in_image,
    wait_for_status,
)

# One xdist worker takes the module (the full run's `--dist loadgroup`): its image is built once,
# not once per worker, and two buildah builds never share the machine.
pytestmark = [pytest.mark.images, pytest.mark.timeout(1200), pytest.mark.xdist_group("images")]

CHART = REPO / "charts" / "rl-controlplane"
# The chart's paths (templates/_helpers.tpl: rlcp.configDir, rlcp.tokenDir).
CONFIG_DIR = "/etc/rl-controlplane"
TOKEN_DIR = "/var/run/secrets/rl-controlplane"
UID = GID = 10001
# python:3.11-slim-bookworm is about 130 MB of it; see docs/chart.md ("Images") for the rest.
MAX_SIZE_MB = 320


@pytest.fixture(scope="module")
def controller_image(tmp_path_factory: pytest.TempPathFactory) -> BuiltImage:
    require_image_tools()
    image = build_image("controller", tmp_path_factory.mktemp("controller-image"))
    print(f"\ncontroller image {image.name}: {image.size_mb:.0f} MB, built in {image.build_seconds:.0f} s")
    return image


def test_names_are_the_charts_defaults(controller_image: BuiltImage) -> None:
    import tomllib

    values = yaml.safe_load((CHART / "values.yaml").read_text())
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    version = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    assert chart["appVersion"] == version, "the chart's default tag is its appVersion: keep it pyproject's version"
    assert values["image"]["tag"] == ""  # the appVersion
    assert controller_image.name == f"{values['image']['repository']}:{version}"
    prefix = values["image"]["repository"].rsplit("/", 1)[0]
    assert values["agents"]["image"]["repository"] == f"{prefix}/rl-agent"  # agent-gpu: <prefix>/rl-agent:<version>

    release = yaml.safe_load((REPO / ".github" / "workflows" / "release.yml").read_text())
    on = release.get("on", release.get(True))  # YAML 1.1 reads a bare `on` key as True
    assert any(t.startswith("v") for t in on["push"]["tags"])
    text = (REPO / ".github" / "workflows" / "release.yml").read_text()
    for containerfile in (
        "images/controller.Containerfile",
        "images/agent.Containerfile",
        "images/agent-cpu.Containerfile",
    ):
        assert containerfile in text and (REPO / containerfile).is_file()


def test_image_is_small_non_root_and_has_no_engine(controller_image: BuiltImage, tmp_path: Path) -> None:
    config = controller_image.config
    assert config["User"] == f"{UID}:{GID}"
    assert config["Entrypoint"] == ["rl-controlplane"]
    assert config["Cmd"] == ["--config", f"{CONFIG_DIR}/config.yaml"]
    assert controller_image.size_mb < MAX_SIZE_MB, f"{controller_image.size_mb:.0f} MB"
    with image_rootfs(controller_image.name) as root:
        code, out = run_in_image(
            root,
            config,
            [
                "python3",
                "-c",
                "import importlib.util as u, os; "
                "print('uid', os.getuid(), os.getgid()); "
                "print('engine', [m for m in ('torch', 'vllm', 'transformers') if u.find_spec(m)]); "
                "print('missing', [m for m in ('rlcp.controlplane', 'rlcp.client', 'rlcp.core') "
                "if not u.find_spec(m)])",
            ],
            binds=[Bind(emptydir(tmp_path / "tmp", (UID, GID)), "/tmp", read_only=False)],
            log_path=tmp_path / "probe.log",
        )
    assert code == 0, out
    assert f"uid {UID} {GID}" in out
    assert "engine []" in out, out  # no torch, no vLLM
    assert "missing []" in out, out


def test_root_filesystem_is_read_only_and_tmp_is_writable(controller_image: BuiltImage, tmp_path: Path) -> None:
    """The harness's own check: what the controller test below runs under is really read-only."""
    tmp = emptydir(tmp_path / "tmp", (UID, GID))
    with image_rootfs(controller_image.name) as root:
        code, out = run_in_image(
            root,
            controller_image.config,
            ["/bin/sh", "-c", "touch /probe; touch /opt/probe; touch /tmp/probe && echo tmp-ok"],
            binds=[Bind(tmp, "/tmp", read_only=False)],
            log_path=tmp_path / "probe.log",
        )
    assert code == 0, out
    assert out.count("Read-only file system") == 2, out
    assert "tmp-ok" in out and (tmp / "probe").exists()


def test_controller_serves_a_static_fleet_from_a_read_only_root_and_stops_on_sigterm(
    controller_image: BuiltImage, tmp_path: Path
) -> None:
    agents = HostAgents(tmp_path / "agents", token="workers-secret")
    agents.workdir.mkdir()
    agents.start(2, sys.executable)
    try:
        config_dir, api_dir, workers_dir = (tmp_path / "config", tmp_path / "api-token", tmp_path / "workers-token")
        for d in (config_dir, api_dir, workers_dir):
            d.mkdir()
        (api_dir / "token").write_text("api-secret")
        (workers_dir / "token").write_text(agents.token)
        # The chart's shape (templates/configmap.yaml), with static discovery and the memory store.
        (config_dir / "config.yaml").write_text(
            yaml.safe_dump(
                {
                    "controller_id": "image-smoke",
                    "api": {"host": "127.0.0.1", "port": 0, "token_file": f"{TOKEN_DIR}/api/token"},
                    "workers": {"token_file": f"{TOKEN_DIR}/workers/token", "timeout_s": 5},
                    "discovery": {
                        "kind": "static",
                        "static": [
                            {
                                "id": f"sim-{i}",
                                "admin_url": f"http://127.0.0.1:{p['admin_port']}",
                                "inference_url": f"http://127.0.0.1:{p['inference_port']}",
                                "flavor": "agent",
                            }
                            for i, p in enumerate(agents.ports)
                        ],
                    },
                    "store": {"kind": "memory"},
                    "reconcile": {"interval_s": 1, "poll_interval_s": 1},
                    "log_format": "json",
                }
            )
        )
        tmp = emptydir(tmp_path / "tmp", (UID, GID))
        binds = [
            Bind(config_dir, CONFIG_DIR),
            Bind(api_dir, f"{TOKEN_DIR}/api"),
            Bind(workers_dir, f"{TOKEN_DIR}/workers"),
            Bind(tmp, "/tmp", read_only=False),
        ]

        with image_rootfs(controller_image.name) as root:
            before = _tree(root)
            started = time.monotonic()
            run = start_in_image(
                root,
                controller_image.config,
                ["--config", f"{CONFIG_DIR}/config.yaml", "--port-file", "/tmp/api.port"],
                binds=binds,
                log_path=tmp_path / "controller.log",
            )
            try:
                run.wait_for_file(tmp / "api.port", 60, "the controller")
                up_s = time.monotonic() - started
                url = f"http://127.0.0.1:{int((tmp / 'api.port').read_text())}"
                assert _uids(run.pid) == {str(UID)}, "the controller must run as the image's user"
                assert http_get(f"{url}/healthz") == (200, {"status": "ok"})
                ready = wait_for_status(f"{url}/readyz", 200, 30, run)
                assert ready["status"] == "ready"
                # It reached both agents from inside the image: they report their state to it.
                state = wait_for_status(f"{url}/v1/rl/state", 200, 10, run)
                text = str(state)
                assert "sim-0" in text and "sim-1" in text, state

                stop_started = time.monotonic()
                code = run.terminate(timeout_s=15)
                stop_s = time.monotonic() - stop_started
            finally:
                run.kill()
            after = _tree(root)
        log = run.log()
        assert code == 0, f"exit code {code} after SIGTERM:\n{run.log_tail()}"
        assert "Traceback" not in log, log
        assert "controller_ready" in log
        # Nothing changed in the image's filesystem but the mount points made before the run.
        assert after == before
        print(
            f"\ncontroller in the image: serving in {up_s:.1f} s, stopped in {stop_s:.1f} s after SIGTERM; "
            f"wrote to /tmp: {sorted(p.name for p in tmp.iterdir())}"
        )
    finally:
        agents.stop()


def _uids(pid: int) -> set[str]:
    """Real, effective, saved and filesystem uids of a process."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("Uid:"):
            return set(line.split()[1:])
    raise AssertionError(f"no Uid line for {pid}")


def _tree(root: Path) -> dict[str, tuple[int, float]]:
    """Size and mtime of every file under the image's /etc, /opt and /var (a change shows).
    Symlinks are not followed: /var/run -> /run would lead out of the image."""
    seen = {}
    for top in ("etc", "opt", "var"):
        for directory, _, files in os.walk(root / top, followlinks=False):
            for name in files:
                path = Path(directory) / name
                st = path.lstat()
                seen[str(path.relative_to(root))] = (st.st_size, st.st_mtime)
    return seen
