"""What ``uniagent verify`` writes: ``verify.jsonl`` (a verdict a line), ``summary.json``
(the counts, the task rows skipped, what ``--exclude`` took out) and the exclude list."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from uniagent.run.layout import SUMMARY
from uniagent.run.summary import exclusion_lines
from uniagent.tasks import BadRow
from uniagent.verify.check import EXCLUDED, Verdict

if TYPE_CHECKING:  # pragma: no cover
    from uniagent.harbor.folders import Exclusion

RECORDS = "verify.jsonl"
EXCLUDE = "exclude.txt"
#: The status a skipped task row (not a task: it could not be loaded) is counted under.
SKIPPED = "skipped"


def write_report(
    verdicts: Sequence[Verdict],
    out: Path,
    exclude: Path | None = None,
    *,
    skipped: Sequence[BadRow] = (),
    exclusion: Exclusion | None = None,
) -> Path:
    """Write the records and the summary into ``out``, and the exclude list (default
    ``out/exclude.txt``); the exclude list's path."""
    out.mkdir(parents=True, exist_ok=True)
    with (out / RECORDS).open("w", encoding="utf-8") as handle:
        for verdict in verdicts:
            handle.write(json.dumps(verdict.to_dict(), sort_keys=True) + "\n")
    summary: dict[str, Any] = {
        "tasks": len(verdicts) + len(skipped),
        "statuses": counts(verdicts, skipped),
        "skipped_rows": [{"line": b.line, "reason": b.reason} for b in skipped],
    }
    if exclusion is not None:
        summary["excluded"] = exclusion.to_json()
    (out / SUMMARY).write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
    exclude = exclude or out / EXCLUDE
    lines = [
        "# tasks `uniagent verify` found broken or flaky: uniagent run --exclude THIS_FILE",
        *(f"{v.task_id}  # {v.status}: {v.reason.splitlines()[0][:200]}"
          for v in verdicts if v.status in EXCLUDED),
    ]  # fmt: skip
    exclude.parent.mkdir(parents=True, exist_ok=True)
    exclude.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return exclude


def counts(verdicts: Sequence[Verdict], skipped: Sequence[BadRow] = ()) -> dict[str, int]:
    """How many tasks have each status (``skipped``: task rows that could not be loaded)."""
    found = Counter(v.status for v in verdicts)
    if skipped:
        found[SKIPPED] = len(skipped)
    return dict(sorted(found.items()))


def format_verdicts(
    verdicts: Sequence[Verdict],
    *,
    skipped: Sequence[BadRow] = (),
    exclusion: Exclusion | None = None,
) -> str:
    """The summary printed at the end: the counts (skipped task rows among them), each task
    that is not ``ok``, each skipped row, and what ``--exclude`` took out."""
    head = ", ".join(f"{n} {status}" for status, n in counts(verdicts, skipped).items())
    lines = [f"{len(verdicts) + len(skipped)} tasks: {head}"]
    lines += [f"  {v.task_id}: {v.status} ({v.reason.splitlines()[0][:200]})"
              for v in verdicts if v.status != "ok"]  # fmt: skip
    lines += [f"  {SKIPPED}: {b.reason.splitlines()[0][:200]}" for b in skipped]
    lines += exclusion_lines(exclusion.to_json() if exclusion is not None else None)
    return "\n".join(lines)
