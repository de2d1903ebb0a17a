"""Build an image with scripts/build-images.sh and run it as the chart's pods run it, with no
container engine: the image's own root filesystem (buildah mounts it), read-only, as the image's
user, with its environment, entrypoint and working directory, an "emptyDir" on /tmp and files
bound where the chart mounts its ConfigMap and Secrets.

The run is a mount namespace (`unshare --mount`) in which the root filesystem is bound onto itself
and remounted read-only, /dev and /sys are bound from the host (/sys read-only), /dev/shm is a
tmpfs, /proc is mounted, then `chroot --userspec` starts the command as the image's user. The
network is the host's: the tests use loopback addresses only. The process is the command itself
(every step `exec`s), so a signal sent to it reaches the program, as the kubelet's would.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
BUILD_TIMEOUT_S = 1800.0


def require_image_tools() -> None:
    """Skip where images cannot be built: buildah's chroot isolation and the mounts need root,
    and the scripts install buildah and mmdebstrap with apt-get when they are missing."""
    if os.geteuid() != 0:
        pytest.skip("building and running images needs root (buildah, mount namespaces, chroot)")
    if not shutil.which("unshare") or not shutil.which("chroot"):
        pytest.skip("needs unshare (util-linux) and chroot (coreutils)")
    if not shutil.which("buildah") and not shutil.which("apt-get"):
        pytest.skip("needs buildah, or apt-get to install it")


@dataclass(frozen=True)
class BuiltImage:
    target: str
    name: str
    size_bytes: int
    build_seconds: float
    config: dict[str, Any]  # the OCI image config: User, Env, Entrypoint, Cmd, WorkingDir, ...

    @property
    def size_mb(self) -> float:
        return self.size_bytes / 1e6


def buildah(*args: str, timeout_s: float = 120.0) -> str:
    """buildah on the store scripts/build-images.sh builds into (scripts/image-base.sh)."""
    cmd = f"source scripts/image-base.sh && rlcp_buildah {shlex.join(args)}"
    done = subprocess.run(["bash", "-c", cmd], cwd=REPO, capture_output=True, text=True, timeout=timeout_s)
    if done.returncode != 0:
        raise RuntimeError(f"buildah {' '.join(args)}: {done.stderr.strip()}")
    return done.stdout.strip()


def build_image(target: str, workdir: Path, *extra_args: str, timeout_s: float = BUILD_TIMEOUT_S) -> BuiltImage:
    """`scripts/build-images.sh --local-base --host-pip <target>`: on a base made here (no
    registry is reachable), with this machine's pip sources."""
    workdir.mkdir(parents=True, exist_ok=True)
    report, log = workdir / f"{target}-build.jsonl", workdir / f"{target}-build.log"
    report.unlink(missing_ok=True)
    with log.open("w") as out:
        done = subprocess.run(
            [
                "bash",
                "scripts/build-images.sh",
                "--local-base",
                "--host-pip",
                "--report",
                str(report),
                *extra_args,
                target,
            ],
            cwd=REPO,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            timeout=timeout_s,
        )
    if done.returncode != 0:
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-60:])
        raise AssertionError(f"scripts/build-images.sh {target} failed ({done.returncode}):\n{tail}")
    entry = json.loads(report.read_text().splitlines()[-1])
    inspected = json.loads(buildah("inspect", "--type", "image", entry["name"]))
    return BuiltImage(
        target=target,
        name=entry["name"],
        size_bytes=entry["size_bytes"],
        build_seconds=entry["build_seconds"],
        config=inspected["OCIv1"]["config"],
    )


def resolve_in_root(root: Path, path: str) -> Path:
    """Where `path` lands inside `root`, following symlinks as the chrooted process would (an
    absolute link such as /var/run -> /run stays inside `root`, never on the host)."""
    parts = [p for p in path.split("/") if p]
    current, hops = root, 0
    while parts:
        part = parts.pop(0)
        if part in (".", ""):
            continue
        if part == "..":
            current = current.parent if current != root else root
            continue
        candidate = current / part
        if candidate.is_symlink():
            hops += 1
            if hops > 40:
                raise RuntimeError(f"too many symlinks resolving {path} in {root}")
            target = os.readlink(candidate)
            if target.startswith("/"):
                current = root
            parts = [p for p in target.split("/") if p] + parts
            continue
        current = candidate
    return current


@dataclass(frozen=True)
class Bind:
    """A host directory bound into the container, like a pod's volume mount."""

    source: Path
    target: str
    read_only: bool = True


@dataclass
class Sandboxed:
    """One process running from an image's root filesystem."""

    proc: subprocess.Popen
    log_path: Path

    @property
    def pid(self) -> int:
        return self.proc.pid

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def log_tail(self, n: int = 60) -> str:
        return "\n".join(self.log().splitlines()[-n:])

    def wait_for_file(self, path: Path, timeout_s: float, what: str) -> None:
        deadline = time.monotonic() + timeout_s
        while not path.exists():
            if self.proc.poll() is not None:
                raise AssertionError(f"{what} exited with {self.proc.returncode}:\n{self.log_tail()}")
            if time.monotonic() > deadline:
                raise AssertionError(f"{what} not up within {timeout_s} s:\n{self.log_tail()}")
            time.sleep(0.1)

    def terminate(self, timeout_s: float) -> int:
        """SIGTERM, as the kubelet sends it; the exit code, or an AssertionError past the deadline."""
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError(f"still running {timeout_s} s after SIGTERM:\n{self.log_tail()}") from None

    def kill(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=10)


# The mounts, then the command as the image's user. $1 is the root filesystem, $2 a count of
# bind triples (source, target inside the root, ro|rw), then the triples, then chroot's arguments.
_SANDBOX_SH = r"""
set -eu
root=$1; nbinds=$2; shift 2
mount --bind "$root" "$root"
mount --bind /dev "$root/dev"
mount -t tmpfs -o mode=1777,nosuid,nodev shm "$root/dev/shm"
mount -t proc -o nosuid,nodev,noexec proc "$root/proc"
mount --bind /sys "$root/sys"
mount -o remount,bind,ro,nosuid,nodev,noexec "$root/sys"
while [ "$nbinds" -gt 0 ]; do
  mount --bind "$1" "$2"
  if [ "$3" = ro ]; then mount -o remount,bind,ro,nosuid,nodev "$2"; fi
  shift 3; nbinds=$((nbinds - 1))
done
mount -o remount,bind,ro "$root"
exec chroot "$@"
"""


@contextmanager
def image_rootfs(image: str) -> Iterator[Path]:
    """A throwaway container of `image`, its root filesystem mounted on the host."""
    container = buildah("from", "--pull=never", image)
    try:
        yield Path(buildah("mount", container))
    finally:
        buildah("rm", container)


def _user(config: dict[str, Any]) -> tuple[str, str]:
    user = config.get("User") or "0:0"
    uid, _, gid = user.partition(":")
    return uid, gid or uid


def start_in_image(
    root: Path,
    config: dict[str, Any],
    args: list[str],
    *,
    binds: list[Bind],
    log_path: Path,
    env: dict[str, str] | None = None,
    entrypoint: list[str] | None = None,
) -> Sandboxed:
    """Run the image's entrypoint (or `entrypoint`) with `args` from the mounted root filesystem
    `root`: read-only, as the image's user, in its working directory, with its environment plus
    `env`. Nothing is written into the image: mount points are made before the root turns
    read-only, in the throwaway container."""
    uid, gid = _user(config)
    if not uid.isdigit() or not gid.isdigit():
        raise AssertionError(f"the image's User must be numeric (the chart's runAsUser), not {config.get('User')!r}")
    triples: list[str] = []
    for bind in binds:
        target = resolve_in_root(root, bind.target)
        target.mkdir(parents=True, exist_ok=True)
        triples += [str(bind.source), str(target), "ro" if bind.read_only else "rw"]
    image_env = dict(e.split("=", 1) for e in config.get("Env") or [])
    command = (entrypoint if entrypoint is not None else list(config.get("Entrypoint") or [])) + args
    workdir = config.get("WorkingDir") or "/"
    chroot_args = [
        f"--userspec={uid}:{gid}",
        f"--groups={gid}",
        str(root),
        "/usr/bin/env",
        "-i",
        *(f"{k}={v}" for k, v in {**image_env, **(env or {})}.items()),
        "/bin/sh",
        "-c",
        'cd "$1" && shift && exec "$@"',
        "sh",
        workdir,
        *command,
    ]
    argv = [
        "unshare",
        "--mount",
        "--propagation",
        "private",
        "/bin/sh",
        "-c",
        _SANDBOX_SH,
        "sandbox",
        str(root),
        str(len(binds)),
        *triples,
        *chroot_args,
    ]
    with log_path.open("ab") as log:
        proc = subprocess.Popen(
            argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True
        )
    return Sandboxed(proc=proc, log_path=log_path)


def run_in_image(
    root: Path,
    config: dict[str, Any],
    command: list[str],
    *,
    binds: list[Bind],
    log_path: Path,
    timeout_s: float = 60.0,
) -> tuple[int, str]:
    """Run `command` to completion the same way; its exit code and output."""
    log_path.unlink(missing_ok=True)
    run = start_in_image(root, config, [], binds=binds, log_path=log_path, entrypoint=command)
    try:
        code = run.proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        run.kill()
        raise AssertionError(f"{command} did not finish within {timeout_s} s:\n{run.log_tail()}") from None
    return code, run.log()


def emptydir(path: Path, owner: tuple[int, int]) -> Path:
    """A writable directory for the image's user, like a pod's emptyDir."""
    path.mkdir(parents=True, exist_ok=True)
    os.chown(path, *owner)
    path.chmod(0o755)
    return path


def http_get(url: str, timeout_s: float = 5.0) -> tuple[int, Any]:
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as resp:
            return resp.status, json.loads(resp.read() or b"null")
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"null")


def http_post(url: str, body: dict[str, Any], timeout_s: float = 30.0, token: str | None = None) -> tuple[int, Any]:
    headers = {"Content-Type": "application/json"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers=headers, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as resp:
            return resp.status, json.loads(resp.read() or b"null")
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"null")


def wait_for_status(url: str, want: int, timeout_s: float, run: Sandboxed | None = None) -> Any:
    """Poll `url` until it answers `want`; its body. Fails at the deadline or when `run` exits."""
    deadline, last = time.monotonic() + timeout_s, None
    while time.monotonic() < deadline:
        if run is not None and run.proc.poll() is not None:
            raise AssertionError(f"exited with {run.proc.returncode} while waiting for {url}:\n{run.log_tail()}")
        try:
            status, body = http_get(url)
            if status == want:
                return body
            last = (status, body)
        except (OSError, ValueError) as exc:
            last = exc
        time.sleep(0.2)
    raise AssertionError(
        f"{url} did not answer {want} within {timeout_s} s (last: {last})" + (f"\n{run.log_tail()}" if run else "")
    )


@dataclass
class HostAgents:
    """SimEngine agents (`python -m rlcp.agent`) on this machine's venv, on loopback ports they pick."""

    workdir: Path
    token: str
    procs: list[subprocess.Popen] = field(default_factory=list)
    ports: list[dict[str, int]] = field(default_factory=list)

    def start(self, count: int, python: str, timeout_s: float = 60.0) -> HostAgents:
        files = []
        for i in range(count):
            config = {
                "agent_id": f"sim-{i}",
                "log_format": "json",
                "admin": {"host": "127.0.0.1", "port": 0},
                "inference": {"host": "127.0.0.1", "port": 0},
                "engine": {"kind": "sim", "model": "tiny"},
            }
            path, ports = self.workdir / f"agent-{i}.yaml", self.workdir / f"agent-{i}.ports.json"
            path.write_text(yaml.safe_dump(config))
            ports.unlink(missing_ok=True)
            with (self.workdir / f"agent-{i}.log").open("ab") as log:
                self.procs.append(
                    subprocess.Popen(
                        [python, "-m", "rlcp.agent", "--config", str(path), "--ports-file", str(ports)],
                        cwd=REPO,
                        env={**os.environ, "RLAGENT_ADMIN__TOKEN": self.token},
                        stdout=log,
                        stderr=subprocess.STDOUT,
                        stdin=subprocess.DEVNULL,
                        start_new_session=True,
                    )
                )
            files.append(ports)
        deadline = time.monotonic() + timeout_s
        for i, ports in enumerate(files):
            while not ports.exists():
                if self.procs[i].poll() is not None or time.monotonic() > deadline:
                    log = (self.workdir / f"agent-{i}.log").read_text(errors="replace")
                    raise AssertionError(f"sim agent {i} did not start:\n{log[-3000:]}")
                time.sleep(0.05)
            self.ports.append(json.loads(ports.read_text()))
        return self

    def stop(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in self.procs:
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=10)
