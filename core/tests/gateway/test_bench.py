"""``bench/gateway.py`` runs and reports what docs/gateway.md quotes (a short session)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[3] / "bench" / "gateway.py"


def test_the_gateway_bench_compares_a_session_with_a_direct_client() -> None:
    done = subprocess.run(
        [sys.executable, str(BENCH), "--turns", "4", "--tokens", "2000", "--repeats", "1"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    out = done.stdout
    assert "run 1: 4 requests" in out, out
    overhead = re.search(r"gateway overhead\s+median\s+(-?[\d.]+) ms/request in process,\s+"
                         r"(-?[\d.]+) ms over HTTP, beyond the direct client", out)  # fmt: skip
    assert overhead, out
    assert re.search(r"direct client\s+median\s+[\d.]+ ms/request outside the backend", out)
    assert re.search(r"memory per finished session: [\d.]+ MiB", out), out
