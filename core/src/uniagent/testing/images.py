"""Container images built offline for tests and benchmarks of the ``local`` backend.

No registry is reachable on our machines, so images are made from a Debian
root file system (``debootstrap --variant=minbase``), swe-rex installed from
wheels that pip downloads on the host, optional extra directories copied in
(a repository at ``/testbed``, as in SWE-bench images), then imported with
``<engine> import`` (a few minutes the first time; the engine caches it).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from uniagent.cache import named_lock

MIRROR = os.environ.get("UNIAGENT_DEBIAN_MIRROR", "http://deb.debian.org/debian")


def run(argv: Sequence[str], timeout: float = 900, **kwargs: Any) -> subprocess.CompletedProcess:
    """``subprocess.run`` with captured text output."""
    return subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout, **kwargs)


def container_engine() -> tuple[str | None, str]:
    """The engine that runs containers here (docker, else podman), or None and why not."""
    reasons = []
    if shutil.which("docker"):
        probe = run(["docker", "info"], timeout=30)
        if probe.returncode == 0:
            return "docker", ""
        reasons.append(f"docker's daemon does not answer: {probe.stderr.strip()[-200:]}")
    else:
        reasons.append("docker is not installed")
    if not shutil.which("podman"):
        reasons.append("podman is not installed (apt-get install podman runc)")
        return None, "; ".join(reasons)
    probe = run(["podman", "info"], timeout=60)
    if probe.returncode != 0:
        reasons.append(f"`podman info` failed: {probe.stderr.strip()[-300:]}")
        return None, "; ".join(reasons)
    return "podman", ""


def image_exists(engine: str, tag: str) -> bool:
    """Whether ``engine`` has ``tag``."""
    return run([engine, "image", "inspect", tag], timeout=60).returncode == 0


def build_image(
    engine: str,
    tag: str,
    *,
    packages: Sequence[str] = ("python3", "python3-venv"),
    copy: Mapping[str, str | Path] | None = None,
    setup: str = "",
) -> None:
    """Build ``tag``: Debian bookworm minbase with ``packages``, ``swerex-remote`` on PATH.

    ``copy`` maps paths inside the image to host directories copied there;
    ``setup`` is a shell command run in the root file system at the end.
    """
    if shutil.which("debootstrap") is None:
        raise RuntimeError("debootstrap is not installed (apt-get install debootstrap)")
    with tempfile.TemporaryDirectory(prefix="uniagent-rootfs-", dir="/var/tmp") as tmp:
        root = Path(tmp) / "rootfs"
        steps = [
            ["debootstrap", "--variant=minbase", f"--include={','.join(packages)}",
             "bookworm", str(root), MIRROR],
            [sys.executable, "-m", "pip", "download", "-q", "-d", str(root / "tmp" / "wheels"),
             "swe-rex==1.4.0"],
            ["chroot", str(root), "/bin/sh", "-c",
             "python3 -m venv /opt/swerex && /opt/swerex/bin/pip install -q --no-index "
             "--find-links /tmp/wheels swe-rex==1.4.0 && rm -rf /tmp/wheels && "
             "ln -sf /opt/swerex/bin/swerex-remote /usr/local/bin/swerex-remote"],
        ]  # fmt: skip
        for argv in steps:
            _check(run(argv), argv)
        for inside, host in (copy or {}).items():
            target = root / inside.lstrip("/")
            shutil.copytree(host, target, symlinks=True)
        if setup:
            _check(run(["chroot", str(root), "/bin/sh", "-c", setup]), ["chroot", "setup"])
        tar = subprocess.Popen(["tar", "-C", str(root), "-c", "."], stdout=subprocess.PIPE)
        result = run([engine, "import", "-", tag], stdin=tar.stdout)
        tar.wait()
        _check(result, [engine, "import"])


def _check(result: subprocess.CompletedProcess, argv: Sequence[str]) -> None:
    if result.returncode != 0:
        raise RuntimeError(f"{' '.join(map(str, argv[:3]))} failed: {result.stderr[-500:]}")


def engine_args(engine: str) -> list[str]:
    """``run`` arguments this machine's podman needs (see uniagent.env.local)."""
    from uniagent.env.local import podman_args

    return podman_args([]) if engine == "podman" else []


#: Debian's packages in :data:`TEST_IMAGE`: Python 3.11 (the host's, for a pip harness's
#: venv, and swe-rex's) and node 18 (for the npm harnesses).
TEST_PACKAGES = ("python3", "python3-venv", "nodejs")
#: The image the local-backend tests use: Debian bookworm with ``swerex-remote`` and
#: :data:`TEST_PACKAGES` (a new tag whenever they change: an engine's cached image with
#: other packages must not be taken for it).
TEST_IMAGE = os.environ.get("UNIAGENT_TEST_IMAGE", "localhost/uniagent-swerex:bookworm-node")


def engine_with_test_image(image: str = TEST_IMAGE, packages: Sequence[str] = TEST_PACKAGES) -> str:
    """The engine that runs ``image`` here, building the image first (with Debian's
    ``packages``) if needed.

    For pytest fixtures: skips the test (printing why) where no engine works or the
    image cannot be built or run.
    """
    import pytest

    def skip(reason: str) -> None:
        print(f"\nSKIP local deployment: {reason}")
        pytest.skip(reason)

    engine, reason = container_engine()
    if engine is None:
        skip(f"no container engine works here: {reason}")
    assert engine is not None
    # One build per tag on the machine: test processes that ask at once (pytest-xdist
    # workers, two suites) wait for the first one's build, then find the image.
    with named_lock(f"image-{image}"):
        if not image_exists(engine, image):
            try:
                build_image(engine, image, packages=packages)
            except (RuntimeError, OSError, subprocess.TimeoutExpired) as exc:
                skip(f"cannot build the test image {image}: {exc}")
    probe = run([engine, "run", "--rm", *engine_args(engine), image, "swerex-remote", "-v"])
    if probe.returncode != 0:
        skip(f"`{engine} run {image}` fails: {probe.stderr.strip()[-500:]}")
    return engine
