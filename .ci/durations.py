"""Print the table of a nox run's sessions: wall time, status and tests counted.

Reads ``.nox/durations.jsonl`` (each session appends a line as it ends; see noxfile.py).
``.ci/run`` prints it at the end of every CI run, passed or failed.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def table(path: Path) -> str:
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    if not rows:
        return "no nox session recorded a duration"
    width = max(len("session"), *(len(r["session"]) for r in rows))
    head = f"{'session':<{width}}  {'wall':>8}  {'cpu':>8}  {'status':<6}  {'tests':>5}"
    lines = [head + "  failed  skipped"]
    for r in rows:
        failed = r.get("failures", 0) + r.get("errors", 0)
        cpu = f"{r['cpu_seconds']:>7.0f}s" if "cpu_seconds" in r else f"{'-':>8}"
        lines.append(
            f"{r['session']:<{width}}  {r['seconds']:>7.0f}s  {cpu}  {r['status']:<6}  "
            f"{r.get('tests', 0):>5}  {failed:>6}  {r.get('skipped', 0):>7}"
        )
    total = sum(r["seconds"] for r in rows)
    cpu_total = sum(r.get("cpu_seconds", 0) for r in rows)
    tests = sum(r.get("tests", 0) for r in rows)
    lines.append(f"{'total':<{width}}  {total:>7.0f}s  {cpu_total:>7.0f}s  {'':<6}  {tests:>5}")
    lines.append(
        "(wall: each session's own; sessions run side by side, so the total is more than the "
        "run took; cpu: what the session ran and waited for)"
    )
    return "\n".join(lines)


if __name__ == "__main__":
    source = Path(sys.argv[1] if len(sys.argv) > 1 else ".nox/durations.jsonl")
    print(table(source) if source.exists() else f"{source}: no durations recorded")
