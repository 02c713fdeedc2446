"""Progress of a run: a live status line on a terminal, plain log lines otherwise."""

from __future__ import annotations

import sys
import threading
import time
from collections import Counter
from collections.abc import Iterable, Mapping
from typing import Any, TextIO


class Progress:
    """Counts done / running / failed episodes and shows them."""

    def __init__(self, stream: TextIO, *, live: bool, interval: float = 0.5) -> None:
        self.stream = stream
        self.live = live
        self.interval = interval
        self.total = 0
        self.done = 0
        self.running = 0
        self.failed = 0
        self.rewards: list[float] = []
        self.exit_reasons: Counter[str] = Counter()
        self.task_errors: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._started = time.monotonic()

    @classmethod
    def for_stream(cls, stream: TextIO | None = None) -> Progress:
        """Live on a terminal, plain lines when redirected."""
        stream = stream or sys.stderr
        return cls(stream, live=stream.isatty())

    def begin(self, total: int, already_done: Iterable[Mapping[str, Any]] = ()) -> None:
        """Start counting; ``already_done`` are records from an earlier, resumed run."""
        for record in already_done:
            self._count(record)
        self.total = total
        if self.done:
            self._line(f"resuming: {self.done} of {total} episodes already finished")
        if self.live:
            self._thread = threading.Thread(target=self._refresh, daemon=True)
            self._thread.start()

    def started(self, job: Any) -> None:
        """An episode began."""
        with self._lock:
            self.running += 1

    def finished(
        self, job: Any, record: Mapping[str, Any] | None, error: BaseException | None
    ) -> None:
        """An episode ended with a record, or its task could not start (``error``)."""
        with self._lock:
            self.running -= 1
            if record is None:
                self.failed += 1
                self.done += 1
                self.task_errors.append(
                    {"task_id": job.task.id, "sample": job.sample, "error": str(error)}
                )
            else:
                self._count(record)
        if record is None:
            self._line(f"task {job.task.id} sample {job.sample} could not start: {error}")
        elif not self.live:
            reward = record.get("reward")
            self._line(
                f"[{self.done}/{self.total}] {job.task.id}#{job.sample}: {record['exit_reason']}"
                + (f", reward {reward:g}" if reward is not None else "")
            )

    def warn(self, message: str) -> None:
        """A message that is not about one episode."""
        self._line(f"warning: {message}")

    def end(self) -> None:
        """Stop the live line and print the final counts."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self.stream.write("\r\x1b[2K")
        self._line(self.status())

    def status(self) -> str:
        """One line: counts, mean reward, exit reasons."""
        mean = sum(self.rewards) / len(self.rewards) if self.rewards else None
        reasons = ", ".join(f"{k}={v}" for k, v in self.exit_reasons.most_common(4))
        return (
            f"done {self.done}/{self.total}  running {self.running}  failed {self.failed}"
            + (f"  mean reward {mean:.3f}" if mean is not None else "")
            + (f"  [{reasons}]" if reasons else "")
            + f"  {time.monotonic() - self._started:.0f}s"
        )

    def _count(self, record: Mapping[str, Any]) -> None:
        self.done += 1
        self.exit_reasons[record["exit_reason"]] += 1
        if record.get("error") and record.get("traj_masked"):
            self.failed += 1
        if record.get("reward") is not None:
            self.rewards.append(float(record["reward"]))

    def _line(self, text: str) -> None:
        with self._lock:
            prefix = "\r\x1b[2K" if self.live else ""
            self.stream.write(f"{prefix}{text}\n")
            self.stream.flush()

    def _refresh(self) -> None:
        while not self._stop.wait(self.interval):
            with self._lock:
                self.stream.write(f"\r\x1b[2K{self.status()}")
                self.stream.flush()
