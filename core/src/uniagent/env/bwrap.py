"""Bubblewrap (``bwrap``) isolation for host sessions: what is mounted where.

The sandbox sees the host's system directories read-only, a private work dir,
tools dir, ``/tmp`` and home (host directories of the episode, so host-side
file operations reach them), no host home, no network unless asked, and its
own PID namespace: when the outer ``bwrap`` dies (``--die-with-parent``), every
process of the sandbox dies with it.
"""

from __future__ import annotations

import functools
import os
import posixpath
import shutil
import stat
import subprocess
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from uniagent.env.errors import EnvError, EnvStartError

INSTALL_HINT = (
    "install bubblewrap: `apt-get install bubblewrap` (Debian/Ubuntu), "
    "`dnf install bubblewrap` (Fedora)"
)

#: Host directories the sandbox sees read-only (symlinks, as on merged-/usr systems, are kept
#: as symlinks).
SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc")


@dataclass(frozen=True)
class Mount:
    """A host directory and where the sandbox sees it (``inside`` normalised)."""

    inside: str
    host: str
    writable: bool

    def __post_init__(self) -> None:
        object.__setattr__(self, "inside", posixpath.normpath(self.inside))


def which(executable: str) -> str | None:
    """``shutil.which``, asked once per process for a name and ``PATH``: every sandbox start
    needs bash, bwrap and nsenter, and a lookup stats every ``PATH`` directory (slow while
    the kernel is busy with many mount namespaces, and some of it on the event loop)."""
    return _which(executable, os.environ.get("PATH"))


@functools.lru_cache(maxsize=64)
def _which(executable: str, path: str | None) -> str | None:
    return shutil.which(executable, path=path)


def find_bwrap(executable: str = "bwrap") -> str:
    """The path of ``bwrap``, or an :class:`EnvStartError` saying how to install it."""
    path = which(executable)
    if path is None:
        raise EnvStartError(
            f"isolation 'bwrap' needs the bwrap executable ({executable!r} is not on PATH); "
            + INSTALL_HINT
        )
    return path


_probes: dict[tuple[str, int | None], str | None] = {}


def bwrap_problem(executable: str = "bwrap", uid: int | None = None) -> str | None:
    """Why bubblewrap cannot isolate a session here (``None``: it can); probed once.

    The probe is a sandbox as sessions get it, with the system directories only: not a
    bind of ``/``, which bwrap remounts read-only mount by mount, so that a mount of
    another process (another run's episode tmpfs) going away meanwhile failed the probe
    (5 probes of 231 beside a loop that mounts and removes tmpfs dirs), and every bwrap
    sandbox of the process with it."""
    key = (executable, uid)
    if key not in _probes:
        path = shutil.which(executable)
        if path is None:
            _probes[key] = f"{executable!r} is not on PATH ({INSTALL_HINT})"
        else:
            argv = [*bwrap_argv(path, system_mounts(), chdir="/", network=False, uid=uid), "true"]
            try:
                done = subprocess.run(argv, capture_output=True, text=True, timeout=60)
                problem = done.stderr.strip()[-300:] or f"exit {done.returncode}"
                _probes[key] = None if done.returncode == 0 else f"`bwrap` fails here: {problem}"
            except (OSError, subprocess.TimeoutExpired) as exc:
                _probes[key] = f"`bwrap` fails here: {exc}"
    return _probes[key]


def drop_privileges(uid: int | None, mount_namespace: str | None = None) -> list[str]:
    """The prefix that runs a command as host ``uid`` (and gid, no other groups), in the
    mount namespace of the file ``mount_namespace`` where one is given: one ``nsenter``,
    whose ``--setuid``/``--setgid`` (the latter clearing the groups) do what ``setpriv``
    does for a millisecond less of each start. ``setpriv`` where ``nsenter`` is missing
    (then no sandbox has a namespace of its own to enter: host.py asks for one only where
    ``nsenter`` is found)."""
    if uid is None and mount_namespace is None:
        return []
    nsenter = which("nsenter")
    if nsenter is None:
        assert mount_namespace is None, "a namespace is made only where nsenter is found"
        return ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups"]
    argv = [nsenter]
    if mount_namespace is not None:
        argv.append(f"--mount={mount_namespace}")
    if uid is not None:
        argv += [f"--setuid={uid}", f"--setgid={uid}"]
    return [*argv, "--"]


def bwrap_argv(
    bwrap: str,
    mounts: list[Mount],
    *,
    chdir: str,
    network: bool,
    extra_args: list[str] | tuple[str, ...] = (),
    uid: int | None = None,
    mount_namespace: str | None = None,
) -> list[str]:
    """The ``bwrap ...`` prefix that runs a command with ``mounts`` (in order) and ``chdir``,
    started as ``uid`` in ``mount_namespace`` where given (:func:`drop_privileges`)."""
    argv = [
        *drop_privileges(uid, mount_namespace),
        bwrap,
        "--die-with-parent",
        "--unshare-all",
        "--new-session",
        "--hostname",
        "sandbox",
    ]
    if uid is not None:
        # A user namespace: the sandbox's root is host ``uid`` for every host file it reaches.
        argv += ["--unshare-user", "--uid", "0", "--gid", "0"]
    if network:
        argv.append("--share-net")
    for path in SYSTEM_DIRS:
        if os.path.islink(path):
            argv += ["--symlink", os.readlink(path), path]
    # Parents before children: a mount hides whatever was mounted below its path before it
    # (a private /tmp would hide a bind of /tmp/data made earlier).
    for mount in sorted(mounts, key=lambda m: len(PurePosixPath(m.inside).parts)):
        argv += ["--bind" if mount.writable else "--ro-bind", mount.host, mount.inside]
    # Nothing outside the mounts is writable: bwrap's own root is a tmpfs in this host's RAM.
    argv += ["--proc", "/proc", "--dev", "/dev", "--chdir", chdir, *extra_args]
    return [*argv, "--remount-ro", "/"]


#: Brings host paths into a private mount namespace, then runs the rest of the command line:
#: ``sh -c STAGE_SCRIPT stage POINT SRC1 NAME1 SRC2 NAME2 ... -- command...``.
STAGE_SCRIPT = (
    'set -e; point=$1; shift; mount -t tmpfs -o mode=0711,size=64k uniagent-stage "$point"; '
    'while [ "$1" != "--" ]; do '
    'if [ -d "$1" ]; then mkdir -m 0755 "$point/$2"; else : > "$point/$2"; fi; '
    'mount --bind "$1" "$point/$2"; shift 2; done; shift; exec "$@"'
)
#: Directories that may hold the staging tmpfs (in the private mount namespace only).
STAGE_POINTS = ("/mnt", "/media", "/srv", "/opt", "/boot")


def reachable(path: str, uid: int) -> bool:
    """Whether host ``uid`` (gid the same, no other groups) can look ``path`` up.

    That is search permission on every directory above it, along the path as
    written and as resolved (a symlink is followed with the permissions of the
    directories it leads through). Mode bits only: a source that an ACL or a
    security module hides anyway makes bubblewrap fail with its own message.
    """
    for text in {os.path.abspath(path), os.path.realpath(path)}:
        for directory in reversed(PurePosixPath(text).parents):
            try:
                st = os.stat(directory)
            except OSError:
                return False
            if st.st_uid == uid:
                bit = stat.S_IXUSR
            elif st.st_gid == uid:
                bit = stat.S_IXGRP
            else:
                bit = stat.S_IXOTH
            if not st.st_mode & bit:
                return False
    return True


def stage_mounts(mounts: list[Mount], uid: int) -> tuple[list[Mount], list[str]]:
    """Mounts whose sources are staged where the sandbox's user reaches them, and the prefix.

    An unprivileged bubblewrap (the sandbox's root mapped to an ordinary host
    uid) can bind only what that uid can reach; ``/root/.pyenv`` or a work dir
    under a 0700 directory it cannot. So, in a private mount namespace that no
    other process sees, a small tmpfs is mounted on an unused directory and
    each such source is bind-mounted (by root) onto an entry of it; bubblewrap
    binds those entries. Sources ``uid`` reaches itself (the episode's own
    directories on their tmpfs, as a rule) are bound directly: then no prefix
    at all (a staging shell, ``unshare`` and a ``mount`` per source would
    cost four fifths of a sandbox's start).
    """
    if all(
        (m.inside in SYSTEM_DIRS and m.host == m.inside) or reachable(m.host, uid) for m in mounts
    ):
        return list(mounts), []
    sources = [m.host for m in mounts]
    point = next(
        (
            p
            for p in STAGE_POINTS
            if os.path.isdir(p) and not any(s == p or s.startswith(p + "/") for s in sources)
        ),
        None,
    )
    if point is None:
        raise EnvStartError(
            "no directory to stage the sandbox's mounts in (one of "
            + ", ".join(STAGE_POINTS)
            + " must exist); or set sandbox_uid: 0"
        )
    staged, pairs = [], []
    for i, mount in enumerate(mounts):
        if (mount.inside in SYSTEM_DIRS and mount.host == mount.inside) or reachable(
            mount.host, uid
        ):
            staged.append(mount)
            continue
        pairs += [mount.host, str(i)]
        staged.append(Mount(inside=mount.inside, host=f"{point}/{i}", writable=mount.writable))
    prefix = [
        "unshare",
        "--mount",
        "--propagation",
        "private",
        "/bin/sh",
        "-c",
        STAGE_SCRIPT,
        "stage",
        point,
        *pairs,
        "--",
    ]
    return staged, prefix


def system_mounts() -> list[Mount]:
    """Read-only mounts of the host's system directories (that exist and are not symlinks)."""
    return [
        Mount(inside=path, host=path, writable=False)
        for path in SYSTEM_DIRS
        if os.path.isdir(path) and not os.path.islink(path)
    ]


def writable_places(mounts: list[Mount], workdir: str) -> list[str]:
    """The sandbox paths commands may write to, the work dir first (the rest is read-only)."""
    inside = {m.inside for m in mounts if m.writable}
    return sorted(inside, key=lambda p: (p != workdir, p != "/tmp", p))


def bind_mounts(specs: list[str] | tuple[str, ...], *, writable: bool) -> list[Mount]:
    """Mounts for ``PATH`` or ``HOST:INSIDE`` entries; a host path that is missing is an error."""
    mounts = []
    for spec in specs:
        host, _, inside = spec.partition(":")
        host, inside = os.path.abspath(host), inside or os.path.abspath(host)
        if not os.path.exists(host):
            raise EnvStartError(f"bind {spec!r}: {host} does not exist on this machine")
        if not os.path.isabs(inside):
            raise EnvStartError(f"bind {spec!r}: the sandbox path must be absolute")
        mounts.append(Mount(inside=os.path.normpath(inside), host=host, writable=writable))
    return mounts


def host_path(mounts: list[Mount], path: str, *, write: bool) -> Path:
    """Where the sandbox path ``path`` lives on the host; refuses paths the sandbox cannot see.

    Symlinks are resolved on the host and the result must still lie in a mount,
    so a link made inside the sandbox cannot make a host-side file operation
    read or write outside it.
    """
    inside = PurePosixPath(os.path.normpath(path))
    for link in SYSTEM_DIRS:  # /bin -> usr/bin inside as outside
        root = PurePosixPath(link)
        if os.path.islink(link) and (inside == root or root in inside.parents):
            inside = PurePosixPath(os.path.realpath(link)) / inside.relative_to(root)
    mount = _mount_of(mounts, inside)
    if mount is None:
        raise EnvError(
            f"{path!r} is outside what the sandbox shares with the host ("
            + ", ".join(m.inside for m in mounts)
            + "); reach it with a command instead (run_action)"
        )
    relative = inside.relative_to(mount.inside)
    candidate = Path(mount.host, relative)
    real = Path(os.path.realpath(candidate))
    owner = next((m for m in mounts if real == Path(m.host) or Path(m.host) in real.parents), None)
    if owner is None:
        raise EnvError(
            f"{path!r} resolves (through a symlink) outside the sandbox; refusing to follow it"
        )
    if write and not owner.writable:
        raise EnvError(f"{path!r} is read-only inside the sandbox")
    return candidate


def read_only_source(mounts: list[Mount], path: str) -> str | None:
    """The host path that the sandbox path ``path`` shows when nothing at or below it is
    writable in the sandbox (a read-only mount, no writable one at or under ``path``);
    ``None`` otherwise (outside every mount too). A path through one of the system
    directories the sandbox has as a symlink (``/bin`` -> ``usr/bin`` on merged-/usr
    systems; the link lies on the read-only root) is taken where the link leads."""
    inside = _through_system_link(mounts, PurePosixPath(os.path.normpath(path)))
    mount = _mount_of(mounts, inside)
    if mount is None or mount.writable:
        return None
    text = str(inside)
    if any(other.writable and _at_or_below(other.inside, text) for other in mounts):
        return None
    return str(PurePosixPath(mount.host) / inside.relative_to(mount.inside))


def _through_system_link(mounts: list[Mount], inside: PurePosixPath) -> PurePosixPath:
    """``inside`` with a leading system directory that is a symlink (as :func:`bwrap_argv`
    makes it in the sandbox) replaced by where the link leads; as it is otherwise."""
    if len(inside.parts) < 2:
        return inside
    top = PurePosixPath("/", inside.parts[1])
    if str(top) not in SYSTEM_DIRS or not os.path.islink(top):
        return inside
    if any(_at_or_below(m.inside, str(top)) for m in mounts):
        return inside  # a mount there (never with the link): as it is
    target = PurePosixPath(os.path.normpath(os.path.join(str(top.parent), os.readlink(top))))
    return PurePosixPath(target, *inside.parts[2:])


def _mount_of(mounts: list[Mount], inside: PurePosixPath) -> Mount | None:
    """The deepest mount at or above ``inside`` (the first of equally deep ones)."""
    path, best, depth = str(inside), None, -1
    for mount in mounts:
        if _at_or_below(path, mount.inside):
            level = 0 if mount.inside == "/" else mount.inside.count("/")
            if level > depth:
                best, depth = mount, level
    return best


def _at_or_below(path: str, root: str) -> bool:
    """Whether the normalised absolute ``path`` is ``root`` or lies below it (strings, not
    ``PurePosixPath.parents``: asked for every directory of a test environment)."""
    return path == root or path.startswith(root.rstrip("/") + "/")
