"""``examples/quickstart.sh`` asks pip for the CPU build of torch, not PyPI's CUDA build.

The script's own torch install line is read from the script and handed to the real
pip (``--dry-run --report``), with the two indexes it could reach replaced by local
stand-ins: the public index (pip's default; here every ``PIP_*`` setting and config
file of this machine is dropped) offers ``torch 2.13.0`` needing ``nvidia-cublas-cu12``,
as PyPI's Linux wheel does, and torch's CPU index offers ``torch 2.13.0+cpu`` alone.

What this proves: pip, given exactly the script's arguments, resolves torch from the
CPU index and installs no ``nvidia-*`` package, whichever of ``--index-url`` or
``--extra-index-url`` the script uses (with both indexes in play, pip must still pick
the CPU build). What it cannot prove: that download.pytorch.org serves that version
for the user's platform and Python, that it also hosts torch's own dependencies (the
stand-in CPU wheel has none), or that PyPI's torch still pulls CUDA (the stand-in
public index encodes that); this machine cannot reach either host.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
QUICKSTART = ROOT / "examples" / "quickstart.sh"
#: The real indexes the script may name, and which local stand-in replaces each.
CPU_INDEX = "https://download.pytorch.org/whl/cpu"
PUBLIC_INDEX = "https://pypi.org/simple"


def commands(script: Path) -> list[list[str]]:
    """The script's commands as words (continuation lines joined, comments dropped)."""
    text = script.read_text().replace("\\\n", " ")
    return [words for line in text.splitlines() if (words := shlex.split(line, comments=True))]


def torch_install_args(script: Path) -> list[str]:
    """What follows ``pip install`` in the one command that installs torch."""
    found = []
    for words in commands(script):
        for i in range(len(words) - 1):
            if words[i] == "pip" and words[i + 1] == "install":
                args = words[i + 2 :]
                if any(a == "torch" or a.startswith(("torch=", "torch<", "torch>")) for a in args):
                    found.append(args)
    assert len(found) == 1, f"expected one pip install of torch in {QUICKSTART}: {found}"
    return found[0]


def write_wheel(project_dir: Path, name: str, version: str, requires: tuple[str, ...] = ()) -> None:
    """A minimal pure wheel of ``name`` in ``project_dir``, listed in its ``index.html``."""
    project_dir.mkdir(parents=True, exist_ok=True)
    dist = f"{name.replace('-', '_')}-{version}"
    filename = f"{dist}-py3-none-any.whl"
    metadata = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
    metadata += "".join(f"Requires-Dist: {r}\n" for r in requires)
    wheel = "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
    with zipfile.ZipFile(project_dir / filename, "w") as archive:
        archive.writestr(f"{dist}.dist-info/METADATA", metadata)
        archive.writestr(f"{dist}.dist-info/WHEEL", wheel)
        archive.writestr(f"{dist}.dist-info/RECORD", "")
    index = project_dir / "index.html"
    links = index.read_text() if index.exists() else ""
    index.write_text(links + f'<a href="{filename}">{filename}</a>\n')


def local_indexes(tmp_path: Path) -> dict[str, str]:
    """The stand-ins: real index URL -> ``file://`` URL of a PEP 503 index."""
    public, cpu = tmp_path / "public" / "simple", tmp_path / "cpu" / "simple"
    write_wheel(public / "torch", "torch", "2.13.0", requires=("nvidia-cublas-cu12",))
    write_wheel(public / "nvidia-cublas-cu12", "nvidia-cublas-cu12", "12.9.1")
    write_wheel(cpu / "torch", "torch", "2.13.0+cpu")
    return {PUBLIC_INDEX: public.as_uri(), CPU_INDEX: cpu.as_uri()}


def pip_env(default_index: str) -> dict[str, str]:
    """This environment without any pip setting of this machine; ``default_index`` as PyPI."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    env["PIP_CONFIG_FILE"] = os.devnull  # no pip.conf of this machine (find-links, mirrors)
    env["PIP_INDEX_URL"] = default_index  # what pip uses unless the script names an index
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    return env


def test_quickstart_installs_torch_from_the_cpu_index(tmp_path: Path) -> None:
    args = torch_install_args(QUICKSTART)
    indexes = local_indexes(tmp_path)
    named = [a for a in args if a.startswith(("http://", "https://"))]
    unknown = [a for a in named if a.rstrip("/") not in indexes]
    assert not unknown, f"the test has no stand-in for {unknown}"
    local_args = [indexes.get(a.rstrip("/"), a) for a in args]
    report = tmp_path / "report.json"
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "install", *local_args, "--dry-run",
         "--ignore-installed", "--no-cache-dir", "--report", str(report)],
        capture_output=True,
        text=True,
        timeout=300,
        env=pip_env(indexes[PUBLIC_INDEX]),
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    chosen = {
        item["metadata"]["name"]: item["metadata"]["version"]
        for item in json.loads(report.read_text())["install"]
    }
    assert chosen.get("torch") == "2.13.0+cpu", chosen
    assert not [name for name in chosen if name.startswith("nvidia")], chosen
