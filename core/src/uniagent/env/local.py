"""The ``local`` deployment: a container (docker or podman) running ``swerex-remote``.

Built on SWE-ReX's ``DockerDeployment`` (image pulls, container names, the
``swerex-remote`` start command, the optional standalone-Python build), with
``start``/``stop`` replaced: upstream runs ``docker``/``podman`` with blocking
``subprocess`` calls and ``time.sleep`` on the event loop, and never reads the
container's output pipe, so a chatty server eventually blocks on a full pipe.
Here the engine runs as an asyncio subprocess writing to a log file, the
server listens on 127.0.0.1 only, and a failed start is retried with a fresh
port and container name.

The image must provide ``swerex-remote`` on ``PATH`` (``pip install swe-rex``
in the image), or reach PyPI from inside the container (upstream falls back to
``pipx run swe-rex``). See docs/sandboxes.md for an offline image recipe.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import resource
import shutil
import tempfile
import uuid
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from uniagent.env.aio import wait_for
from uniagent.env.config import renamed_keys
from uniagent.env.containers import label_args, name_prefix
from uniagent.env.errors import EnvError, EnvStartError
from uniagent.env.host import SandboxLimits
from uniagent.env.killall import kill_all_but_ancestors
from uniagent.env.remote import make_runtime, retrying_runtime_class, wait_until_alive

log = logging.getLogger(__name__)


class ContainerLimits(SandboxLimits):
    """A container's limits, passed to the engine (``--pids-limit``, ``--memory``)."""

    disk: int | None = Field(
        None,
        ge=16 << 20,
        description="bytes of the container's writable layer (`--storage-opt size=`; needs a "
        "storage driver with quotas, e.g. overlay on xfs with pquota); null: the engine's",
    )

    def run_args(self) -> list[str]:
        """The ``run`` flags for these limits."""
        args = []
        if self.pids is not None:
            args += ["--pids-limit", str(self.pids)]
        if self.memory is not None:
            args += ["--memory", str(self.memory), "--memory-swap", str(self.memory)]
        if self.disk is not None:
            args += ["--storage-opt", f"size={self.disk}"]
        return args


class LocalDeploymentConfig(BaseModel):
    """A container on this machine, via docker or podman."""

    model_config = ConfigDict(extra="forbid")

    @model_validator(mode="before")
    @classmethod
    def _renamed(cls, data: Any) -> Any:
        renames = {"startup_timeout": "server_start_timeout"}
        return renamed_keys(data, renames, "env.deployment", kind="local")

    type: Literal["local"] = "local"
    image: str = Field(description="container image; it must provide swerex-remote (or reach PyPI)")
    engine: Literal["auto", "docker", "podman"] = Field(
        "auto", description="'auto': docker if its daemon answers, else podman"
    )
    run_args: list[str] = Field(default_factory=list, description="extra `docker run` arguments")
    podman_defaults: bool = Field(
        True,
        description="with podman, add `--runtime runc` (if installed) and `--ulimit nofile/nproc` "
        "within this machine's hard limits unless run_args sets them (podman's defaults fail in "
        "VMs and containers with lower limits)",
    )
    pull: Literal["never", "always", "missing"] = "missing"
    server_start_timeout: float = Field(
        180.0, gt=0, description="seconds for the server to answer, per try"
    )
    retries: int = Field(2, ge=0, description="further tries, each with a fresh port and name")
    python_standalone_dir: str | None = Field(
        None, description="SWE-ReX: build a standalone Python into the image there (needs network)"
    )
    platform: str | None = None
    request_timeout: float = Field(
        120.0, gt=0, description="HTTP timeout of calls other than commands"
    )
    request_margin: float = Field(
        60.0, ge=0, description="added to a command's timeout for its HTTP timeout"
    )
    http_retries: int = Field(3, ge=0, description="retries of a request whose connection failed")
    limits: ContainerLimits = Field(
        default_factory=lambda: ContainerLimits(),
        description="processes, memory and disk of the container (engine flags)",
    )


async def _run(*argv: str, timeout: float = 30.0) -> tuple[int, str]:
    try:
        proc = await asyncio.create_subprocess_exec(
            *argv,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
            stdin=asyncio.subprocess.DEVNULL,
        )
    except OSError as exc:
        return 127, str(exc)
    try:
        out, _ = await wait_for(proc.communicate(), timeout)
    except asyncio.TimeoutError:
        proc.kill()
        await proc.wait()
        return 124, f"{argv[0]} did not answer within {timeout:g} s"
    return proc.returncode or 0, out.decode("utf-8", "replace")


async def detect_engine(preferred: str = "auto") -> str:
    """``docker`` if its daemon answers, else ``podman`` if installed; explains failures."""
    if preferred != "auto":
        if shutil.which(preferred) is None:
            raise EnvStartError(f"container engine {preferred!r} is not installed")
        return preferred
    docker_reason = "docker is not installed"
    if shutil.which("docker"):
        code, out = await _run("docker", "info", "--format", "{{.ServerVersion}}", timeout=15)
        if code == 0:
            return "docker"
        docker_reason = f"the docker daemon does not answer ({out.strip()[-300:]})"
    if shutil.which("podman"):
        return "podman"
    raise EnvStartError(
        f"no container engine: {docker_reason}, and podman is not installed "
        "(apt-get install podman runc)"
    )


def network_of(run_args: list[str]) -> str | None:
    """The ``--network``/``--net`` that ``run_args`` sets (the last one), or None."""
    found = None
    for i, arg in enumerate(run_args):
        for flag in ("--network", "--net"):
            if arg == flag and i + 1 < len(run_args):
                found = run_args[i + 1]
            elif arg.startswith(flag + "="):
                found = arg.split("=", 1)[1]
    return found


async def host_address(config: LocalDeploymentConfig) -> tuple[str, str]:
    """The address of this machine that the container reaches, and the container
    network's subnet: ``(gateway address, subnet)`` of the engine's network (``podman``'s
    or docker's ``bridge`` unless ``run_args`` names another); ``--network host`` shares
    this machine's 127.0.0.1. A container without a network reaches nothing here: an
    :class:`EnvStartError`."""
    network = network_of(config.run_args)
    if network == "host":
        return "127.0.0.1", "127.0.0.0/8"
    if network == "none":
        raise EnvStartError(
            "the container has no network (`--network none`, e.g. a Harbor task's "
            "no-network policy): a harness in it cannot reach its model, the gateway"
        )
    engine = await detect_engine(config.engine)
    name = network or ("podman" if engine == "podman" else "bridge")
    code, out = await _run(engine, "network", "inspect", name, timeout=60)
    if code != 0:
        raise EnvStartError(f"`{engine} network inspect {name}` failed: {out.strip()[-500:]}")
    try:
        [info] = json.loads(out)
        if engine == "podman":
            subnets = [(s["gateway"], s["subnet"]) for s in info.get("subnets") or []]
        else:
            subnets = [(c["Gateway"], c["Subnet"]) for c in info["IPAM"]["Config"] or []]
        address, subnet = next((g, n) for g, n in subnets if g and ":" not in g)
    except (ValueError, KeyError, TypeError, StopIteration):
        raise EnvStartError(
            f"{engine} network {name!r} has no IPv4 gateway address to serve the gateway "
            f"on: {out.strip()[-500:]}"
        ) from None
    return str(address), str(subnet)


def podman_args(run_args: list[str]) -> list[str]:
    """The podman arguments this machine needs, unless ``run_args`` already sets them."""
    extra: list[str] = []
    if "--runtime" not in " ".join(run_args) and shutil.which("runc"):
        extra += ["--runtime", "runc"]
    given = " ".join(run_args)
    # nproc above ~32k fails in runc here even under a higher hard limit; 4096 is
    # plenty for one sandbox and known to work.
    caps = {"nofile": 1 << 20, "nproc": 4096}
    for name, limit in (("nofile", resource.RLIMIT_NOFILE), ("nproc", resource.RLIMIT_NPROC)):
        hard = resource.getrlimit(limit)[1]
        value = caps[name] if hard == resource.RLIM_INFINITY else min(hard, caps[name])
        if f"{name}=" not in given:
            extra += ["--ulimit", f"{name}={value}:{value}"]
    return extra


def _container_class() -> type:
    retrying_runtime_class()  # fails early, with the install hint, without swe-rex
    from swerex.deployment.docker import DockerDeployment
    from swerex.utils.free_port import find_free_port

    class Container(DockerDeployment):
        """``DockerDeployment`` with a non-blocking start/stop and a log file."""

        def __init__(self, *, options: LocalDeploymentConfig, **kwargs: Any) -> None:
            super().__init__(logger=log, **kwargs)
            self.options = options
            self._proc: asyncio.subprocess.Process | None = None
            #: Set when uniagent stops the container (so its end is not "from inside").
            self.stopping = False
            # Closed in stop(); the engine writes to it for the container's whole life.
            self._log = tempfile.NamedTemporaryFile(  # noqa: SIM115
                prefix="uniagent-container-", suffix=".log"
            )

        def log_tail(self, n: int = 3000) -> str:
            """The last ``n`` characters the engine and the server printed."""
            with contextlib.suppress(OSError):
                return Path(self._log.name).read_text(errors="replace")[-n:]
            return ""

        async def start(self) -> None:  # replaces upstream's blocking start
            await asyncio.to_thread(self._pull_image)
            image: str = str(self._config.image)
            if self._config.python_standalone_dir:
                image = await asyncio.to_thread(self._build_image)
            port = self._config.port or find_free_port()
            # Named and labelled after the run, so that `uniagent clean` finds its leftovers.
            self._container_name = f"{name_prefix()}{uuid.uuid4().hex[:12]}"  # type: ignore[assignment]
            token = self._get_token()
            platform = ["--platform", self._config.platform] if self._config.platform else []
            argv: list[str] = [
                str(self._config.container_runtime),
                "run",
                "--rm",
                "-p",
                f"127.0.0.1:{port}:8000",
                *platform,
                *self._config.docker_args,
                *label_args(),
                "--name",
                str(self._container_name),
                str(image),
                *self._get_swerex_start_cmd(token),
            ]
            log.info("starting container %s: %s", self._container_name, " ".join(argv))
            self._proc = await asyncio.create_subprocess_exec(
                *argv, stdin=asyncio.subprocess.DEVNULL, stdout=self._log, stderr=self._log
            )
            o = self.options
            self._runtime = make_runtime(
                host="http://127.0.0.1",
                port=port,
                auth_token=token,
                retries=o.http_retries,
                request_timeout=o.request_timeout,
                request_margin=o.request_margin,
            )
            await wait_until_alive(
                self._runtime,
                self._config.startup_timeout,  # SWE-ReX's field: our server_start_timeout
                f"container {self._container_name} ({image})",
                died=self._exit_reason,
            )

        def _exit_reason(self) -> str | None:
            if self._proc is None or self._proc.returncode is None:
                return None
            engine, code = self._config.container_runtime, self._proc.returncode
            return f"`{engine} run` exited with {code}:\n{self.log_tail()}"

        async def is_alive(self, *, timeout: float | None = None) -> Any:
            if self._runtime is None or self._exit_reason():
                from swerex.runtime.abstract import IsAliveResponse

                return IsAliveResponse(is_alive=False, message=self._exit_reason() or "not started")
            return await self._runtime.is_alive(timeout=timeout)

        async def ended_by_itself(self) -> bool:
            """Whether the container is gone or its server stopped answering, uniagent not
            having stopped it: something inside ended it (waits for the engine to notice)."""
            proc = self._proc
            if self.stopping or proc is None:
                return False
            if proc.returncode is None:
                with contextlib.suppress(asyncio.TimeoutError):
                    await wait_for(asyncio.shield(proc.wait()), 15)
            return not self.stopping

        async def stop(self) -> None:  # replaces upstream's blocking stop
            self.stopping = True
            self._runtime = None  # the container goes, and its server with it
            proc, name = self._proc, self._container_name
            self._proc = None
            if name is not None and proc is not None and proc.returncode is None:
                code, out = await _run(self._config.container_runtime, "kill", name, timeout=30)
                if code != 0 and proc.returncode is None:
                    log.warning("could not kill container %s: %s", name, out.strip())
            if proc is not None:
                try:
                    await wait_for(proc.wait(), 30)
                except asyncio.TimeoutError:
                    proc.kill()
                    await proc.wait()
            self._container_name = None
            self._log.close()

        def __del__(self) -> None:  # upstream schedules stop() from the finalizer
            pass

    return Container


class LocalDeployment:
    """A container per episode via SWE-ReX's ``DockerDeployment``; retried on a failed start."""

    def __init__(self, config: LocalDeploymentConfig) -> None:
        self.config = config
        self._container: Any = None
        self.engine: str | None = None
        self._fork_image: str | None = None  # the image a fork committed for this one

    async def start(self) -> None:
        """Detect the engine, start the container, wait for its ``swerex-remote``."""
        if self._container is not None:
            raise EnvError("this local deployment is already started")
        cls = _container_class()
        c = self.config
        self.engine = await detect_engine(c.engine)
        run_args = [*c.limits.run_args(), *c.run_args]
        if self.engine == "podman" and c.podman_defaults:
            run_args += podman_args(run_args)
        errors = []
        for attempt in range(c.retries + 1):
            container = cls(
                options=c,
                image=c.image,
                docker_args=run_args,
                startup_timeout=c.server_start_timeout,
                pull=c.pull,
                python_standalone_dir=c.python_standalone_dir,
                platform=c.platform,
                container_runtime=self.engine,
                remove_container=True,
            )
            try:
                await container.start()
            except Exception as exc:
                errors.append(f"try {attempt + 1}: {type(exc).__name__}: {exc}")
                tail = container.log_tail()
                if tail and tail not in str(exc):
                    errors[-1] += f"\ncontainer output:\n{tail}"
                await container.stop()
                continue
            self._container = container
            return
        raise EnvStartError(
            f"could not start a {self.engine} container from {c.image!r} after {c.retries + 1} "
            "tries:\n" + "\n".join(errors)
        )

    async def stop(self) -> None:
        """Kill and remove the container (and the image a fork made for it); idempotent."""
        container, self._container = self._container, None
        if container is not None:
            await container.stop()
        image, self._fork_image = self._fork_image, None
        if image is not None and self.engine is not None:
            # Kept while a fork of this fork still uses it (its layers): removed with that.
            await _run(self.engine, "rmi", image, timeout=120)

    async def fork(self) -> LocalDeployment:
        """A new container from this one's file system: its changes committed to an image
        (``commit``, which carries no process), a container of the same config started
        from it. The image is removed when the new container stops."""
        name, engine = self.container_name, self.engine
        if name is None or engine is None:
            raise EnvError("the local deployment is not started; nothing to fork")
        image = f"localhost/uniagent-fork:{uuid.uuid4().hex[:12]}"
        code, out = await _run(engine, "commit", "-q", name, image, timeout=600)
        if code != 0:
            raise EnvStartError(f"{engine} commit of {name} failed: {out.strip()[-2000:]}")
        child = LocalDeployment(self.config.model_copy(update={"image": image, "pull": "never"}))
        child._fork_image = image
        try:
            await child.start()
        except BaseException:
            child.engine = child.engine or engine
            await child.stop()
            raise
        return child

    @property
    def runtime(self) -> Any:
        """The SWE-ReX runtime talking to the container's server."""
        if self._container is None:
            raise EnvError("the local deployment is not started; await start() first")
        return self._container.runtime

    async def sandbox_alive(self) -> bool:
        """Whether the container and its server run (the agent's shell may be gone)."""
        return await self.is_alive()

    async def ended_from_inside(self) -> bool:
        """Whether the container (or its server) ended without uniagent stopping it: the
        agent's command or the tested code killed the server, or the container's memory
        limit did. Asked only once the server no longer answers."""
        container = self._container
        return container is not None and bool(await container.ended_by_itself())

    async def kill_processes(self) -> None:
        """End every process in the container except its server (before grading)."""
        if self._container is not None:
            await kill_all_but_ancestors(self.runtime)

    @property
    def workdir(self) -> str | None:
        """None: the image's working directory (set ``workdir`` in the env settings)."""
        return None

    @property
    def tools_dir(self) -> str | None:
        """None: ``/usr/local/uniagent/tools`` unless the env settings say otherwise."""
        return None

    @property
    def container_name(self) -> str | None:
        """The running container's name."""
        return self._container.container_name if self._container else None

    async def is_alive(self) -> bool:
        """Whether the container runs and its server answers."""
        if self._container is None:
            return False
        with contextlib.suppress(Exception):
            return bool(await self._container.is_alive(timeout=10))
        return False
