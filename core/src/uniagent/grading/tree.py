"""The graded tree judged on the file system, not on git's summary of it.

The patch screen reads what ``git diff`` shows. Code the tests import can sit
where that never looks:

- below a nested repository: ``git add`` records it as one gitlink line
  (``Subproject commit ...``), and a file of a submodule the task came with
  changes without any line of the patch;
- in a directory named ``.git`` below the root: git skips such a path whole;
- behind a symlink: the patch holds only the link's target, never the bytes the
  tests read through it, when it leads out of the repository or into a ``.git``
  (to a directory, or to or by the name of a code file: a venv's ``bin/python``
  made in the repository leads to the system's interpreter, and is no such link).

Before the patch is taken, in the episode's sandbox in both grading modes, the
grading listing (:data:`~uniagent.grading.scripts.LIST`, which also notes the
symlinks made since the baseline and where each leads) is judged against the
baseline's: a ``.git`` entry below the root that was not there, a name added or
a file changed below a nested repository of the baseline, a symlink made since
the baseline that leads out of the repository or into a ``.git``, and the
repository's own ``.git`` changed in kind are tampering (kind ``tree``). What
can go is removed before the patch is taken (a nested ``.git``, such a
symlink), so under ``on_tamper: report`` what was hidden is in the patch and
screened like the rest. A gitlink added or changed in the patch is tampering
too (:func:`gitlink_hits`): its files are in no patch.
"""

from __future__ import annotations

import fnmatch
import posixpath
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

from uniagent.grading.tamper import Tamper
from uniagent.protect.rules import CODE_PATTERNS

#: The rules of this module (all score; counted as ``patch_screen``).
NESTED_GIT = "nested-git"
SYMLINK_OUT = "symlink-outside"
GITLINK = "gitlink"
GIT_DIR = "git-dir"
#: Symlinks made since the baseline that the sandbox resolves at most; more is tampering.
MAX_LINKS = 10_000
#: Reports of one rule at most (the rest counted in the last one's detail).
MAX_REPORTS = 50


@dataclass
class Tree:
    """The grading listing, and what the walk noted since the baseline."""

    listing: dict[str, str]
    #: The repository's real path in the sandbox (symlinks resolved).
    real: str = ""
    #: (path, where it resolves, what is there: d, f or -) of the symlinks made or changed
    #: since the baseline.
    links: list[tuple[str, str, str]] = field(default_factory=list)
    #: How many such symlinks there are (``links`` holds at most :data:`MAX_LINKS`).
    links_total: int = 0
    #: Files changed since the baseline below the baseline's nested repositories.
    nested_changed: list[str] = field(default_factory=list)


def parse_links(data: bytes) -> tuple[str, list[tuple[str, str, str]]]:
    """The repository's real path and the (path, target, kind) of ``blob:links=``."""
    items = data.decode("utf-8", "surrogateescape").split("\0")
    if items and items[-1] == "":
        items.pop()
    if not items:
        return "", []
    real, rest = items[0], items[1:]
    return real, [(rest[i], rest[i + 1], rest[i + 2]) for i in range(0, len(rest) - 2, 3)]


#: Names a test run may import, load or run (a link to a file named otherwise, as a venv's
#: ``bin/python`` to the system's interpreter, carries no code the tests read as code).
_CODE_NAMES = tuple(p for p in CODE_PATTERNS if not p.endswith("/")) + (
    "*.pyc", "*.pyo", "*.pyi", "*.cfg", "*.ini", "*.toml", "*.sh",
)  # fmt: skip


def carries_code(path: str, where: str, kind: str) -> bool:
    """Whether a symlink at ``path`` to ``where`` (``kind`` there) can bring code in: it leads
    to a directory, or its name or its target's is a code file's."""
    names = (posixpath.basename(path), posixpath.basename(where))
    return kind == "d" or any(fnmatch.fnmatchcase(n, p) for n in names for p in _CODE_NAMES)


def nested_roots(listing: Mapping[str, str]) -> list[str]:
    """The directories below the root that hold a ``.git`` (nested repositories)."""
    roots = []
    for path in listing:
        parts = path.split("/")
        if len(parts) > 1 and parts[-1] == ".git" and ".git" not in parts[:-1]:
            roots.append("/".join(parts[:-1]))
    return sorted(roots)


def _git_entry(path: str) -> str | None:
    """The ``.git`` entry below the root that ``path`` is or lies in (``None``: none)."""
    parts = path.split("/")
    if parts[0] == ".git" or ".git" not in parts:
        return None
    return "/".join(parts[: parts.index(".git") + 1])


def leads_out(real: str, where: str) -> bool:
    """Whether ``where`` (a resolved path) is outside the repository at ``real``, or in a
    ``.git`` of it (where the screen does not look)."""
    if not real or not where or not posixpath.isabs(where):
        return True
    real = real.rstrip("/") or "/"
    if where != real and not where.startswith(real.rstrip("/") + "/"):
        return True
    inner = where[len(real) :].strip("/")
    return ".git" in inner.split("/")


def judge(before: Mapping[str, str], tree: Tree) -> tuple[list[Tamper], set[str]]:
    """The tree's tampering against the baseline's listing ``before``, and the paths to remove
    before the patch is taken."""
    found: dict[str, list[Tamper]] = {}
    remove: set[str] = set()

    def report(rule: str, path: str, change: str, detail: str) -> None:
        found.setdefault(rule, []).append(Tamper("tree", path, change, rule, True, detail))

    now = tree.listing
    if ".git" in before and before.get(".git") != now.get(".git"):
        was, kind = before[".git"], now.get(".git")
        change = "deleted" if kind is None else "modified"
        report(GIT_DIR, ".git", change, f"the repository's .git was of type {was}, now {kind}")
    entries: set[str] = set()
    roots = nested_roots(before)
    for path in now:
        entry = _git_entry(path)
        if entry is not None:
            if entry not in before and entry not in entries:
                entries.add(entry)
                report(NESTED_GIT, entry, "added", "a .git below the root: git skips what is "
                       "there or records a nested repository as one gitlink line")  # fmt: skip
            continue
        if roots and path not in before and any(path.startswith(r + "/") for r in roots):
            report(NESTED_GIT, path, "added", "new below a nested repository of the baseline")
    remove |= entries
    for path in tree.nested_changed:
        if path not in before:
            continue  # reported as added
        report(NESTED_GIT, path, "modified", "changed below a nested repository of the baseline")
    for path, where, kind in tree.links:
        if path.split("/")[0] == ".git" or _git_entry(path) is not None:
            continue  # removed with its .git, or git's own
        if leads_out(tree.real, where) and carries_code(path, where, kind):
            change = "modified" if before.get(path) == "l" else "added"
            report(SYMLINK_OUT, path, change, f"a symlink that leads to {where or '?'}")
            remove.add(path)
    if tree.links_total > len(tree.links):
        report(SYMLINK_OUT, ".", "added", f"{tree.links_total} symlinks made since the baseline, "
               f"more than the {len(tree.links)} judged")  # fmt: skip
    tampers: list[Tamper] = []
    for reports in found.values():
        if len(reports) > MAX_REPORTS:
            last = reports[MAX_REPORTS - 1]
            extra = f" (and {len(reports) - MAX_REPORTS} more of this rule)"
            reports = [*reports[: MAX_REPORTS - 1], replace(last, detail=last.detail + extra)]
        tampers += reports
    return tampers, remove


#: A gitlink (mode 160000) added or changed in one part of a ``git diff``.
_GITLINK = re.compile(
    r"(?m)^(?:new file mode|new mode) 160000$|^index [0-9a-f]+\.\.[0-9a-f]+ 160000$"
)


def gitlink_hits(parts: Sequence[tuple[str, str]]) -> list[Tamper]:
    """Tampering for each (path, diff text) of the patch that adds or changes a gitlink."""
    detail = "a gitlink: the nested repository's files are in no patch"
    return [
        Tamper("tree", path, "added", GITLINK, True, detail)
        for path, text in parts
        if _GITLINK.search(text.split("\n@@", 1)[0].split("\nGIT binary patch", 1)[0])
    ]
