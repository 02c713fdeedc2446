"""Real task rows for schema tests, fetched with pip: SWE-bench Verified rows from nemo-gym.

The ``nemo-gym`` 0.4.0 wheel ships five SWE-bench Verified rows (mini-swe-agent 2's
example data) and one more in NeMo-Gym's own wrapper format (its lists as JSON text).
Their repositories and images are not reachable offline: they serve to check that a
loader and a reward accept real rows, not to run episodes.
"""

from __future__ import annotations

import json
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any

NEMO_GYM = "nemo-gym==0.4.0"
#: Files of the wheel holding SWE-bench Verified rows.
VERIFIED_ROW_FILES = (
    "responses_api_agents/mini_swe_agent_2/data/example.jsonl",
    "responses_api_agents/swe_agents/data/example.jsonl",
)


def swe_bench_verified_rows(directory: Path) -> list[dict[str, Any]]:
    """The six SWE-bench Verified rows of the nemo-gym wheel, downloaded into ``directory``."""
    wheels = sorted(directory.glob("nemo_gym-0.4.0-*.whl"))
    if not wheels:
        fetched = subprocess.run(
            [sys.executable, "-m", "pip", "download", "--no-deps", "--python-version", "3.12",
             "--only-binary=:all:", NEMO_GYM, "-d", str(directory), "-q"],
            capture_output=True, text=True, timeout=900, check=False,
        )  # fmt: skip
        if fetched.returncode != 0:
            raise RuntimeError(f"pip download {NEMO_GYM} failed: {fetched.stderr[-2000:]}")
        wheels = sorted(directory.glob("nemo_gym-0.4.0-*.whl"))
    rows: list[dict[str, Any]] = []
    with zipfile.ZipFile(wheels[0]) as archive:
        for name in VERIFIED_ROW_FILES:
            text = archive.read(name).decode("utf-8")
            rows += [json.loads(line) for line in text.splitlines() if line.strip()]
    return rows
