"""Bash scripts the rewards run in the sandbox: generated eval scripts and the runner.

Rows in swebench 5.x style carry their own ``eval_script``; for older rows
(SWE-bench 4.x datasets, SWE-rebench, R2E-Gym) an eval script is generated
from a test command and the test files of ``test_patch``, the way swebench 4.x
built them from its per-repo specs.
"""

from __future__ import annotations

import posixpath
import re
import shlex
from collections.abc import Sequence
from dataclasses import dataclass

from uniagent_reward_swebench.harness import harness_module

START_TEST_OUTPUT = ">>>>> Start Test Output"
END_TEST_OUTPUT = ">>>>> End Test Output"
APPLY_PATCH_FAIL = ">>>>> Patch Apply Failed"
RESET_FAILED = ">>>>> Reset Failed"
TESTS_TIMEOUT = ">>>>> Tests Timed Out"
#: Formerly printed by the runner when the work dir is missing; the runner now prints a nonce
#: marker before the test region (see :mod:`uniagent_reward_swebench.evalrun`).
WORKDIR_MISSING = ">>>>> uniagent: work dir missing"

_PYTEST = "pytest --no-header -rA --tb=no -p no:cacheprovider"
#: Test commands of swebench 4.x's per-repo specs (the most common version of each repo),
#: used only for rows that carry neither an eval_script nor a test command.
DEFAULT_TEST_COMMANDS: dict[str, str] = {
    "astropy/astropy": "pytest -rA -vv -o console_output_style=classic --tb=no",
    "django/django": "./tests/runtests.py --verbosity 2 --settings=test_sqlite --parallel 1",
    "marshmallow-code/marshmallow": _PYTEST,
    "matplotlib/matplotlib": _PYTEST,
    "mwaskom/seaborn": "pytest --no-header -rA",
    "pallets/flask": _PYTEST,
    "psf/requests": _PYTEST,
    "pvlib/pvlib-python": _PYTEST,
    "pydata/xarray": _PYTEST,
    "pydicom/pydicom": _PYTEST,
    "pylint-dev/astroid": _PYTEST,
    "pylint-dev/pylint": _PYTEST,
    "pytest-dev/pytest": _PYTEST,
    "pyvista/pyvista": _PYTEST,
    "scikit-learn/scikit-learn": _PYTEST,
    "sphinx-doc/sphinx": "tox --current-env -epy39 -v --",
    "sqlfluff/sqlfluff": _PYTEST,
    "sympy/sympy": (
        "PYTHONWARNINGS='ignore::UserWarning,ignore::SyntaxWarning' bin/test -C --verbose"
    ),
}

_DIFF_HEADER = re.compile(r"^diff --git a/(\S+) b/(\S+)$", re.MULTILINE)


@dataclass(frozen=True)
class PatchFile:
    """A file touched by a patch; ``created`` when the patch adds it."""

    path: str
    created: bool


def patch_files(patch: str) -> list[PatchFile]:
    """The files a unified git diff touches, in order."""
    files: list[PatchFile] = []
    headers = list(_DIFF_HEADER.finditer(patch))
    for i, match in enumerate(headers):
        end = headers[i + 1].start() if i + 1 < len(headers) else len(patch)
        block = patch[match.end() : end]
        created = bool(re.search(r"^new file mode", block, re.MULTILINE)) or (
            "\n--- /dev/null" in block
        )
        files.append(PatchFile(path=match.group(2), created=created))
    return files


#: Options of ``python`` that take a value (the runner script comes after them).
_PYTHON_VALUE_OPTIONS = {"-W", "-X", "-Q"}


def runner_files(commands: Sequence[str], workdir: str | None) -> list[str]:
    """The files of the repository that the test commands run as their runner (relative to
    ``workdir``, where the eval script runs them): Django's ``./tests/runtests.py``,
    sympy's ``bin/test``, a ``python runtests.py`` or ``bash ./run.sh``. A command named
    bare (``pytest``) is found on ``PATH``, and ``python -m`` runs a module: neither is a
    file named here."""
    root = (workdir or "").rstrip("/")
    found: list[str] = []
    for command in commands:
        try:
            words = shlex.split(command, comments=True)
        except ValueError:
            continue
        while words and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*=.*", words[0]):
            words = words[1:]  # VAR=value prefixes
        if not words:
            continue
        runner: str | None = words[0]
        run_by_name = "/" not in words[0]  # looked up on PATH, not a file named here
        if re.fullmatch(r"python[0-9.]*|bash|sh", words[0].rsplit("/", 1)[-1]):
            runner, rest, run_by_name = None, words[1:], False  # a file, from where it runs
            while rest:
                word, rest = rest[0], rest[1:]
                if word in ("-m", "-c"):
                    break
                if word in _PYTHON_VALUE_OPTIONS:
                    rest = rest[1:]
                elif not word.startswith("-"):
                    runner = word
                    break
        if runner is None or run_by_name:
            continue
        if runner.startswith("/"):
            if not root or not runner.startswith(root + "/"):
                continue
            runner = runner[len(root) + 1 :]
        path = posixpath.normpath(runner)
        outside = path in (".", "..") or path.startswith("../")
        if not outside and path not in found:
            found.append(path)
    return found


def test_directives(repo: str, paths: Sequence[str]) -> list[str]:
    """Test-runner arguments for the test files of a patch (swebench 4.x's rules)."""
    NON_TEST_EXTS = harness_module("constants").NON_TEST_EXTS

    directives = [p for p in paths if not any(p.endswith(ext) for ext in NON_TEST_EXTS)]
    if repo == "django/django":
        # Django's runner takes dotted module labels relative to tests/.
        transformed = []
        for d in directives:
            d = d[: -len(".py")] if d.endswith(".py") else d
            d = d[len("tests/") :] if d.startswith("tests/") else d
            transformed.append(d.replace("/", "."))
        directives = transformed
    return directives


def generate_eval_script(
    *,
    workdir: str,
    test_commands: Sequence[str],
    directives: Sequence[str] = (),
    pre_commands: Sequence[str] = (),
    conda_env: str | None = None,
) -> str:
    """An eval script in swebench's shape: set-up, then the tests between the output markers."""
    lines = ["#!/bin/bash", "set -uxo pipefail", f"cd {shlex.quote(workdir)}"]
    if conda_env:
        env = shlex.quote(conda_env)
        lines.append(
            "if [ -f /opt/miniconda3/bin/activate ]; then "
            f"set +u; source /opt/miniconda3/bin/activate && conda activate {env}; set -u; fi"
        )
    lines += list(pre_commands)
    args = " ".join(shlex.quote(d) for d in directives)
    lines.append(f": '{START_TEST_OUTPUT}'")
    if len(test_commands) == 1:
        lines.append(f"{test_commands[0]} {args}".rstrip())
    else:
        # Several commands (SWE-rebench lists): the run fails if any fails.
        lines.append("uniagent_rc=0")
        for command in test_commands:
            lines.append(f"{command} {args}".rstrip() + " || uniagent_rc=$?")
        lines.append("( exit $uniagent_rc )")
    lines.append(f": '{END_TEST_OUTPUT}'")
    return "\n".join(lines) + "\n"
