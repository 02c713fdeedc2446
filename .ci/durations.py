"""Print the table of a nox run's sessions: wall time, status and tests counted.

Reads ``.nox/durations.jsonl`` (each session appends a line as it ends; see noxfile.py).
``.ci/run`` prints it at the end of every CI run, passed or failed.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path


def table(path: Path) -> str:
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    if not rows:
        return "no nox session recorded a duration"
    width = max(len("session"), *(len(r["session"]) for r in rows))
    head = f"{'session':<{width}}  {'wall':>8}  {'cpu':>8}  {'busy':>5}  {'status':<6}"
    lines = [head + "  tests  failed  skipped"]
    for r in rows:
        failed = r.get("failures", 0) + r.get("errors", 0)
        cpu = f"{r['cpu_seconds']:>7.0f}s" if "cpu_seconds" in r else f"{'-':>8}"
        busy = f"{r['machine_busy']:>5.0%}" if "machine_busy" in r else f"{'-':>5}"
        lines.append(
            f"{r['session']:<{width}}  {r['seconds']:>7.0f}s  {cpu}  {busy}  {r['status']:<6}  "
            f"{r.get('tests', 0):>5}  {failed:>6}  {r.get('skipped', 0):>7}"
        )
    total = sum(r["seconds"] for r in rows)
    cpu_total = sum(r.get("cpu_seconds", 0) for r in rows)
    tests = sum(r.get("tests", 0) for r in rows)
    lines.append(
        f"{'total':<{width}}  {total:>7.0f}s  {cpu_total:>7.0f}s  {'':>5}  {'':<6}  {tests:>5}"
    )
    lines.append(
        "(wall: each session's own; sessions run side by side, so the total is more than the "
        "run took; cpu: what the session ran and waited for; busy: the share of the whole "
        "machine's CPU time in use while the session ran, its neighbours' included)"
    )
    return "\n".join(lines)


def busy_since(start: str) -> str | None:
    """The machine's busy CPU share since ``start`` (a first line of ``/proc/stat``)."""
    try:
        with open("/proc/stat") as stat:
            now = stat.readline()
        before, after = ([int(word) for word in line.split()[1:9]] for line in (start, now))
    except (OSError, ValueError):
        return None
    total = sum(after) - sum(before)
    idle = sum(after[3:5]) - sum(before[3:5])
    if total <= 0:
        return None
    return f"{(total - idle) / total:.0%} of {os.cpu_count()} CPUs busy over the run"


if __name__ == "__main__":
    args = sys.argv[1:]
    since = None
    if args[:1] == ["--since"]:
        since, args = Path(args[1]), args[2:]
    source = Path(args[0] if args else ".nox/durations.jsonl")
    print(table(source) if source.exists() else f"{source}: no durations recorded")
    if since is not None and since.exists():
        print(f"ci: machine: {busy_since(since.read_text()) or 'no /proc/stat'}")
