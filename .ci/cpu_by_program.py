"""Where a CI run's CPU time went, by program: the kernel's process accounting.

    python .ci/cpu_by_program.py start FILE     # account every process that ends from now
    python .ci/cpu_by_program.py report FILE    # stop accounting; print the top programs

The duration table's ``cpu`` column counts only what a session waited for; a container's
processes (children of ``conmon``), Ray's daemons and the like are nobody's children
there, and CI's machine is busy nearly all the time (the table's ``busy`` column). The
kernel's process accounting (``acct(2)``) writes a record for every process of the
machine as it ends, whoever started it: its command name (the first 15 bytes) and CPU
time. Needs root (CAP_SYS_PACCT) and a kernel with BSD process accounting; without either,
``start`` says so and ``report`` prints nothing. A rough account, not an exact one: each
record counts whole hundredths of a second (a process of a few milliseconds, most
``bash``, ``git`` or ``sed`` runs, counts as nothing: see their number instead), processes
that still run at ``report`` are missing, and the name is the last thread's to end
(``main2`` is uv's, with the ``python`` processes that compile a venv's bytecode as its
children; ``jemalloc_bg_thd`` a process that loaded pyarrow).
"""

from __future__ import annotations

import ctypes
import os
import struct
import sys
from collections import defaultdict
from pathlib import Path

#: ``struct acct_v3`` (linux/acct.h): flag, version, tty, exitcode, uid, gid, pid, ppid,
#: btime, etime (float), utime, stime, mem, io, rw, minflt, majflt, swaps (comp_t), comm.
RECORD = struct.Struct("=BBHIIIIIIf8H16s")
ACCT_VERSION = 3
#: comp_t's clock: ticks of AHZ (100 a second).
AHZ = 100.0


def _acct(path: str | None) -> str | None:
    """Turn accounting to ``path`` (None: off); the error, if any."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.acct(None if path is None else os.fsencode(path)) == 0:
        return None
    return os.strerror(ctypes.get_errno())


def comp_t(value: int) -> float:
    """A ``comp_t``: 13 bits of mantissa, 3 of base-8 exponent."""
    return float((value & 0x1FFF) << (3 * (value >> 13)))


def programs(data: bytes) -> dict[str, list[float]]:
    """Seconds of CPU (user and system) and processes, by command name, of the records in
    ``data``."""
    totals: dict[str, list[float]] = defaultdict(lambda: [0.0, 0])
    size = RECORD.size
    for offset in range(0, len(data) - size + 1, size):
        fields = RECORD.unpack_from(data, offset)
        if fields[1] != ACCT_VERSION:
            continue
        utime, stime = fields[10], fields[11]
        name = fields[-1].split(b"\0", 1)[0].decode("utf-8", "replace") or "?"
        entry = totals[name]
        entry[0] += (comp_t(utime) + comp_t(stime)) / AHZ
        entry[1] += 1
    return totals


def report(data: bytes, top: int = 15) -> str:
    totals = programs(data)
    if not totals:
        return "ci: cpu by program: no processes were accounted"
    total = sum(seconds for seconds, _ in totals.values())
    rows = sorted(totals.items(), key=lambda item: -item[1][0])[:top]
    lines = [f"ci: cpu by program (every process of the machine that ended: {total:.0f} s;"]
    lines[0] += " one of less than 10 ms counts as none)"
    lines.append(f"{'program':<16}  {'cpu':>8}  {'share':>5}  {'processes':>9}")
    for name, (seconds, count) in rows:
        lines.append(f"{name:<16}  {seconds:>7.0f}s  {seconds / total:>5.0%}  {int(count):>9}")
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    if len(argv) != 2 or argv[0] not in ("start", "report"):
        print(__doc__.strip().splitlines()[2], file=sys.stderr)
        return 2
    action, path = argv
    if action == "start":
        Path(path).write_bytes(b"")
        problem = _acct(path)
        if problem is not None:
            Path(path).unlink()
            print(f"ci: no cpu by program (process accounting: {problem})")
        return 0
    if not Path(path).exists():
        return 0
    _acct(None)
    print(report(Path(path).read_bytes()))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
