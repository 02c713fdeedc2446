"""The local deployment: a real container (docker, else podman) running ``swerex-remote``.

No registry is reachable here, so the image is built offline on first use:
``debootstrap --variant=minbase bookworm`` plus swe-rex installed from wheels
that pip downloads on the host, imported with ``podman import`` (about 2-3
minutes, then cached by the engine). ``UNIAGENT_TEST_IMAGE`` names another
image that has ``swerex-remote`` on PATH. Where no engine works, the tests
are skipped and the reason is printed.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

from uniagent import ToolSpec
from uniagent.env import ActionTimeoutError, AgentEnv, EnvStartError, LocalDeployment
from uniagent.env.local import LocalDeploymentConfig

IMAGE = os.environ.get("UNIAGENT_TEST_IMAGE", "localhost/uniagent-swerex:bookworm")
MIRROR = os.environ.get("UNIAGENT_DEBIAN_MIRROR", "http://deb.debian.org/debian")

pytestmark = pytest.mark.slow


def _run(argv: list[str], timeout: float = 900, **kwargs: Any) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, **kwargs)


def _engine() -> tuple[str | None, str]:
    """The engine that runs containers here, or None and why not."""
    reasons = []
    if shutil.which("docker"):
        probe = _run(["docker", "info"], timeout=30)
        if probe.returncode == 0:
            return "docker", ""
        reasons.append(f"docker's daemon does not answer: {probe.stderr.strip()[-200:]}")
    else:
        reasons.append("docker is not installed")
    if not shutil.which("podman"):
        reasons.append("podman is not installed (apt-get install podman runc)")
        return None, "; ".join(reasons)
    probe = _run(["podman", "info"], timeout=60)
    if probe.returncode != 0:
        reasons.append(f"`podman info` failed: {probe.stderr.strip()[-300:]}")
        return None, "; ".join(reasons)
    return "podman", ""


def _build_image(engine: str) -> None:
    """debootstrap + swe-rex from host-downloaded wheels + ``<engine> import``."""
    if shutil.which("debootstrap") is None:
        raise RuntimeError("debootstrap is not installed (apt-get install debootstrap)")
    with tempfile.TemporaryDirectory(prefix="uniagent-rootfs-", dir="/var/tmp") as tmp:
        root = Path(tmp) / "rootfs"
        steps = [
            ["debootstrap", "--variant=minbase", "--include=python3,python3-venv",
             "bookworm", str(root), MIRROR],
            [sys.executable, "-m", "pip", "download", "-q", "-d", str(root / "tmp" / "wheels"),
             "swe-rex==1.4.0"],
            ["chroot", str(root), "/bin/sh", "-c",
             "python3 -m venv /opt/swerex && /opt/swerex/bin/pip install -q --no-index "
             "--find-links /tmp/wheels swe-rex==1.4.0 && rm -rf /tmp/wheels && "
             "ln -sf /opt/swerex/bin/swerex-remote /usr/local/bin/swerex-remote"],
        ]  # fmt: skip
        for argv in steps:
            result = _run(argv)
            if result.returncode != 0:
                raise RuntimeError(f"{' '.join(argv[:3])} failed: {result.stderr.strip()[-500:]}")
        tar = subprocess.Popen(["tar", "-C", str(root), "-c", "."], stdout=subprocess.PIPE)
        result = _run([engine, "import", "-", IMAGE], stdin=tar.stdout)
        tar.wait()
        if result.returncode != 0:
            raise RuntimeError(f"{engine} import failed: {result.stderr.strip()[-500:]}")


@pytest.fixture(scope="module")
def engine() -> Iterator[str]:
    engine, reason = _engine()
    if engine is None:
        print(f"\nSKIP local deployment: no container engine works here: {reason}")
        pytest.skip(f"no container engine works here: {reason}")
    if _run([engine, "image", "inspect", IMAGE], timeout=60).returncode != 0:
        try:
            _build_image(engine)
        except (RuntimeError, OSError, subprocess.TimeoutExpired) as exc:
            print(f"\nSKIP local deployment: cannot build the test image {IMAGE}: {exc}")
            pytest.skip(f"cannot build the test image {IMAGE}: {exc}")
    probe = _run([engine, "run", "--rm", *_podman_args(engine), IMAGE, "swerex-remote", "-v"])
    if probe.returncode != 0:
        reason = f"`{engine} run {IMAGE}` fails: {probe.stderr.strip()[-500:]}"
        print(f"\nSKIP local deployment: {reason}")
        pytest.skip(reason)
    yield engine


def _podman_args(engine: str) -> list[str]:
    from uniagent.env.local import podman_args

    return podman_args([]) if engine == "podman" else []


def _containers(engine: str, name: str) -> str:
    return _run([engine, "ps", "-a", "--filter", f"name={name}", "-q"], timeout=60).stdout.strip()


class _NoArgs(BaseModel):
    pass


async def test_a_container_episode(engine: str, tmp_path: Path) -> None:
    deployment = LocalDeployment(LocalDeploymentConfig(image=IMAGE, engine=engine, pull="never"))
    env = AgentEnv(deployment, {"workdir": "/testbed"})
    await env.start()
    try:
        name = deployment.container_name
        assert name and _containers(engine, name)
        assert (await env.run_action("pwd")).output.strip() == "/testbed"
        await env.run_action("mkdir -p src && cd src && export V=1")
        assert (await env.run_action("echo $PWD $V $PAGER")).output.strip() == "/testbed/src 1 cat"

        script = tmp_path / "inside"
        script.write_text('#!/bin/sh\necho "tool at $0"\n')
        tool = ToolSpec(name="inside", description="d", arguments=_NoArgs, scripts=(script,))
        await env.install_tools([tool])
        assert (await env.run_action("inside")).output.strip() == (
            "tool at /usr/local/uniagent/tools/inside"
        )

        await env.write_file("notes.txt", "héllo\n")
        assert await env.read_file("/testbed/notes.txt") == "héllo\n"

        with pytest.raises(ActionTimeoutError):
            await env.run_action("sleep 100", timeout=2)
        assert (await env.run_action("echo $V")).output.strip() == "1"
    finally:
        await env.close()
    assert not _containers(engine, name)


async def test_a_missing_image_fails_to_start_with_the_reason(engine: str) -> None:
    config = {"type": "local", "image": "localhost/uniagent-no-such-image:1", "engine": engine,
              "pull": "never", "retries": 1, "startup_timeout": 30}  # fmt: skip
    with pytest.raises(EnvStartError) as info:
        await AgentEnv.from_config(config).start()
    assert "2 tries" in str(info.value)
