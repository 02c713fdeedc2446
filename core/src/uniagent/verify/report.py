"""What ``uniagent verify`` writes: ``verify.jsonl`` (a verdict a line) and the exclude list."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

from uniagent.verify.check import EXCLUDED, Verdict

RECORDS = "verify.jsonl"
EXCLUDE = "exclude.txt"


def write_report(verdicts: Sequence[Verdict], out: Path, exclude: Path | None = None) -> Path:
    """Write the records into ``out`` and the exclude list (default ``out/exclude.txt``)."""
    out.mkdir(parents=True, exist_ok=True)
    with (out / RECORDS).open("w", encoding="utf-8") as handle:
        for verdict in verdicts:
            handle.write(json.dumps(verdict.to_dict(), sort_keys=True) + "\n")
    exclude = exclude or out / EXCLUDE
    lines = [
        "# tasks `uniagent verify` found broken or flaky: uniagent run --exclude THIS_FILE",
        *(f"{v.task_id}  # {v.status}: {v.reason.splitlines()[0][:200]}"
          for v in verdicts if v.status in EXCLUDED),
    ]  # fmt: skip
    exclude.parent.mkdir(parents=True, exist_ok=True)
    exclude.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return exclude


def format_verdicts(verdicts: Sequence[Verdict]) -> str:
    """The summary printed at the end: the counts, then each task that is not ``ok``."""
    counts = Counter(v.status for v in verdicts)
    head = ", ".join(f"{n} {status}" for status, n in sorted(counts.items()))
    lines = [f"{len(verdicts)} tasks: {head}"]
    lines += [f"  {v.task_id}: {v.status} ({v.reason.splitlines()[0][:200]})"
              for v in verdicts if v.status != "ok"]  # fmt: skip
    return "\n".join(lines)
