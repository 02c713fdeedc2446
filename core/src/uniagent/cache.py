"""uniagent's download cache: a folder per artefact, built once per machine.

Downloads that tests, tools and harness installs need (tokenizers, wheels, npm CLIs)
live in ``$UNIAGENT_CACHE_DIR`` (default ``~/.cache/uniagent``). :func:`build_once`
makes a folder there safely under concurrency: the build runs under a file lock, into a
staging folder beside the target that is renamed into place, so a folder that exists is
complete and a failed build leaves nothing behind.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path


def cache_dir() -> Path:
    """The folder for downloaded artefacts: ``$UNIAGENT_CACHE_DIR`` or ``~/.cache/uniagent``."""
    env = os.environ.get("UNIAGENT_CACHE_DIR")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "uniagent"


@contextlib.contextmanager
def file_lock(path: Path) -> Iterator[None]:
    """An exclusive ``flock`` on ``path`` (created) for the block; other processes wait."""
    import fcntl

    with open(path, "a+") as handle:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle.fileno(), fcntl.LOCK_UN)


def build_once(
    target: Path, build: Callable[[Path], None], *, done: Callable[[Path], bool]
) -> Path:
    """``target``, made by ``build(staging)`` unless ``done(target)`` already holds.

    Safe for concurrent callers (threads or processes): one builds under a lock on
    ``.NAME.lock`` beside ``target``, the others wait and then find it done. The staging
    folder is made readable by every user (a sandbox's own user reads caches), and an
    incomplete ``target`` left by an older layout is replaced. ``build``'s exceptions
    propagate; nothing of a failed build is left.
    """
    if done(target):
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with file_lock(target.parent / f".{target.name}.lock"):
        if done(target):  # another caller finished while this one waited
            return target
        staging = Path(tempfile.mkdtemp(prefix=".staging-", dir=target.parent))
        try:
            build(staging)
            staging.chmod(0o755)  # mkdtemp's 0700
            if target.exists():
                shutil.rmtree(target)
            os.replace(staging, target)  # atomic on one filesystem
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    return target


@contextlib.contextmanager
def named_lock(name: str) -> Iterator[None]:
    """A machine-wide exclusive lock called ``name`` (a file under ``cache_dir()/locks``), for
    work outside the cache that must run once at a time, such as building an image tag."""
    folder = cache_dir() / "locks"
    folder.mkdir(parents=True, exist_ok=True)
    with file_lock(folder / re.sub(r"[^A-Za-z0-9_.-]", "_", name)):
        yield


def file_digest(path: Path) -> str:
    """The SHA-256 of a file, read in chunks; of a folder, over its files' paths and bytes."""
    digest = hashlib.sha256()
    if path.is_dir():
        for item in sorted(p for p in path.rglob("*") if p.is_file()):
            name = item.relative_to(path).as_posix().encode()
            digest.update(b"%d:%s:%s\n" % (len(name), name, file_digest(item).encode()))
        return digest.hexdigest()
    with path.open("rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()
