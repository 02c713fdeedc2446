"""One control group per host sandbox: every process it starts is found, limited and killed.

A process group is not enough: ``setsid`` and daemons leave it, and a killed run
leaves them running. The kernel's control groups hold every descendant
whatever it does. Each sandbox gets a group (named ``uniagent-<owner pid>-<id>``
so that leftovers of a dead run can be told apart) in the cgroup v2 hierarchy
(``cgroup.kill`` ends all of it at once) and, where they are mounted, in the v1
``pids`` and ``memory`` hierarchies (the limits). The sandbox's first process
moves itself in before it ``exec``s bash or bubblewrap, so nothing it starts is
ever outside.

Needs write access to the hierarchies (root, or a delegated subtree). Without
it :func:`create` returns ``None``: processes are then ended through the
session's process group (and, with bubblewrap, its PID namespace).
"""

from __future__ import annotations

import contextlib
import errno
import functools
import logging
import os
import secrets
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path

log = logging.getLogger(__name__)

PREFIX = "uniagent-"
_warned = False


@dataclass(frozen=True)
class Hierarchy:
    """A mounted cgroup hierarchy and this process's group in it."""

    version: int
    controller: str  # "" for v2 (no controller needed), else the v1 controller name
    root: Path  # the mount point
    own: str  # this process's group path in it

    @property
    def parent(self) -> Path:
        """Where this process's sandbox groups are made."""
        return self.root / self.own.lstrip("/")


def _hierarchies() -> list[Hierarchy]:
    """The writable-looking hierarchies with this process's group in each. The mount table
    is read once per group this process is in: it grows by a mount per sandbox with a disk
    limit (a thousand sandboxes, a thousand lines parsed at every start)."""
    try:
        own = Path("/proc/self/cgroup").read_text()
    except OSError:
        return []
    return list(_hierarchies_of(own))


@functools.lru_cache(maxsize=4)
def _hierarchies_of(own_text: str) -> tuple[Hierarchy, ...]:
    try:
        mounts = Path("/proc/self/mountinfo").read_text().splitlines()
    except OSError:
        return ()
    own = own_text.splitlines()
    groups: dict[str, str] = {}
    for line in own:
        _, controllers, path = line.split(":", 2)
        for name in controllers.split(",") if controllers else [""]:
            groups[name] = path
    found = []
    for line in mounts:
        left, _, right = line.partition(" - ")
        fields, kind = left.split(), right.split()
        if not kind:
            continue
        point, fstype, options = fields[4], kind[0], kind[-1].split(",")
        if fstype == "cgroup2" and "" in groups:
            found.append(Hierarchy(2, "", Path(point), groups[""]))
        elif fstype == "cgroup":
            for name in ("pids", "memory"):
                if name in options and name in groups:
                    found.append(Hierarchy(1, name, Path(point), groups[name]))
    return tuple(found)


@dataclass
class SandboxCgroup:
    """The groups of one sandbox (one per hierarchy) and their limits."""

    name: str
    paths: list[Path] = field(default_factory=list)
    v2: Path | None = None

    def wrap(self, argv: list[str]) -> list[str]:
        """``argv`` started inside the groups (a shell moves itself in, then execs ``argv``)."""
        moves = " && ".join(f'echo $$ > "{p}/cgroup.procs"' for p in self.paths)
        return ["/bin/sh", "-c", f'{moves} && exec "$@"', "uniagent-cgroup", *argv]

    def pids(self) -> list[int]:
        """Every process in the sandbox's groups."""
        found: set[int] = set()
        for path in self.paths:
            with contextlib.suppress(OSError):
                found.update(int(p) for p in (path / "cgroup.procs").read_text().split())
        return sorted(found)

    def kill(self, timeout: float = 30.0) -> bool:
        """SIGKILL every process of the sandbox; True when none is left (blocking: a thread).
        An empty group is left as it is: no process is in it to start another, and none is
        moved in while the sandbox closes, so a sandbox whose processes already ended (the
        usual close) costs one read a group."""
        deadline = time.monotonic() + timeout
        left = self.pids()
        while left:
            if time.monotonic() > deadline:
                log.warning("cgroup %s still holds %s after SIGKILL", self.name, left)
                return False
            if self.v2 is not None:
                with contextlib.suppress(OSError):
                    (self.v2 / "cgroup.kill").write_text("1")
            for pid in left:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
            left = self.pids()
            if left:
                time.sleep(0.01)  # dying processes leave their group as the kernel reaps them
                left = self.pids()
        return True

    def remove(self, timeout: float = 10.0) -> None:
        """Kill what is left and remove the groups (blocking: a thread). A group whose last
        processes were killed may still count them until their parent reaps them (the
        kernel refuses its removal with EBUSY, though ``cgroup.procs`` lists none): its
        removal is tried again until ``timeout``, then left with a warning (a later run's
        :func:`leftovers` removes it once this process is gone)."""
        self.kill()
        deadline = time.monotonic() + timeout
        for path in self.paths:
            while True:
                try:
                    path.rmdir()
                except FileNotFoundError:
                    break
                except OSError as exc:
                    if exc.errno != errno.EBUSY or time.monotonic() > deadline:
                        log.warning("could not remove the sandbox cgroup %s: %s", path, exc)
                        break
                    self.kill(max(0.0, deadline - time.monotonic()))
                    time.sleep(0.01)  # (the kernel's state, not a test's: polled)
                    continue
                break

    def memory_peak(self) -> int | None:
        """The most memory the sandbox used (bytes), where the kernel tells."""
        for path in self.paths:
            for name in ("memory.peak", "memory.max_usage_in_bytes"):
                with contextlib.suppress(OSError, ValueError):
                    return int((path / name).read_text())
        return None

    def oom_killed(self) -> bool:
        """Whether the memory limit made the kernel kill a process of the sandbox."""
        for path in self.paths:
            with contextlib.suppress(OSError):
                for line in (path / "memory.events").read_text().splitlines():
                    if line.startswith("oom_kill ") and int(line.split()[1]) > 0:
                        return True
            with contextlib.suppress(OSError):
                for line in (path / "memory.oom_control").read_text().splitlines():
                    if line.startswith("oom_kill ") and int(line.split()[1]) > 0:
                        return True
        return False

    def pids_refused(self) -> bool:
        """Whether the process limit refused a fork."""
        for path in self.paths:
            with contextlib.suppress(OSError, ValueError):
                for line in (path / "pids.events").read_text().splitlines():
                    if line.startswith("max ") and int(line.split()[1]) > 0:
                        return True
        return False


def create(*, pids: int | None, memory: int | None) -> SandboxCgroup | None:
    """A new sandbox group in every writable hierarchy, limits set; ``None`` if none is."""
    global _warned
    name = f"{PREFIX}{os.getpid()}-{secrets.token_hex(6)}"
    group = SandboxCgroup(name)
    for hierarchy in _hierarchies():
        path = hierarchy.parent / name
        try:
            path.mkdir()
        except OSError:
            continue
        try:
            if hierarchy.version == 2:
                group.v2 = path
                _v2_limits(path, pids, memory)
            elif hierarchy.controller == "pids" and pids is not None:
                (path / "pids.max").write_text(str(pids))
            elif hierarchy.controller == "memory" and memory is not None:
                (path / "memory.limit_in_bytes").write_text(str(memory))
                with contextlib.suppress(OSError):  # swap accounting may be off
                    (path / "memory.memsw.limit_in_bytes").write_text(str(memory))
        except OSError as exc:
            log.debug("cgroup %s: could not set a limit: %s", path, exc)
        group.paths.append(path)
    if not group.paths:
        if not _warned:
            _warned = True
            log.warning(
                "no writable cgroup hierarchy: sandbox processes that leave their process group "
                "(setsid, daemons) are not tracked and no process or memory limit applies "
                "(run as root or delegate a cgroup subtree)"
            )
        return None
    return group


def _v2_limits(path: Path, pids: int | None, memory: int | None) -> None:
    for name, value in (("pids.max", pids), ("memory.max", memory)):
        if value is not None and (path / name).exists():
            (path / name).write_text(str(value))
    if memory is not None and (path / "memory.swap.max").exists():
        (path / "memory.swap.max").write_text("0")


def leftovers() -> list[SandboxCgroup]:
    """Sandbox groups whose owner process is gone (a killed run's)."""
    groups: dict[str, SandboxCgroup] = {}
    for hierarchy in _hierarchies():
        with contextlib.suppress(OSError):
            for entry in hierarchy.parent.iterdir():
                if not entry.is_dir() or not entry.name.startswith(PREFIX):
                    continue
                owner = entry.name[len(PREFIX) :].split("-", 1)[0]
                if owner.isdigit() and _alive(int(owner)):
                    continue
                group = groups.setdefault(entry.name, SandboxCgroup(entry.name))
                group.paths.append(entry)
                if hierarchy.version == 2:
                    group.v2 = entry
    return list(groups.values())


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
