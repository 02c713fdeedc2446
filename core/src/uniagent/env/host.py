"""The ``host`` deployment: a persistent async bash session per episode on this machine.

Each episode gets a private directory (``uniagent-XXXX`` under ``base_dir``)
holding its work dir (the session's cwd), tools dir and, with bubblewrap,
``/tmp`` and home; ``stop()`` kills the session's process group and removes
the directory. ``isolation: bwrap`` runs the session in a bubblewrap sandbox
(see :mod:`uniagent.env.bwrap`). This module lays the episode out (its
config, directory, mounts, cgroup); :mod:`uniagent.env.host_runtime` runs the
sessions and file operations in it.
"""

from __future__ import annotations

import asyncio
import contextlib
import fnmatch
import functools
import itertools
import logging
import os
import select
import shutil
import stat
import subprocess
import tempfile
import threading
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from uniagent.env import cgroups
from uniagent.env.bwrap import (
    Mount,
    bind_mounts,
    bwrap_argv,
    bwrap_problem,
    drop_privileges,
    find_bwrap,
    host_path,
    read_only_source,
    stage_mounts,
    system_mounts,
    which,
    writable_places,
)
from uniagent.env.cgroups import SandboxCgroup
from uniagent.env.config import renamed_keys
from uniagent.env.errors import EnvError, EnvStartError
from uniagent.env.host_runtime import HostRuntime
from uniagent.env.mountns import MNT_DETACH, libc_call, namespace_path, sandbox_namespace

log = logging.getLogger(__name__)

DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
#: This process's variables every sandbox gets (no secrets): the rest only through ``pass_env``.
PASS_ENV = ("PATH", "LANG", "LANGUAGE", "LC_ALL", "LC_CTYPE", "LC_MESSAGES", "TZ")
#: Where the sandbox sees its work dir, tools dir and home under bubblewrap (the first two
#: below a top-level name of ours, so that a bound host path never lands in them).
BWRAP_WORKDIR = "/uniagent/work"
BWRAP_TOOLS_DIR = "/uniagent/tools"
BWRAP_HOME = "/root"


def _bytes(value: Any) -> Any:
    """``"4g"``-style sizes (k, m, g, t; powers of 1024) as bytes."""
    if isinstance(value, str):
        text = value.strip().lower().removesuffix("b")
        units = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}
        try:
            if text and text[-1] in units:
                return int(float(text[:-1]) * units[text[-1]])
            return int(text)
        except ValueError:
            raise ValueError(f"{value!r} is not a size (e.g. 512m, 4g)") from None
    return value


class SandboxLimits(BaseModel):
    """Resources one sandbox may use; ``null`` lifts a limit."""

    model_config = ConfigDict(extra="forbid")

    pids: int | None = Field(
        4096, ge=16, description="processes and threads at once (cgroup pids controller)"
    )
    memory: int | None = Field(
        4 << 30, ge=16 << 20, description="bytes of memory, e.g. 4g (cgroup memory controller)"
    )
    disk: int | None = Field(
        10 << 30,
        ge=16 << 20,
        description="bytes the episode directory (work dir, tools, /tmp and home under bwrap) "
        "may hold, e.g. 10g: it is a size-limited tmpfs, whose pages count as the sandbox's "
        "memory",
    )

    @field_validator("memory", "disk", mode="before")
    @classmethod
    def _sizes(cls, value: Any) -> Any:
        return _bytes(value)


class HostDeploymentConfig(BaseModel):
    """A bash session on this machine, optionally inside a bubblewrap sandbox."""

    model_config = ConfigDict(extra="forbid")

    @model_validator(mode="before")
    @classmethod
    def _renamed(cls, data: Any) -> Any:
        renames = {"startup_timeout": "shell_start_timeout"}
        return renamed_keys(data, renames, "env.deployment", kind="host")

    type: Literal["host"] = "host"
    isolation: Literal["auto", "bwrap", "none"] = Field(
        "auto",
        description="'bwrap': a bubblewrap sandbox; 'none': the host itself (trusted policies "
        "only); 'auto': bwrap where it works, else none with a warning",
    )
    sandbox_uid: int | None = Field(
        None,
        ge=0,
        description="bwrap only, when uniagent runs as root: the host uid (and gid) the "
        "sandbox's root maps to, so that it is not host root for host files (default 65534, "
        "nobody; 0 keeps host root)",
    )
    network: bool | None = Field(
        None, description="bwrap only: share the host's network (default: no network)"
    )
    sandbox_workdir: str | None = Field(
        None,
        description=f"bwrap only: where the work dir appears inside (default {BWRAP_WORKDIR})",
    )
    ro_binds: list[str] = Field(
        default_factory=list,
        description="host paths the sandbox sees read-only, 'PATH' or (bwrap) 'HOST:INSIDE'; "
        "without isolation every host path is visible anyway",
    )
    binds: list[str] = Field(
        default_factory=list,
        description="host paths the sandbox sees read-write, 'PATH' or (bwrap) 'HOST:INSIDE'",
    )
    bwrap_args: list[str] = Field(
        default_factory=list, description="bwrap only: extra bwrap arguments"
    )
    pass_env: list[str] = Field(
        default_factory=list,
        description="names (or fnmatch patterns, e.g. 'PIP_*') of this process's environment "
        "variables passed into the sandbox besides " + ", ".join(PASS_ENV) + "; nothing else "
        "from this process's environment (API keys, tokens) ever enters it",
    )
    base_dir: str | None = Field(
        None, description="parent of the episode directories (default: the temp dir)"
    )
    bash: str = "bash"
    bwrap: str = "bwrap"
    limits: SandboxLimits = Field(
        default_factory=SandboxLimits,
        description="processes, memory and disk of one sandbox (enforced where the kernel "
        "allows: cgroups and mounts need root or a delegated cgroup)",
    )
    pty: bool = Field(
        False,
        description="every command on a pseudo-terminal (stdin, stdout and stderr), as in a "
        "terminal or SWE-ReX's runtime: a pager or a prompt waits for input until the command's "
        "timeout and an interrupt brings the shell back; default: stdin /dev/null and output "
        "on a pipe (faster: a program that waits for input ends at once)",
    )
    shell_start_timeout: float = Field(
        10.0, gt=0, description="seconds for bash to answer at start"
    )
    max_output_bytes: int = Field(
        16 * 1024 * 1024, ge=1024, description="bytes of one command's output kept (head and tail)"
    )

    @model_validator(mode="after")
    def _binds_outside_the_sandbox_dirs(self) -> HostDeploymentConfig:
        if self.isolation == "none":
            return self
        own = {"work dir": self.sandbox_workdir or BWRAP_WORKDIR, "tools dir": BWRAP_TOOLS_DIR}
        for spec in (*self.ro_binds, *self.binds):
            inside = os.path.normpath(spec.partition(":")[2] or os.path.abspath(spec))
            for what, path in own.items():
                if inside == path or inside.startswith(path.rstrip("/") + "/"):
                    raise ValueError(
                        f"bind {spec!r} would appear inside the sandbox's {what} {path} (and "
                        "be part of what the agent works on); bind it elsewhere with "
                        "'HOST:INSIDE', or set sandbox_workdir"
                    )
        return self

    @model_validator(mode="after")
    def _bwrap_only(self) -> HostDeploymentConfig:
        if self.isolation == "none":
            if self.sandbox_uid is not None:
                raise ValueError("sandbox_uid applies only with isolation: bwrap")
            if self.network is False:
                raise ValueError(
                    "network: false needs isolation: bwrap (without isolation the session has "
                    "the host's network)"
                )
            for name in ("sandbox_workdir", "bwrap_args"):
                if getattr(self, name):
                    raise ValueError(f"{name} applies only with isolation: bwrap")
            for name in ("ro_binds", "binds"):
                moved = [b for b in getattr(self, name) if ":" in b]
                if moved:
                    # A plain path is visible without isolation anyway; a moved one is not.
                    raise ValueError(
                        f"{name} {moved[0]!r}: HOST:INSIDE applies only with isolation: bwrap"
                    )
        return self


#: Seconds the holder of a sandbox's staged mounts may take to stage them.
HOLD_STAGE_TIMEOUT = 60.0


def _start_holder(argv: list[str], timeout: float) -> subprocess.Popen[bytes] | None:
    """Start a holder of staged mounts and wait for its line (blocking: a worker thread);
    ``None`` where it did not stage (it ended, said nothing within ``timeout``)."""
    holder = subprocess.Popen(
        argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
        start_new_session=True,
    )  # fmt: skip
    try:
        assert holder.stdin is not None and holder.stdout is not None
        holder.stdin.write(b"ready\n")
        holder.stdin.flush()
        answered, _, _ = select.select([holder.stdout], [], [], timeout)
        # (`cat` echoes the line in one write, or the staging shell ends: all or nothing)
        line = holder.stdout.readline() if answered else b""
    except BaseException:
        _end_holder(holder)
        raise
    if line != b"ready\n":
        _end_holder(holder)
        return None
    return holder


def _end_holder(holder: subprocess.Popen[bytes]) -> None:
    """End a holder of staged mounts (its stdin closed, then killed) and reap it (blocking:
    a worker thread)."""
    with contextlib.suppress(OSError):
        if holder.stdin is not None:
            holder.stdin.close()
    if holder.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            holder.kill()
    holder.wait()
    if holder.stdout is not None:
        holder.stdout.close()


def _end_started_holder(started: asyncio.Future[subprocess.Popen[bytes] | None]) -> None:
    """End the holder a cancelled start made (on a thread: it reaps)."""
    if not started.cancelled() and started.exception() is None:
        holder = started.result()
        if holder is not None:
            threading.Thread(target=_end_holder, args=(holder,), daemon=True).start()


class EpisodeLayout:
    """Paths of one episode, as the session sees them and on the host."""

    def __init__(
        self,
        config: HostDeploymentConfig,
        root: Path,
        bwrap: str | None,
        cgroup: SandboxCgroup | None = None,
        uid: int | None = None,
        namespace: int | None = None,
    ) -> None:
        self.root = root
        self.cgroup = cgroup
        #: A file descriptor of the mount namespace bwrap starts in (mountns.py), or None.
        self.namespace = namespace
        #: The host uid of the sandbox's files (bwrap as root maps its root to it).
        self.uid = uid
        for sub in ("work", "tools", "tmp", "home"):
            (root / sub).mkdir(exist_ok=True)
            self.own(root / sub)
        env = sandbox_environment(config.pass_env)
        self.bwrap = bwrap
        if bwrap is None:
            self.workdir = str(root / "work")
            self.tools_dir = str(root / "tools")
            self.mounts: list[Mount] = []
            self.prefix: list[str] = []
            self._stage: list[str] = []
            env.update(HOME=str(root / "home"), TMPDIR=str(root / "tmp"))
            # The work dir is no repository of its own until the task makes it one: git in
            # it must not find a checkout the sandbox root happens to lie in (a TMPDIR
            # inside a project) and commit to it.
            env["GIT_CEILING_DIRECTORIES"] = str(root)
        else:
            self.workdir = config.sandbox_workdir or BWRAP_WORKDIR
            self.tools_dir = BWRAP_TOOLS_DIR
            self.mounts = [
                *system_mounts(),
                *bind_mounts(config.ro_binds, writable=False),
                *bind_mounts(config.binds, writable=True),
                Mount("/tmp", str(root / "tmp"), True),
                Mount(BWRAP_HOME, str(root / "home"), True),
                Mount(self.workdir, str(root / "work"), True),
                Mount(self.tools_dir, str(root / "tools"), True),
            ]
            env.update(HOME=BWRAP_HOME, PATH=DEFAULT_PATH)
            mounts, stage = self.mounts, list[str]()
            if uid is not None:
                mounts, stage = stage_mounts(self.mounts, uid)
                # Host files it is given (ro_binds) belong to another uid inside: git must not
                # refuse them as "dubious ownership" (to clone a bound repository, say). Only a
                # global config reaches the local transport's subprocess.
                gitconfig = root / "home" / ".gitconfig"
                gitconfig.write_text("[safe]\n\tdirectory = *\n")
                self.own(gitconfig)
            self._stage = stage
            self._bwrap = functools.partial(
                bwrap_argv,
                bwrap,
                mounts,
                chdir=self.workdir,
                network=bool(config.network),
                extra_args=config.bwrap_args,
                uid=uid,
            )
            self._set_prefix()
        self.env = env
        #: The process that holds the staged mounts' namespace (:meth:`hold_stage`).
        self.holder: subprocess.Popen[bytes] | None = None
        self._held: list[str] = []

    async def hold_stage(self) -> None:
        """Stage the mounts once for the sandbox's life instead of at every command.

        Where sources must be staged (:func:`~uniagent.env.bwrap.stage_mounts`), each
        ``bwrap`` would otherwise start with a private mount namespace of its own and a
        ``mount`` (and a ``mkdir``) per source: about a dozen processes, more than the
        sandbox itself costs. Here one process stages them and stays in that namespace
        (``cat``, waiting on its stdin); every command then enters the namespace with
        ``nsenter``. The holder is this process's child, never in the sandbox or its cgroup
        (nothing of the sandbox can see or signal it), and ends with :meth:`release_stage`
        or when this process ends. Where ``nsenter`` is missing or the holder cannot start, every
        command stages as before."""
        if self.bwrap is None or not self._stage or self.holder is not None:
            return
        nsenter = which("nsenter")
        if nsenter is None:
            return
        # The staging shell runs `cat` once every mount is made (it stops at the first that
        # fails): a line echoed back says the namespace is ready. Started on a worker
        # thread: a fork on the event loop would stall every other episode (seconds when
        # hundreds of sandboxes start at once).
        argv = [*drop_privileges(None, self._entered()), *self._stage, "cat"]
        started = asyncio.ensure_future(asyncio.to_thread(_start_holder, argv, HOLD_STAGE_TIMEOUT))
        try:
            holder = await asyncio.shield(started)
        except asyncio.CancelledError:  # the holder the thread still makes is ended
            started.add_done_callback(_end_started_holder)
            raise
        if holder is None:  # it failed to stage: each command stages (and says why)
            return
        self.holder = holder
        self._held = self._bwrap(mount_namespace=f"/proc/{holder.pid}/ns/mnt")

    async def release_stage(self) -> None:
        """End the holder of the staged mounts (:meth:`hold_stage`); idempotent."""
        holder, self.holder = self.holder, None
        if holder is not None:
            await asyncio.to_thread(_end_holder, holder)

    def close_namespace(self) -> None:
        """Let the sandbox's mount namespace go (once its processes have ended); idempotent.
        A command started after this starts from this process's namespace. Blocking (the
        kernel tears the namespace down in the last ``close``: about a millisecond, a third
        of the event loop's work when hundreds of sandboxes closed at once): a thread."""
        namespace, self.namespace = self.namespace, None
        if namespace is not None:
            if self.bwrap is not None:  # first: no command is started naming a closed one
                self._set_prefix()
            os.close(namespace)

    def _entered(self) -> str | None:
        """The path of the sandbox's mount namespace for ``nsenter`` (None: this process's)."""
        return None if self.namespace is None else namespace_path(self.namespace)

    def _set_prefix(self) -> None:
        """The command prefix: into the sandbox's namespace, staged where sources must be (as
        root), then bubblewrap as the sandbox's user."""
        if self._stage:
            self.prefix = [*drop_privileges(None, self._entered()), *self._stage, *self._bwrap()]
        else:
            self.prefix = self._bwrap(mount_namespace=self._entered())

    def own(self, path: Path) -> None:
        """Give ``path`` to the sandbox's user (files written for it from the host side)."""
        if self.uid is not None:
            os.lchown(path, self.uid, self.uid)

    def make_parents(self, path: Path) -> None:
        """Create ``path``'s missing parent directories, owned by the sandbox's user."""
        missing = []
        parent = path.parent
        while not parent.exists():
            missing.append(parent)
            parent = parent.parent
        for directory in reversed(missing):
            directory.mkdir()
            self.own(directory)

    def to_host(self, path: str, *, write: bool = False) -> Path:
        """The host path of a sandbox path (identity without isolation)."""
        if not os.path.isabs(path):
            path = os.path.join(self.workdir, path)
        if self.bwrap is None:
            return Path(path)
        return host_path(self.mounts, path, write=write)

    def wrap(self, argv: list[str], cwd: str | None = None) -> list[str]:
        """``argv`` as run in the sandbox (in ``cwd``, default the work dir), in its cgroup."""
        if self.bwrap is not None:
            # (a holder that ended: its process id may be another's, so never named again)
            held = self.holder is not None and self.holder.poll() is None
            prefix = list(self._held if held else self.prefix)
            if cwd is not None:
                prefix[prefix.index("--chdir") + 1] = cwd
            argv = prefix + argv
        return self.cgroup.wrap(argv) if self.cgroup is not None else argv


class HostDeployment:
    """Episode directory + :class:`HostRuntime`; ``stop()`` leaves nothing behind."""

    def __init__(self, config: HostDeploymentConfig | None = None) -> None:
        self.config = config or HostDeploymentConfig()
        #: After :meth:`fork` without isolation: the parent's root -> this one's.
        self.moved_from: dict[str, str] = {}
        self._runtime: HostRuntime | None = None
        self._root: Path | None = None
        self._layout: EpisodeLayout | None = None
        #: A layered sandbox's work dir (:meth:`layered`): its read-only layers and base.
        self._layers: _Layers | None = None
        #: Set on a sandbox whose work dir is the base of layered ones: removed with the last.
        self._base: _Base | None = None

    async def start(self) -> None:
        """Create the episode directory and cgroup (bash starts with the first session)."""
        if self._runtime is not None:
            raise EnvError("this host deployment is already started")
        await self._set_up()

    async def fork(self) -> HostDeployment:
        """A new started sandbox of the same config whose directories (work dir, tools, home,
        temp) are copies of this one's, in its own episode directory and cgroup (``cp -a
        --reflink=auto``: shared blocks where the file system can, a full copy where not).
        No process is carried. Without isolation the copy's paths differ from this one's:
        ``moved_from`` maps this root to the copy's."""
        if self._root is None or self._layout is None:
            raise EnvError("the host deployment is not started; nothing to fork")
        child = HostDeployment(self.config)
        if self._layers is not None:  # copy only what was written on top of the layers
            await child._set_up(copy_from=self._root, layers=self._layers)
            return child
        layout = await child._set_up(copy_from=self._root)
        if layout.bwrap is None:
            child.moved_from = {str(self._root): str(layout.root)}
        return child

    def can_layer(self) -> bool:
        """Whether :meth:`layered` works here: bubblewrap, overlay mounts allowed to this
        process (root, tried once per process), and not layered already (its forks are
        cheap as it is)."""
        global _overlay_problem
        if self._layout is None or self._layout.bwrap is None or self._layers is not None:
            return False
        if _overlay_problem is None:
            _overlay_problem = _try_overlay(self._layout.root.parent) or ""
        return not _overlay_problem

    async def layered(self) -> HostDeployment:
        """A fork whose work dir is an overlay on this one's, which is frozen from now on:
        every process of this sandbox is ended first, and nothing may run in it again (its
        files stay until it and every sandbox layered on it are stopped). The fork's own
        forks copy only what was written on top of the layers (:meth:`fork`), so they cost
        what the agent changed, not the size of the repository. Needs :meth:`can_layer`."""
        if self._root is None or self._layout is None or not self.can_layer():
            raise EnvError("this host sandbox cannot be layered (bubblewrap and root needed)")
        await self.kill_processes()
        if self._base is None:
            self._base = _Base(self._root, self._layout.cgroup)
        child = HostDeployment(self.config)
        await child._set_up(
            copy_from=self._root, layers=_Layers(self._base, [self._root / "work"], None)
        )
        return child

    async def _set_up(
        self, copy_from: Path | None = None, layers: _Layers | None = None
    ) -> EpisodeLayout:
        # File-system work on a thread: hundreds of episodes may start at once. If the
        # caller gives up meanwhile, what the thread made is removed when it is done.
        made = asyncio.ensure_future(asyncio.to_thread(self._prepare, copy_from, layers))
        try:
            layout = await asyncio.shield(made)
        except asyncio.CancelledError:
            made.add_done_callback(self._discard)
            raise
        self._root = layout.root
        self._layout = layout
        self._runtime = HostRuntime(layout, self.config)
        try:
            await layout.hold_stage()
        except Exception as exc:  # each command stages its mounts, as without a holder
            log.info("the staged mounts are not held (%s: %s)", type(exc).__name__, exc)
        return layout

    def _discard(self, made: asyncio.Future[EpisodeLayout]) -> None:
        """A set-up whose caller gave up: what the thread made is removed (then the layers
        it stood on are let go)."""
        if made.cancelled() or made.exception() is not None:
            return
        layout = made.result()
        layers, self._layers = self._layers, None

        def remove() -> None:
            layout.close_namespace()
            _remove_episode(layout.root, layout.cgroup)
            if layers is not None:
                layers.release()

        # Not a daemon: an interrupted run's exit waits until the directory is gone.
        threading.Thread(target=remove).start()

    def _prepare(
        self, copy_from: Path | None = None, layers: _Layers | None = None
    ) -> EpisodeLayout:
        global _unisolated
        bwrap, uid = self._isolation()
        if bwrap is None:
            _unisolated = True  # it can write anywhere: nothing is read-only from now on
        else:
            _writable_sources.update(
                os.path.realpath(m.host) for m in bind_mounts(self.config.binds, writable=True)
            )
        if which(self.config.bash) is None:
            raise EnvStartError(f"{self.config.bash!r} is not on PATH; install bash")
        if self.config.base_dir:
            os.makedirs(self.config.base_dir, exist_ok=True)
        # The owner's pid is in the name: a run killed at any point leaves findable leftovers.
        root = Path(
            tempfile.mkdtemp(prefix=f"{EPISODE_PREFIX}{os.getpid()}-", dir=self.config.base_dir)
        )
        limits = self.config.limits
        cgroup, namespace = None, None
        try:
            mounted = limits.disk is not None and _mount_tmpfs(root, limits.disk)
            cgroup = cgroups.create(pids=limits.pids, memory=limits.memory)
            if layers is not None:
                assert copy_from is not None
                _copy_dirs(copy_from, root, ("tools", "tmp", "home"))
                self._layers = layers.stack(root, copy_from)
            elif copy_from is not None:
                _copy_dirs(copy_from, root)
            # After every mount of the episode directory; its commands enter it with nsenter.
            if bwrap is not None and mounted and which("nsenter") is not None:
                namespace = sandbox_namespace(root)
            return EpisodeLayout(self.config, root, bwrap, cgroup, uid, namespace)
        except BaseException:
            if namespace is not None:
                os.close(namespace)
            if self._layers is not None:
                self._layers.release()
                self._layers = None
            _remove_episode(root, cgroup)
            raise

    def _isolation(self) -> tuple[str | None, int | None]:
        """The bwrap executable (None: no isolation) and the uid the sandbox's root maps to."""
        global _fallback_warned
        config = self.config
        uid = sandbox_uid(config)
        if config.isolation == "none":
            return None, None
        problem = bwrap_problem(config.bwrap, uid)
        if problem is None:
            return find_bwrap(config.bwrap), uid
        if config.isolation == "bwrap":
            raise EnvStartError(f"isolation 'bwrap' does not work here: {problem}")
        if not _fallback_warned:
            _fallback_warned = True
            log.warning(
                "host sandboxes run WITHOUT isolation (%s); set isolation: none to "
                "accept that without this warning",
                problem,
            )
        return None, None

    async def stop(self) -> None:
        """Kill every process of the sandbox and remove its directory and cgroup; idempotent."""
        runtime, root = self._runtime, self._root
        if runtime is not None:
            await runtime.close()
        layout = self._layout
        if layout is not None:
            await layout.release_stage()
        if root is not None:
            self._root = None
            cgroup = layout.cgroup if layout is not None else None
            layers, self._layers = self._layers, None
            base = self._base

            def remove() -> None:
                if layout is not None:
                    layout.close_namespace()
                if base is not None:  # the files stay while a layered sandbox stands on them
                    base.close()
                else:
                    _remove_episode(root, cgroup)

            await asyncio.to_thread(remove)
            if layers is not None:
                await asyncio.to_thread(layers.release)
        elif layout is not None:
            await asyncio.to_thread(layout.close_namespace)

    async def sandbox_alive(self) -> bool:
        """Whether the sandbox (its directory and runtime) is up, whatever its sessions do."""
        return self._runtime is not None and not self._runtime.closed and self._root is not None

    async def kill_processes(self) -> None:
        """End every process of the sandbox (the agent's, before grading); files stay."""
        if self._runtime is not None:
            await self._runtime.kill_processes()

    @property
    def runtime(self) -> HostRuntime:
        """The runtime (after :meth:`start`)."""
        if self._runtime is None:
            raise EnvError("the host deployment is not started; await start() first")
        return self._runtime

    async def is_alive(self) -> bool:
        """Whether the runtime is started, not stopped, and its sessions live."""
        if self._runtime is None or self._root is None:
            return False
        return bool(await self._runtime.is_alive())

    @property
    def workdir(self) -> str | None:
        """The episode's work dir as the session sees it (None before start)."""
        return self._runtime.layout.workdir if self._runtime else None

    @property
    def tools_dir(self) -> str | None:
        """Where tools go, as the session sees it (None before start)."""
        return self._runtime.layout.tools_dir if self._runtime else None

    @property
    def root(self) -> Path | None:
        """The episode directory on the host (None before start and after stop)."""
        return self._root

    def sees_host_files(self) -> bool:
        """Whether the sandbox runs without isolation (its paths are the host's), once started."""
        return self._layout is not None and self._layout.bwrap is None and self._root is not None

    def start_environment(self) -> dict[str, str] | None:
        """The environment a one-off command of :meth:`AgentEnv.execute` starts with when given
        none (the layout's, which the cgroup's ``sh`` and bubblewrap pass on as they get it),
        without running one; ``None`` before the start and with ``bwrap_args`` (they may set
        variables)."""
        layout = self._layout
        if layout is None or self.config.bwrap_args:
            return None
        return dict(layout.env)

    def read_only_source(self, path: str) -> str | None:
        """The host path that ``path`` in the sandbox shows, when neither this sandbox nor
        any other of this process can change anything at or below it: a read-only bind (of
        a system directory or ``ro_binds``) with nothing writable below it, whose source no
        sandbox of this process binds writable, and no sandbox of this process without
        isolation (it could write anywhere). ``None`` otherwise; always without bwrap, and
        with ``bwrap_args`` (they may bind more)."""
        layout = self._layout
        if layout is None or layout.bwrap is None or self.config.bwrap_args or _unisolated:
            return None
        source = read_only_source(layout.mounts, path)
        if source is None:
            return None
        real = os.path.realpath(source)
        for written in tuple(_writable_sources):  # (a copy: other starts add to it on threads)
            if real == written or real.startswith(written + "/") or written.startswith(real + "/"):
                return None
        return source

    @property
    def writable_places(self) -> list[str] | None:
        """Under bwrap, the sandbox paths commands may write to (the rest is read-only)."""
        layout = self._layout
        if layout is None or layout.bwrap is None:
            return None
        return writable_places(layout.mounts, layout.workdir)


def sandbox_uid(config: HostDeploymentConfig) -> int | None:
    """The host uid bwrap runs as and maps the sandbox's root to (None: this process's)."""
    uid = config.sandbox_uid
    if uid is None and os.geteuid() == 0:
        uid = SANDBOX_UID
    return None if uid == 0 else uid


EPISODE_PREFIX = "uniagent-"
#: The host uid (and gid) a bwrap sandbox's root maps to when uniagent runs as root.
SANDBOX_UID = 65534
_fallback_warned = False
#: Whether a host sandbox of this process ran without isolation, and the host paths sandboxes
#: of this process bind writable (:meth:`HostDeployment.read_only_source`).
_unisolated = False
_writable_sources: set[str] = set()
_mount_warned = False


def _mount_tmpfs(root: Path, size: int) -> bool:
    """Make ``root`` a tmpfs of ``size`` bytes (the disk limit); warn once where not allowed.
    Whether it is mounted."""
    global _mount_warned
    problem = _libc_call("mount", b"uniagent-episode", os.fsencode(root), b"tmpfs", 0,
                         f"size={size},mode=0755".encode())  # fmt: skip
    if problem is not None and not _mount_warned:
        _mount_warned = True
        log.warning(
            "no disk limit for host sandboxes: mounting a tmpfs failed (%s); run as root or set "
            "limits.disk: null",
            problem,
        )
    return problem is None


def _libc_call(name: str, *args: Any) -> str | None:
    """:func:`~uniagent.env.mountns.libc_call`; the error's text, if any."""
    try:
        libc_call(name, *args)
    except OSError as exc:
        return exc.strerror
    return None


def _copy_dirs(
    source: Path, root: Path, names: tuple[str, ...] = ("work", "tools", "tmp", "home")
) -> None:
    """Copy an episode's directories into ``root`` (owners, modes, times, links kept)."""
    subs = [str(source / sub) for sub in names]
    done = subprocess.run(
        ["cp", "-a", "--reflink=auto", "--", *subs, str(root)], capture_output=True, text=True
    )
    if done.returncode != 0:
        raise EnvStartError(f"copying the sandbox's directories failed: {done.stderr.strip()}")


#: Why overlay mounts do not work for this process ("" where they do; None: not tried).
_overlay_problem: str | None = None
#: Where a layered sandbox keeps its own layer (the upper dir and overlay's scratch dir),
#: and a base the snapshots of its layered sandboxes' writes (in their episode directory,
#: out of every sandbox's reach).
_LAYERS = ".layers"


def _try_overlay(parent: Path) -> str | None:
    """Why an overlay mount fails under ``parent`` (None: it works)."""
    probe = Path(tempfile.mkdtemp(prefix=".uniagent-overlay-", dir=parent))
    try:
        for sub in ("lower", "upper", "scratch", "merged"):
            (probe / sub).mkdir()
        problem = _mount_overlay(probe / "merged", [probe / "lower"], probe / "upper",
                                 probe / "scratch")  # fmt: skip
        if problem is None:
            _libc_call("umount2", os.fsencode(probe / "merged"), MNT_DETACH)
        return problem
    finally:
        shutil.rmtree(probe, ignore_errors=True)


def _mount_overlay(target: Path, lowers: list[Path], upper: Path, scratch: Path) -> str | None:
    paths = [str(p) for p in (*lowers, upper, scratch)]
    if any(c in p for p in paths for c in ",:\\"):
        return "a path holds ',', ':' or a backslash"
    options = f"lowerdir={':'.join(paths[:-2])},upperdir={paths[-2]},workdir={paths[-1]}"
    if len(options) >= 4000:
        return "too many layers for one mount"
    return _libc_call(
        "mount", b"uniagent-layers", os.fsencode(target), b"overlay", 0, options.encode()
    )


class _Base:
    """A frozen sandbox whose work dir is the lowest layer of layered sandboxes: its
    directory (which also keeps their snapshots) is removed when it and all of them are."""

    def __init__(self, root: Path, cgroup: SandboxCgroup | None) -> None:
        self.root, self.cgroup = root, cgroup
        self.users = 0
        self.closed = False
        self._lock = threading.Lock()
        self._snapshots = itertools.count()

    def take(self) -> None:
        with self._lock:
            self.users += 1

    def snapshot_dir(self) -> Path:
        with self._lock:
            return self.root / _LAYERS / f"snapshot-{next(self._snapshots)}"

    def release(self) -> None:
        with self._lock:
            self.users -= 1
            gone = self.closed and self.users == 0
        if gone:
            _remove_episode(self.root, self.cgroup)

    def close(self) -> None:
        with self._lock:
            self.closed = True
            gone = self.users == 0
        if gone:
            _remove_episode(self.root, self.cgroup)


class _Layers:
    """A layered sandbox's work dir: read-only ``lowers`` (top first, the base's work dir
    last) and an upper dir of its own, mounted as an overlay on its ``work``."""

    def __init__(self, base: _Base, lowers: list[Path], upper: Path | None) -> None:
        self.base, self.lowers, self.upper = base, lowers, upper

    def stack(self, root: Path, parent: Path) -> _Layers:
        """The layers of a new sandbox at ``root`` on top of these: what was written on top
        of them in the sandbox at ``parent`` (its upper dir) is copied as a new layer."""
        lowers = list(self.lowers)
        self.base.take()
        try:
            if self.upper is not None:
                snapshot = self.base.snapshot_dir()
                snapshot.parent.mkdir(exist_ok=True)
                done = subprocess.run(
                    ["cp", "-a", "--reflink=auto", "--", str(self.upper), str(snapshot)],
                    capture_output=True, text=True,
                )  # fmt: skip
                if done.returncode != 0:
                    raise EnvStartError(f"copying the sandbox's writes failed: {done.stderr}")
                lowers.insert(0, snapshot)
            own = root / _LAYERS
            upper, scratch = own / "upper", own / "scratch"
            for path in (own, upper, scratch, root / "work"):
                path.mkdir(exist_ok=True)
            below = os.stat(lowers[0])  # the merged root's owner and mode are the upper's
            os.chown(upper, below.st_uid, below.st_gid)
            os.chmod(upper, stat.S_IMODE(below.st_mode))
            problem = _mount_overlay(root / "work", lowers, upper, scratch)
            if problem is not None:
                raise EnvStartError(f"mounting the sandbox's layers failed: {problem}")
        except BaseException:
            self.base.release()
            raise
        return _Layers(self.base, lowers, upper)

    def release(self) -> None:
        self.base.release()


def _remove_episode(root: Path, cgroup: SandboxCgroup | None) -> None:
    """End the sandbox's processes, unmount and remove its directory (blocking)."""
    if cgroup is not None:
        cgroup.remove()
    if os.path.ismount(root / "work"):  # a layered sandbox's overlay
        _libc_call("umount2", os.fsencode(root / "work"), MNT_DETACH)
    if os.path.ismount(root):
        _libc_call("umount2", os.fsencode(root), MNT_DETACH)
    shutil.rmtree(root, ignore_errors=True)


def cleanup_leftovers(base_dir: str | None = None) -> list[str]:
    """Remove what killed runs left: episode directories and cgroups of dead owners.

    Returns what was removed. Safe while other runs are going: only entries whose
    owner process no longer exists are touched.
    """
    removed = []
    for group in cgroups.leftovers():
        group.remove()
        removed.append(f"cgroup {group.name}")
    parent = Path(base_dir or tempfile.gettempdir())
    for entry in parent.glob(f"{EPISODE_PREFIX}*-*"):
        owner = entry.name[len(EPISODE_PREFIX) :].split("-", 1)[0]
        if not owner.isdigit() or cgroups._alive(int(owner)):
            continue
        _remove_episode(entry, None)
        removed.append(str(entry))
    return removed


def sandbox_environment(pass_env: list[str]) -> dict[str, str]:
    """The variables a sandbox starts with: :data:`PASS_ENV` plus ``pass_env``, if set here."""
    wanted = (*PASS_ENV, *pass_env)
    env = {
        name: value
        for name, value in os.environ.items()
        if any(fnmatch.fnmatchcase(name, pattern) for pattern in wanted)
    }
    env.setdefault("PATH", DEFAULT_PATH)
    env.setdefault("LANG", "C.UTF-8")
    return env
