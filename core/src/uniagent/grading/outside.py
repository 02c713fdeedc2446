"""Paths outside the repository that the benchmark owns: snapshotted at the baseline, put back
before grading.

Some task sets keep their tests or their test runner outside the checkout
(R2E-Gym: ``/root/run_tests.sh`` and ``/root/r2e_tests``), where the protect rules
(repository paths) do not reach. A reward names them in its
:class:`~uniagent.protect.settings.Workspace` (``outside_paths``): files,
symlinks and whole directories. Their bytes are kept in this process at the
baseline; before grading, in the sandbox where the tests run, a changed or
deleted one is put back, a new one inside a protected directory removed, and
each change reported (rule ``outside-paths``).
"""

from __future__ import annotations

import base64
import io
import posixpath
import tarfile

from uniagent.grading import scripts
from uniagent.grading.integrity import (
    Baseline,
    Member,
    Tamper,
    blob,
    nul_list,
    pack,
    pack_bounded,
    run_script,
    tar_bound,
)
from uniagent.grading.sandbox import GradingSandbox

RULE = "outside-paths"

#: ``blob:list=``: ``TYPE /PATH\0`` for every entry of the paths of $PATHS (one a line).
LIST_OUTSIDE = r"""
set -o pipefail
printf 'blob:list='
while IFS= read -r p; do
  if [ -e "$p" ] || [ -L "$p" ]; then find "$p" -printf '%y %p\0' 2>/dev/null; fi
done < "$PATHS" | base64 -w0 || exit 4
echo
exit 0
"""


async def _listing(sandbox: GradingSandbox, paths: tuple[str, ...]) -> dict[str, str]:
    listed = f"{sandbox.scratch}/outside"
    lines = "".join(f"{p}\n" for p in paths)
    await sandbox.stage_bytes(listed, lines.encode("utf-8", "surrogateescape"))
    output = await run_script(
        sandbox,
        LIST_OUTSIDE,
        {"PATHS": listed},
        what="listing the task's paths outside the repository",
    )
    found: dict[str, str] = {}
    for item in nul_list(blob(output, "list")):
        kind, _, path = item.partition(" ")
        if path.startswith("/"):
            found[path] = kind
    return found


async def snapshot(
    sandbox: GradingSandbox, baseline: Baseline, paths: tuple[str, ...], limit: int
) -> None:
    """Keep the bytes of ``paths`` (absolute) in ``baseline`` (before the agent's first turn)."""
    paths = tuple(posixpath.normpath(p) for p in paths if p.startswith("/"))
    baseline.outside_paths = paths
    if not paths:
        return
    listing = await _listing(sandbox, paths)
    baseline.outside_dirs = {p for p, kind in listing.items() if kind == "d"}
    files = [p.lstrip("/") for p, kind in listing.items() if kind in "fl"]
    members = await pack(sandbox, "/", files, limit)
    baseline.outside = {"/" + path: member for path, member in members.items()}


async def screen(sandbox: GradingSandbox, baseline: Baseline) -> list[Tamper]:
    """Put the outside paths back as they were; what had changed."""
    if not baseline.outside_paths:
        return []
    listing = await _listing(sandbox, baseline.outside_paths)
    now = [p.lstrip("/") for p, kind in listing.items() if kind in "fl"]
    # (at most what the snapshot's files took: one listed but not read within that bound,
    # the pack cut in or before it, counts as modified, whatever its bytes)
    packed = await pack_bounded(sandbox, "/", now, tar_bound(baseline.outside))
    current = {"/" + p: m for p, m in packed.items()}
    tampered: list[Tamper] = []
    remove: list[str] = []
    put_back: list[str] = []
    for path, before in baseline.outside.items():
        member = current.get(path)
        if member is not None and member.same(before):
            continue
        if member is not None or listing.get(path):
            remove.append(path)
        put_back.append(path)
        tampered.append(
            Tamper(
                "protected_file",
                path,
                "deleted" if member is None and not listing.get(path) else "modified",
                RULE,
            )
        )
    for path in listing:
        if path in baseline.outside or path in baseline.outside_dirs:
            continue
        remove.append(path)
        tampered.append(Tamper("protected_file", path, "added", RULE))
    if remove or put_back:
        await _restore(sandbox, baseline.outside, sorted(set(remove)), put_back)
    return tampered


async def _restore(
    sandbox: GradingSandbox, snapshot_: dict[str, Member], remove: list[str], put_back: list[str]
) -> None:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:") as tar:
        for path in put_back:
            member = snapshot_[path]
            info = tarfile.TarInfo(path.lstrip("/"))
            info.mode = member.mode
            if member.kind == "l":
                info.type, info.linkname = tarfile.SYMTYPE, member.link
                tar.addfile(info)
            else:
                info.size = len(member.data)
                tar.addfile(info, io.BytesIO(member.data))
    s = sandbox.scratch
    listed = b"".join(p.lstrip("/").encode("utf-8", "surrogateescape") + b"\0" for p in remove)
    await sandbox.stage_bytes(f"{s}/outside-remove", listed)
    await sandbox.stage_bytes(f"{s}/outside-rmdirs", b"")
    await sandbox.write_file(f"{s}/outside.b64", base64.b64encode(buffer.getvalue()).decode())
    variables = {
        "REPO": "/",
        "REMOVE": f"{s}/outside-remove",
        "TAR": f"{s}/outside.b64",
        "RMDIRS": f"{s}/outside-rmdirs",
    }
    await run_script(sandbox, scripts.RESTORE, variables, what="restoring the outside paths")
