"""The agent's patch: taken from the sandbox, split into its files, scanned, applied.

Before grading, the agent's whole change against the base commit is taken as one
binary-safe ``git diff`` (refused over ``max_patch_bytes``), with the ignored
files the agent made (ignored files are imported like any other; the ignored
files of the baseline it changed are reported and scanned), split into one part
per file, its added lines scanned with the content rules, and, for
``grade_in: fresh``, what remains outside the protected files applied in a fresh
sandbox. Files git takes for binary are diffed again as text for the scan, and a
binary change to a text source file is tampering (``binary-source``). The
baseline and the screening of protected files are in
:mod:`uniagent.grading.integrity`.
"""

from __future__ import annotations

import base64
import re
from dataclasses import dataclass, field

from uniagent.grading import scripts
from uniagent.grading.integrity import (
    SCRIPT_TIMEOUT,
    Baseline,
    GradingSetupError,
    Tamper,
    blob,
    is_protected,
    key_values,
    nul_list,
    pack_bounded,
    run_script,
    sorted_nul_list,
)
from uniagent.grading.sandbox import GradingSandbox, off_loop
from uniagent.grading.tree import gitlink_hits
from uniagent.protect.rules import RuleSet


@dataclass(frozen=True)
class FilePatch:
    """One file's part of a ``git diff``."""

    path: str
    text: str

    @property
    def binary(self) -> bool:
        """Whether git wrote this part as a binary patch."""
        return "\nGIT binary patch\n" in self.text

    def added_lines(self) -> list[str]:
        """The lines this part adds (none for a binary part)."""
        if self.binary:
            return []
        return [
            line[1:]
            for line in self.text.splitlines()
            if line.startswith("+") and not line.startswith("+++ ")
        ]


@dataclass
class AgentPatch:
    """What the agent changed: the patch, and what of it the screen reads as text."""

    patch: bytes
    parts: list[FilePatch]
    #: Text diffs (``--text``) of the parts git wrote as binary.
    text_parts: list[FilePatch] = field(default_factory=list)
    #: Ignored files the agent made (in the patch) and ignored files of the baseline it
    #: changed (not in the patch: reported and scanned whole).
    ignored_new: list[str] = field(default_factory=list)
    ignored_changed: list[str] = field(default_factory=list)
    #: path -> text of the changed ignored files that are text sources (scanned whole).
    changed_sources: dict[str, str] = field(default_factory=dict)

    def report(self) -> dict[str, object]:
        """What the result records of the patch."""
        out: dict[str, object] = {"patch_files": [p.path for p in self.parts]}
        if self.ignored_new or self.ignored_changed:
            out["ignored_files"] = {"new": self.ignored_new, "changed": self.ignored_changed}
        return out


async def extract_patch(sandbox: GradingSandbox, baseline: Baseline, limit: int) -> bytes | None:
    """The agent's whole change against the base, binary-safe; ``None`` without git."""
    taken = await take_patch(sandbox, baseline, limit)
    return None if taken is None else taken.patch


async def take_patch(sandbox: GradingSandbox, baseline: Baseline, limit: int) -> AgentPatch | None:
    """The agent's change against the base (see the module); ``None`` without git."""
    if baseline.repo is None or baseline.base is None:
        return None
    listed = f"{sandbox.scratch}/ignored"
    await sandbox.stage_bytes(listed, sorted_nul_list(baseline.ignored))
    output = await run_script(
        sandbox,
        scripts.DIFF,
        {
            "REPO": baseline.repo,
            "BASE": baseline.base,
            "LIMIT": str(limit),
            "IGNORED": listed,
            "SINCE": baseline.epoch or "",
        },
        what="taking the agent's patch",
        max_bytes=limit * 4 // 3 + (1 << 24),
    )
    taken = await off_loop(_parse_taken, output, limit)
    binary = [p.path for p in taken.parts if p.binary]
    if binary:
        names = f"{sandbox.scratch}/binary"
        await sandbox.stage_bytes(names, sorted_nul_list(set(binary)))
        text = await run_script(
            sandbox, scripts.DIFF_TEXT,
            {"REPO": baseline.repo, "BASE": baseline.base, "LIST": names, "LIMIT": str(limit)},
            what="diffing binary files as text", max_bytes=limit * 4 // 3 + (1 << 16),
        )  # fmt: skip
        taken.text_parts = await off_loop(lambda: split_patch(blob(text, "patch")))
    sources = [p for p in taken.ignored_changed if baseline.rules.is_source(p)]
    if sources:
        # (bounded as the patch is: the agent's files, whatever it made of them)
        members = await pack_bounded(sandbox, baseline.repo, sources, limit)
        if members.cut:
            raise PatchTooLarge(limit + 1, limit, "the ignored source files the agent changed take")
        taken.changed_sources = {
            path: m.data.decode("utf-8", "surrogateescape")
            for path, m in members.items()
            if m.kind == "f"
        }
    return taken


def _parse_taken(output: str, limit: int) -> AgentPatch:
    """The patch :data:`scripts.DIFF` printed, decoded and split."""
    size = key_values(output).get("size")
    if not isinstance(size, int):
        raise GradingSetupError(f"taking the agent's patch gave no size: {output[-500:]}")
    if size > limit:
        raise PatchTooLarge(size, limit)
    patch = blob(output, "patch")
    if len(patch) != size:
        raise GradingSetupError(f"the agent's patch has {len(patch)} bytes, not {size}")
    return AgentPatch(
        patch, split_patch(patch), ignored_new=nul_list(blob(output, "ignored_new")),
        ignored_changed=nul_list(blob(output, "ignored_changed")),
    )  # fmt: skip


class PatchTooLarge(Exception):
    """The agent's patch is over ``max_patch_bytes`` (the agent's doing: scores 0)."""

    def __init__(self, size: int, limit: int, what: str = "") -> None:
        super().__init__(
            f"{what} more than max_patch_bytes ({limit}) bytes"
            if what
            else f"the agent's patch has {size} bytes, more than max_patch_bytes ({limit})"
        )


def split_patch(patch: bytes) -> list[FilePatch]:
    """The per-file parts of a ``git diff`` (renames off, so one path per part)."""
    text = patch.decode("utf-8", "surrogateescape")
    parts = re.split(r"(?m)^(?=diff --git )", text)
    return [FilePatch(_header_path(p.split("\n", 1)[0]), p) for p in parts if p.startswith("diff")]


def join_patch(parts: list[FilePatch]) -> bytes:
    """Inverse of :func:`split_patch`."""
    return "".join(p.text for p in parts).encode("utf-8", "surrogateescape")


def _header_path(line: str) -> str:
    rest = line[len("diff --git ") :]
    if rest.startswith('"'):
        return _c_unquote(rest)[2:]
    length = (len(rest) - 5) // 2  # "a/" + P + " b/" + P
    return rest[2 : 2 + length]


def _c_unquote(text: str) -> str:
    body, i = [], 1
    escapes = {
        "n": "\n",
        "t": "\t",
        '"': '"',
        "\\": "\\",
        "a": "\a",
        "b": "\b",
        "f": "\f",
        "r": "\r",
        "v": "\v",
    }
    raw = bytearray()
    while i < len(text) and text[i] != '"':
        ch = text[i]
        if ch == "\\" and i + 1 < len(text):
            nxt = text[i + 1]
            if nxt in "01234567":
                raw.append(int(text[i + 1 : i + 4], 8))
                i += 4
                continue
            raw += escapes.get(nxt, nxt).encode()
            i += 2
            continue
        raw += ch.encode("utf-8", "surrogateescape")
        i += 1
    body.append(raw.decode("utf-8", "surrogateescape"))
    return "".join(body)


def content_hits(parts: list[FilePatch], rules: RuleSet) -> list[Tamper]:
    """Content-rule matches in what the agent added outside protected files."""
    hits = []
    for part in parts:
        if is_protected(rules, part.path):
            continue
        for hit in rules.content_hits(part.path, part.added_lines()):
            hits.append(Tamper("content", part.path, "hit", hit["rule"], True, hit["line"]))
    return hits


def screen_patch(taken: AgentPatch, rules: RuleSet) -> list[Tamper]:
    """Everything the patch screen finds: content-rule matches in the text of every part
    (binary parts as their text diff, changed ignored sources whole) and binary changes
    to text source files, and gitlinks (a nested repository's files are in no patch)."""
    found = content_hits([*taken.parts, *taken.text_parts], rules)
    found += gitlink_hits([(part.path, part.text) for part in taken.parts])
    for path, text in taken.changed_sources.items():
        if is_protected(rules, path):
            continue
        for hit in rules.content_hits(path, text.splitlines()):
            found.append(Tamper("content", path, "hit", hit["rule"], True, hit["line"]))
    for part in taken.parts:
        if part.binary and rules.is_source(part.path) and not is_protected(rules, part.path):
            found.append(
                Tamper(
                    "content",
                    part.path,
                    "binary",
                    "binary-source",
                    True,
                    "a text source file changed as a binary patch",
                )
            )
    return found


async def apply_patch(
    sandbox: GradingSandbox, repo: str, patch: bytes
) -> tuple[str | None, str | None]:
    """The tree of ``repo``'s HEAD (``None`` when there is none), then ``patch`` applied
    there: ``None`` on success, else git's complaint. One command for both (applying
    leaves HEAD's tree as it is)."""
    variables = {"REPO": repo, "PATCH": ""}
    if patch.strip():
        variables["PATCH"] = f"{sandbox.scratch}/apply.b64"
        await sandbox.write_file(variables["PATCH"], base64.b64encode(patch).decode("ascii"))
    done = await sandbox.run(
        scripts.with_vars(scripts.APPLY, variables),
        timeout=SCRIPT_TIMEOUT,
        cwd="/",
        resident=True,
    )
    first, _, rest = done.output.partition("\n")
    tree = first.removeprefix("tree=") if first.startswith("tree=") else ""
    tree_or_none = tree if re.fullmatch(r"[0-9a-f]{40,64}", tree) else None
    if done.exit_code == 0:
        return tree_or_none, None
    if done.exit_code == 7:
        return tree_or_none, rest[-2000:]
    raise GradingSetupError(f"applying the patch failed (exit {done.exit_code}): {done.output}")
