"""Print the table of a nox run's sessions: wall time, CPU, status and tests counted.

Reads ``.nox/durations.jsonl`` (each session appends a line as it ends, see noxfile.py;
``.ci/lanes.py`` adds a line with the CPU of every process the session started).
``.ci/run`` prints it at the end of every CI run, passed or failed.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path


def _seconds(row: dict, key: str) -> str:
    return f"{row[key]:>7.0f}s" if key in row else f"{'-':>8}"


def table(path: Path) -> str:
    merged: dict[str, dict] = {}  # a session's record and what .ci/lanes.py adds to it
    for line in path.read_text().splitlines():
        if line.strip():
            record = json.loads(line)
            merged.setdefault(record["session"], {}).update(record)
    rows = [r for r in merged.values() if "seconds" in r]
    if not rows:
        return "no nox session recorded a duration"
    width = max(len("session"), *(len(r["session"]) for r in rows))
    head = f"{'session':<{width}}  {'wall':>8}  {'cpu':>8}  {'all cpu':>8}  {'busy':>5}"
    lines = [head + f"  {'status':<6}  tests  failed  skipped"]
    for r in rows:
        failed = r.get("failures", 0) + r.get("errors", 0)
        busy = f"{r['machine_busy']:>5.0%}" if "machine_busy" in r else f"{'-':>5}"
        lines.append(
            f"{r['session']:<{width}}  {r['seconds']:>7.0f}s  {_seconds(r, 'cpu_seconds')}  "
            f"{_seconds(r, 'all_cpu_seconds')}  {busy}  {r['status']:<6}  "
            f"{r.get('tests', 0):>5}  {failed:>6}  {r.get('skipped', 0):>7}"
        )
    total = {key: sum(r.get(key, 0) for r in rows) for key in ("seconds", "cpu_seconds")}
    every = sum(r.get("all_cpu_seconds", 0) for r in rows)
    tests = sum(r.get("tests", 0) for r in rows)
    lines.append(
        f"{'total':<{width}}  {total['seconds']:>7.0f}s  {total['cpu_seconds']:>7.0f}s  "
        + (f"{every:>7.0f}s" if every else f"{'-':>8}")
        + f"  {'':>5}  {'':<6}  {tests:>5}"
    )
    lines.append(
        "(wall: each session's own; sessions run side by side, so the total is more than the "
        "run took; cpu: what the session ran and waited for; all cpu: every process it "
        "started, those nobody waited for included (Ray's daemons, sandboxes' processes), but "
        "not containers' (a cgroup's count, where .ci/lanes.py could make one); busy: the "
        "share of the whole machine's CPU time in use while the session ran, its neighbours' "
        "included)"
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
