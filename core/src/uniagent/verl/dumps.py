"""Episode dumps from training: the files ``uniagent run`` writes, for a sample of episodes.

Set ``trajectory_dir`` (and optionally ``trajectory_rate``) in the agent-loop YAML entry.
Each sampled episode gets the directory and files of a ``uniagent run`` episode, one run
directory per training step::

    <trajectory_dir>/step_000005/results.jsonl                      one line per dumped episode
    <trajectory_dir>/step_000005/episodes/<task>/<sample>/          messages.json, rollout.json,
                                                                    log.txt, result.json

The files are written by the runner's own functions (:func:`uniagent.run.runner.write_payload`),
so a run viewer reads training episodes like any other run. ``result.json`` carries a
``verl`` object besides: the global step, the row's ``uid``/``session_id``/``index``, what
the trainer received (``traj_masked``, ``reward_score``, token counts) and the weight
versions. Sampling is per prompt group (the row's ``uid``): every sample of a dumped group
is dumped, so the group's samples can be compared.
"""

from __future__ import annotations

import asyncio
import hashlib
import io
import itertools
import logging
from collections.abc import Mapping, MutableMapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from uniagent.episode import EpisodeResult
from uniagent.errors import ConfigError
from uniagent.run.layout import RESULTS
from uniagent.run.runner import (
    Job,
    ResultsFile,
    episode_dir,
    episode_payload,
    write_payload,
)
from uniagent.tasks import Task

TRAJECTORY_DIR_KEY = "trajectory_dir"
TRAJECTORY_RATE_KEY = "trajectory_rate"
#: Share of prompt groups dumped when only ``trajectory_dir`` is set (full runs are big).
DEFAULT_RATE = 0.1
_LOG_FORMAT = "%(asctime)s %(levelname)s %(message)s"  # the runner's episode-log format


def step_dirname(step: int | None) -> str:
    """``step_000005``; ``step_unknown`` when neither the row nor the server told the step."""
    return f"step_{step:06d}" if step is not None else "step_unknown"


@dataclass(frozen=True)
class DumpSettings:
    """Where training episodes are dumped and which share of prompt groups."""

    directory: Path
    rate: float = DEFAULT_RATE

    @classmethod
    def pop_from(cls, loop_kwargs: MutableMapping[str, Any], *, source: str) -> DumpSettings | None:
        """Take ``trajectory_dir``/``trajectory_rate`` out of the agent-loop YAML entry's keys."""
        directory = loop_kwargs.pop(TRAJECTORY_DIR_KEY, None)
        rate = loop_kwargs.pop(TRAJECTORY_RATE_KEY, None)
        if directory is None or str(directory).strip() == "":
            if rate is not None:
                raise ConfigError(
                    f"{source}: {TRAJECTORY_RATE_KEY} is set but {TRAJECTORY_DIR_KEY} is not"
                )
            return None
        if not isinstance(directory, str | Path):
            raise ConfigError(f"{source}: {TRAJECTORY_DIR_KEY} must be a path, got {directory!r}")
        if rate is None:
            rate = DEFAULT_RATE
        if isinstance(rate, bool) or not isinstance(rate, int | float) or not 0.0 <= rate <= 1.0:
            raise ConfigError(
                f"{source}: {TRAJECTORY_RATE_KEY} must be a number from 0 to 1 (the share of "
                f"prompt groups dumped), got {rate!r}"
            )
        return cls(Path(directory).expanduser(), float(rate))

    def wants(self, group: str) -> bool:
        """Whether the prompt group ``group`` is dumped: a stable hash, so reruns agree."""
        if self.rate >= 1.0:
            return True
        if self.rate <= 0.0:
            return False
        digest = hashlib.sha256(group.encode("utf-8")).digest()
        return int.from_bytes(digest[:8], "big") / 2.0**64 < self.rate

    def start(self, task_id: str, group: str) -> EpisodeDump | None:
        """An :class:`EpisodeDump` when the group is sampled, else None."""
        return EpisodeDump(self, task_id) if self.wants(group) else None


class EpisodeDump:
    """One sampled episode: its log kept in memory, its files written when it is over.

    The directory is chosen at the end because the step of an episode on verl's classic
    worker path is only known from the server's replies (the weight version).
    """

    def __init__(self, settings: DumpSettings, task_id: str) -> None:
        self.settings = settings
        self.task_id = task_id
        self._stream = io.StringIO()
        self._handler = logging.StreamHandler(self._stream)
        self._handler.setFormatter(logging.Formatter(_LOG_FORMAT))
        # A bare Logger (not logging.getLogger): freed with the episode, like the runner's.
        self.logger = logging.Logger(f"uniagent.verl.episode.{task_id}", level=logging.INFO)
        self.logger.addHandler(self._handler)
        self.logger.info("task %s: start", task_id)

    async def write(
        self, result: EpisodeResult, verl_record: Mapping[str, Any], step: int | None
    ) -> Path:
        """Write the episode's files (off the event loop); return its directory."""
        self.logger.info(
            "finished: %s reward=%s (trainer: traj_masked=%s reward_score=%s)",
            result.exit_reason.value,
            result.reward,
            verl_record.get("traj_masked"),
            verl_record.get("reward_score"),
        )
        self.logger.removeHandler(self._handler)
        self._handler.close()
        return await asyncio.to_thread(self._write, result, dict(verl_record), step)

    def _write(self, result: EpisodeResult, verl_record: dict[str, Any], step: int | None) -> Path:
        run_dir = self.settings.directory / step_dirname(step)
        job, directory = _claim(run_dir, Task(self.task_id, {}))
        payload = episode_payload(job, result)
        payload["record"]["verl"] = verl_record
        record = write_payload(directory, payload, self._stream.getvalue())
        ResultsFile(run_dir / RESULTS).append(record)
        return directory


def _claim(run_dir: Path, task: Task) -> tuple[Job, Path]:
    """The first free ``<sample>`` directory of the task, created atomically.

    Several workers (processes) dump into one step directory, and a task has ``rollout.n``
    samples per step (more if it is drawn twice): ``mkdir`` without ``exist_ok`` decides.
    """
    for sample in itertools.count():
        job = Job(task, sample)
        directory = episode_dir(run_dir, job)
        directory.parent.mkdir(parents=True, exist_ok=True)
        try:
            directory.mkdir()
        except FileExistsError:
            continue
        return job, directory
    raise AssertionError("unreachable")  # pragma: no cover
