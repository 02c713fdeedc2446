"""swebench's log parsers and constants, without the rest of its harness.

``swebench/harness/__init__.py`` imports every module of the harness (its Docker and
Modal runners, grading, reporting, dataset utilities) and with them docker, datasets,
pandas and pyarrow: importing ``swebench.harness.log_parsers`` that way costs about 1.7 s
of CPU (3 s of wall time) and 150 MB of memory in every process that grades (each
``uniagent run``, each verl worker), for a few regular expressions. The parsers and
the constants import none of that. :func:`harness_module` imports one module of the
harness below a package object whose ``__init__`` is not run (the package's own
directory, so every module of it still imports, the full ones on demand); where
``swebench.harness`` was already imported, it is used as it is.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from types import ModuleType

PACKAGE = "swebench.harness"


def light_harness() -> None:
    """Make ``swebench.harness`` the package's directory without its ``__init__``, where it
    is not imported yet: a later ``from swebench.harness.log_parsers import ...`` (or
    ``from swebench.harness import grading``) imports just that module from there."""
    if PACKAGE not in sys.modules:
        spec = importlib.util.find_spec(PACKAGE)
        if spec is not None and spec.submodule_search_locations is not None:
            sys.modules.setdefault(PACKAGE, importlib.util.module_from_spec(spec))


def harness_module(name: str) -> ModuleType:
    """``swebench.harness.<name>`` (e.g. ``log_parsers``, ``constants``), imported after
    :func:`light_harness`."""
    light_harness()
    return importlib.import_module(f"{PACKAGE}.{name}")


def parse_eval_script(eval_script: str) -> list[str]:
    """An eval script's lines without its shebang and ``set`` line: swebench 5.0.2's
    ``swebench.harness.utils.parse_eval_script`` (that module imports datasets and pandas
    at its top; a test checks the two agree)."""
    return [
        line
        for line in eval_script.strip().split("\n")
        if line not in ("#!/bin/bash", "set -uxo pipefail")
    ]
