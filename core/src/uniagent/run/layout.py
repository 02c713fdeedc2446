"""The layout of a run folder: the one place that says what ``uniagent run`` writes where.

::

    OUT/.lock                          held (flock) while a run uses the folder; the
                                       holder's pid inside
    OUT/manifest.json                  what the run is (see uniagent.run.manifest)
    OUT/results.jsonl                  one line per finished (task, sample), appended as it ends
    OUT/summary.json                   written when an invocation ends, however it ends
    OUT/episodes/<task>/<sample>/      one folder per (task, sample), <task> = safe_name(id):
        log.txt                        the latest attempt's log, made when the attempt starts
        attempt-<n>.log                earlier attempts' logs
        messages.json                  the conversation (see docs/running.md)
        rollout.json                   the rollout (token ids, mask, log-probs)
        result.json                    the latest attempt's results record
        task_error.json                the task could not start (bad input), and why

The runner, its Ray backend, training dumps (:mod:`uniagent.verl.dumps`, one such folder
per step) and ``uniagent view`` all name files and folders through this module. It imports
nothing but the standard library, so a reader of run folders does not load the runner.
"""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

LOCK = ".lock"
MANIFEST = "manifest.json"
RESULTS = "results.jsonl"
SUMMARY = "summary.json"
#: The top-level files of a run folder (any of them, or ``episodes/``, makes one: a run
#: takes the lock first, so a folder holding only the lock is a run starting).
TOP_FILES = (LOCK, MANIFEST, RESULTS, SUMMARY)
EPISODES = "episodes"

LOG = "log.txt"
MESSAGES = "messages.json"
ROLLOUT = "rollout.json"
RESULT = "result.json"
TASK_ERROR = "task_error.json"
#: Files whose presence makes a folder an episode's (training dumps have no results file).
EPISODE_MARKERS = (RESULT, MESSAGES, ROLLOUT)

_ATTEMPT_LOG = re.compile(r"attempt-([0-9]{1,9})\.log")
# log.<name>.txt: the logs of older runs, still shown
_LOG_NAME = re.compile(r"log(\.[A-Za-z0-9_-]{1,64})?\.txt")
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")
_MAX_NAME = 96


def attempt_log(number: int) -> str:
    """The name the log of attempt ``number`` gets once a later attempt starts."""
    return f"attempt-{number}.log"


def attempt_of_log(name: str) -> int | None:
    """The attempt number of an ``attempt-<n>.log`` name, None for any other name."""
    match = _ATTEMPT_LOG.fullmatch(name)
    return int(match.group(1)) if match else None


def is_log(name: str) -> bool:
    """Whether ``name`` is an episode's log: ``log.txt``, ``attempt-<n>.log`` (or older names)."""
    return _LOG_NAME.fullmatch(name) is not None or attempt_of_log(name) is not None


def is_episode_file(name: str) -> bool:
    """Whether ``name`` is one of the files an episode folder holds."""
    return name in EPISODE_MARKERS or name == TASK_ERROR or is_log(name)


def safe_name(task_id: str) -> str:
    """A directory name for a task id, different for different ids.

    Ids made only of letters, digits, ``.``, ``_`` and ``-`` (and not starting with
    ``.``) are used as they are; any other id is sanitised and gets ``+`` and a
    digest of the id, a character no id used as it is contains, so ``proj/issue-1``
    and ``proj_issue-1`` never share a directory.
    """
    cleaned = _UNSAFE.sub("_", task_id).strip("._")
    if cleaned == task_id and 0 < len(task_id) <= _MAX_NAME:
        return task_id
    digest = hashlib.sha256(task_id.encode("utf-8")).hexdigest()[:10]
    return f"{cleaned[:_MAX_NAME] or 'task'}+{digest}"


def episode_key(task_id: str, sample: int) -> str:
    """A (task, sample)'s folder relative to the run folder, POSIX style."""
    return f"{EPISODES}/{safe_name(task_id)}/{sample}"


def episode_path(out: Path, task_id: str, sample: int) -> Path:
    """A (task, sample)'s folder in run folder ``out``."""
    return out / EPISODES / safe_name(task_id) / str(sample)


def key_of_episode_dir(episode_dir: str) -> str | None:
    """The folder relative to the run folder of a record's ``episode_dir`` (as the runner
    saw it: relative to its working directory, or absolute); None if it is not one.

    Its last three parts are the same wherever the run folder was moved.
    """
    parts = episode_dir.replace("\\", "/").rstrip("/").split("/")
    odd = ("", ".", "..")
    if len(parts) >= 3 and parts[-3] == EPISODES and parts[-2] not in odd and parts[-1] not in odd:
        return "/".join(parts[-3:])
    return None


def is_run_folder(path: Path) -> bool:
    """True for a folder ``uniagent run`` wrote (or is writing)."""
    return any((path / name).exists() for name in TOP_FILES) or (path / EPISODES).is_dir()
