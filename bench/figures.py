"""A bench script's figures as JSON (``--json FILE``), with where they were measured.

The file holds the script's name, its arguments, the figures (what the script prints as
tables) and their provenance: the commit (``+dirty`` with uncommitted changes to tracked
files), the time, the machine (CPUs, load average at the start, Python). Compare two files
of the same script with any JSON tool; ``docs/running.md`` keeps the latest ratios.

The scripts load this file with ``runpy.run_path``: ``bench/`` is kept off ``sys.path``,
where a sibling named like a standard module (``bench/tokenize.py``) would shadow it.
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


def _git(*args: str) -> str | None:
    try:
        done = subprocess.run(
            ["git", *args], cwd=ROOT, capture_output=True, text=True, timeout=30, check=True
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip()


def provenance() -> dict[str, Any]:
    """The commit, the time and the machine, taken when a run starts."""
    commit = _git("rev-parse", "HEAD")
    if commit and _git("status", "--porcelain", "--untracked-files=no"):
        commit += "+dirty"
    return {
        "commit": commit,
        "started": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "cpus": os.cpu_count(),
        "load_average": list(os.getloadavg()),
        "python": sys.version.split()[0],
        "platform": platform.platform(),
    }


def write(path: Path, script: str, args: Any, where: dict[str, Any], **figures: Any) -> None:
    """Write ``figures`` to ``path`` with the run's arguments and ``where`` (its
    :func:`provenance`)."""
    record = {"script": script, "args": vars(args), **where, "figures": figures}
    path.write_text(json.dumps(record, indent=1, default=str) + "\n", encoding="utf-8")
    print(f"figures written to {path}")
