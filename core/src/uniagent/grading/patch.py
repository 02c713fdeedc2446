"""The agent's patch: taken from the sandbox, split into its files, scanned, applied.

Before grading, the agent's whole change against the base commit is taken as one
binary-safe ``git diff`` (refused over ``max_patch_bytes``), split into one part
per file, its added lines scanned with the content rules, and, for
``grade_in: fresh``, what remains outside the protected files applied in a fresh
sandbox. The baseline and the screening of protected files are in
:mod:`uniagent.grading.integrity`.
"""

from __future__ import annotations

import base64
import re
from dataclasses import dataclass

from uniagent.grading import scripts
from uniagent.grading.integrity import (
    SCRIPT_TIMEOUT,
    Baseline,
    GradingSetupError,
    Tamper,
    blob,
    is_protected,
    key_values,
    run_script,
)
from uniagent.grading.sandbox import GradingSandbox
from uniagent.protect.rules import RuleSet


@dataclass(frozen=True)
class FilePatch:
    """One file's part of a ``git diff``."""

    path: str
    text: str

    def added_lines(self) -> list[str]:
        """The lines this part adds (none for a binary part)."""
        if "\nGIT binary patch\n" in self.text:
            return []
        return [
            line[1:]
            for line in self.text.splitlines()
            if line.startswith("+") and not line.startswith("+++ ")
        ]


async def extract_patch(sandbox: GradingSandbox, baseline: Baseline, limit: int) -> bytes | None:
    """The agent's whole change against the base, binary-safe; ``None`` without git."""
    if baseline.repo is None or baseline.base is None:
        return None
    output = await run_script(
        sandbox,
        scripts.DIFF,
        {"REPO": baseline.repo, "BASE": baseline.base, "LIMIT": str(limit)},
        what="taking the agent's patch",
        max_bytes=limit * 4 // 3 + (1 << 16),
    )
    size = key_values(output).get("size")
    if not isinstance(size, int):
        raise GradingSetupError(f"taking the agent's patch gave no size: {output[-500:]}")
    if size > limit:
        raise PatchTooLarge(size, limit)
    patch = blob(output, "patch")
    if len(patch) != size:
        raise GradingSetupError(f"the agent's patch has {len(patch)} bytes, not {size}")
    return patch


class PatchTooLarge(Exception):
    """The agent's patch is over ``max_patch_bytes`` (the agent's doing: scores 0)."""

    def __init__(self, size: int, limit: int) -> None:
        super().__init__(f"the agent's patch has {size} bytes, more than max_patch_bytes ({limit})")


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


async def apply_patch(sandbox: GradingSandbox, repo: str, patch: bytes) -> str | None:
    """Apply ``patch`` in ``repo``; ``None`` on success, else git's complaint."""
    if not patch.strip():
        return None
    staged = f"{sandbox.scratch}/apply.b64"
    await sandbox.write_file(staged, base64.b64encode(patch).decode("ascii"))
    done = await sandbox.run(
        scripts.with_vars(scripts.APPLY, {"REPO": repo, "PATCH": staged}),
        timeout=SCRIPT_TIMEOUT,
        cwd="/",
    )
    if done.exit_code == 0:
        return None
    if done.exit_code == 7:
        return done.output[-2000:]
    raise GradingSetupError(f"applying the patch failed (exit {done.exit_code}): {done.output}")
