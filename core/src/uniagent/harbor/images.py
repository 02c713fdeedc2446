"""A Harbor task's image for the ``local`` backend: its ``environment/`` (and a separate
verifier's ``tests/``) built once per content.

The tag is ``localhost/uniagent-harbor:<digest>``, the digest taken over the files of
``environment/`` (and the ``FROM`` override): a task whose environment did not change
is not built again, and two tasks with the same environment share one image. On
machines without a registry, ``from_image`` replaces the Dockerfile's ``FROM`` (the
engine's ``build --from``), e.g. with an image built offline that has ``swerex-remote``.
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
from pathlib import Path

from uniagent.cache import file_digest, named_lock
from uniagent.errors import ConfigError
from uniagent.harbor.schema import TaskToml

REPOSITORY = "localhost/uniagent-harbor"


def pick_engine(preferred: str = "auto") -> str:
    """``docker`` or ``podman`` (``auto``: docker if its daemon answers, else podman)."""
    if preferred != "auto":
        return preferred
    if shutil.which("docker"):
        probe = subprocess.run(["docker", "info"], capture_output=True, timeout=30, check=False)
        if probe.returncode == 0:
            return "docker"
    if shutil.which("podman"):
        return "podman"
    raise ConfigError("building a Harbor task's image needs docker or podman; neither works here")


def image_tag(task_dir: Path, from_image: str | None = None, folder: str = "environment") -> str:
    """The content-addressed tag of the task's ``environment/`` (or the build context
    ``folder``: ``tests`` for a separate verifier's image), with ``from_image``."""
    digest = hashlib.sha256()
    digest.update(file_digest(task_dir / folder).encode())
    digest.update(f"\nfrom={from_image or ''}".encode())
    return f"{REPOSITORY}:{digest.hexdigest()[:24]}"


class ImageBuilder:
    """Builds task images with one engine, each tag once per process (then the engine's cache)."""

    def __init__(self, engine: str = "auto", *, from_image: str | None = None) -> None:
        self.engine_setting = engine
        self.from_image = from_image
        self._built: dict[str, str] = {}

    def __call__(self, task_dir: Path, config: TaskToml, folder: str = "environment") -> str:
        tag = image_tag(task_dir, self.from_image, folder)
        if tag in self._built:
            return tag
        engine = pick_engine(self.engine_setting)
        with named_lock(f"image-{tag}"):  # one build of a tag at a time on the machine
            exists = subprocess.run(
                [engine, "image", "inspect", tag], capture_output=True, timeout=60, check=False
            )
            if exists.returncode != 0:
                env = config.environment
                if folder != "environment" and config.verifier.environment is not None:
                    env = config.verifier.environment
                self._build(engine, task_dir, tag, env.build_timeout_sec, folder)
        self._built[tag] = tag
        return tag

    def _build(
        self, engine: str, task_dir: Path, tag: str, timeout: float, folder: str = "environment"
    ) -> None:
        context = task_dir / folder
        argv = [engine, "build", "-t", tag, "-f", str(context / "Dockerfile")]
        if engine == "podman" and shutil.which("runc"):
            # the runtime the local backend runs containers with: crun's cgroup handling
            # fails a RUN step on hosts whose cgroups are in hybrid mode
            argv += ["--runtime", "runc"]
        if self.from_image:
            argv += ["--from", self.from_image]
        try:
            done = subprocess.run(
                [*argv, str(context)],
                capture_output=True,
                text=True,
                timeout=timeout,
                check=False,
            )
        except subprocess.TimeoutExpired:
            raise ConfigError(
                f"{folder}/Dockerfile: the build took longer than {timeout:g} s (build_timeout_sec)"
            ) from None
        if done.returncode != 0:
            raise ConfigError(
                f"{folder}/Dockerfile: `{engine} build` failed: {done.stderr.strip()[-800:]}"
            )
