"""Progress of a run: a live view on a terminal (rich), plain lines otherwise.

On a terminal, the live view shows every running episode (task, attempt, turn,
the tool it runs, time so far), the totals (done, running, infrastructure
failures, mean reward so far, rate, ETA) and the latest failures with their
reason; failures and retries also stay in the scroll-back. Redirected, it
prints one line per finished episode, failure or retry, and a status line every
``status_every`` seconds. With ``verbose``, every episode's log lines are
streamed too, prefixed with ``task#sample``.
"""

from __future__ import annotations

import logging
import sys
import threading
import time
from collections import Counter, deque
from collections.abc import Iterable, Mapping
from typing import Any, TextIO

from uniagent.observer import Phase
from uniagent.run.results import LEAF_ROWS, is_infra_failure
from uniagent.run.retry import cause_of


class EpisodeState:
    """What one running attempt is doing: its observer, and the source of its phase times."""

    def __init__(self, label: str, attempt: int) -> None:
        self.label = label
        self.attempt = attempt
        self.started = time.monotonic()
        self.doing = "queued"
        self.turn_number = 0
        self.last_tool: str | None = None
        self._marks: list[tuple[str, float]] = []

    # -- EpisodeObserver ----------------------------------------------------------------
    def phase(self, name: Phase) -> None:
        """A phase begins."""
        self.doing = name
        self._marks.append((name, time.perf_counter()))

    def turn(self, number: int) -> None:
        """A model turn begins."""
        self.turn_number = number
        self.doing = "model"

    def tool(self, name: str) -> None:
        """A tool call starts."""
        self.last_tool = name
        self.doing = "tool"

    # -- reading --------------------------------------------------------------------------
    def timings(self) -> dict[str, float]:
        """Seconds spent in each phase so far (setup, tools, baseline, agent, grading, close)."""
        end = time.perf_counter()
        spans: dict[str, float] = {}
        for (name, start), (_, stop) in zip(self._marks, [*self._marks[1:], ("", end)]):
            spans[name] = round(spans.get(name, 0.0) + stop - start, 6)
        return spans

    def describe(self) -> str:
        """``turn 3 · execute_bash`` and the like."""
        if self.doing == "model":
            return f"turn {self.turn_number} · waiting for the model"
        if self.doing == "tool":
            return f"turn {self.turn_number} · {self.last_tool}"
        if self.doing == "ready":
            return "ready · waiting for an agent slot"
        return self.doing


class Progress:
    """Counts finished, running and failed episodes and prints plain lines."""

    def __init__(
        self,
        stream: TextIO,
        *,
        live: bool = False,
        verbose: bool = False,
        status_every: float = 60.0,
    ) -> None:
        self.stream = stream
        self.live = live
        self.verbose = verbose
        self.status_every = status_every
        self.total = 0
        self.done = 0
        self.finished_now = 0
        self.infra_failed = 0
        self.rewards: list[float] = []
        self.exit_reasons: Counter[str] = Counter()
        self.task_errors: list[dict[str, Any]] = []
        self.running: dict[Any, EpisodeState] = {}
        self.failures: deque[str] = deque(maxlen=5)
        self._lock = threading.RLock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._started = time.monotonic()

    @classmethod
    def for_stream(cls, stream: TextIO | None = None, *, verbose: bool = False) -> Progress:
        """The live view on a terminal, plain lines when redirected."""
        stream = stream or sys.stderr
        if stream.isatty():
            return LiveProgress(stream, verbose=verbose)
        return cls(stream, verbose=verbose)

    # -- events -------------------------------------------------------------------------
    def begin(
        self, total: int, already_done: Iterable[Mapping[str, Any]] = (), rerun: int = 0
    ) -> None:
        """Start counting; ``already_done`` are records kept from earlier runs."""
        for record in already_done:
            self._count(record)
        self.total = total
        self._started = time.monotonic()
        if self.done or rerun:
            again = f"; {rerun} infrastructure failures run again" if rerun else ""
            self._line(f"resuming: {self.done} of {total} episodes already finished{again}")
        self._start_thread()

    def started(self, job: Any, attempt: int = 1) -> EpisodeState:
        """An attempt began; the returned state is its observer."""
        state = EpisodeState(_label(job), attempt)
        with self._lock:
            self.running[_key(job)] = state
        return state

    def retrying(self, job: Any, record: Mapping[str, Any], delay: float, left: int) -> None:
        """An attempt failed for the infrastructure's reasons and will be tried again."""
        with self._lock:
            self.running.pop(_key(job), None)
        self._failure(
            f"{_label(job)}: attempt {record.get('attempt', '?')} failed, {cause_of(record)}; "
            f"retrying in {delay:g} s ({left} {'retry' if left == 1 else 'retries'} left)"
        )

    def finished(
        self, job: Any, record: Mapping[str, Any] | None, error: BaseException | None = None
    ) -> None:
        """A job ended with its record, or its task could not start (``error``)."""
        with self._lock:
            self.running.pop(_key(job), None)
            self.finished_now += 1
            if record is None:
                self.done += 1
                self.task_errors.append(
                    {"task_id": job.task.id, "sample": job.sample, "error": str(error)}
                )
            else:
                self._count(record)
            position = f"[{self.done}/{self.total}]"
        if record is None:
            self._failure(f"{position} {_label(job)} could not start: {error}")
        elif is_infra_failure(record):
            tries = record.get("attempt", 1)
            self._failure(
                f"{position} {_label(job)}: {cause_of(record)} (infrastructure; attempt {tries}; "
                "run again to retry)"
            )
        else:
            self._finished_line(position, job, record)

    def warn(self, message: str) -> None:
        """A message that is not about one episode."""
        self._line(f"warning: {message}")

    def say(self, text: str) -> None:
        """A line as it is (on a terminal: above the live view)."""
        self._line(text)

    def log_handler(self, job: Any) -> logging.Handler | None:
        """With ``verbose``, a handler streaming an episode's log lines here."""
        if not self.verbose:
            return None
        return _EpisodeLogHandler(self, _label(job))

    def end(self, final: bool = True) -> None:
        """Stop refreshing; with ``final``, print the counts."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if final:
            self._line(self.status())

    # -- figures ------------------------------------------------------------------------
    def status(self) -> str:
        """One line: counts, reward so far, rate, ETA, exit reasons."""
        with self._lock:
            mean = sum(self.rewards) / len(self.rewards) if self.rewards else None
            reasons = ", ".join(f"{k}={v}" for k, v in self.exit_reasons.most_common(4))
            elapsed = time.monotonic() - self._started
            eta = self.eta(elapsed)
            ready = sum(1 for state in self.running.values() if state.doing == "ready")
            return (
                f"done {self.done}/{self.total}  running {len(self.running)}"
                + (f" ({ready} ready)" if ready else "")
                + f"  infra failures {self.infra_failed}"
                + (f"  mean reward {mean:.3f}" if mean is not None else "")
                + (f"  [{reasons}]" if reasons else "")
                + f"  {_duration(elapsed)}"
                + (f"  ETA {_duration(eta)}" if eta is not None else "")
            )

    def eta(self, elapsed: float) -> float | None:
        """Seconds left at this run's rate so far (None before the first finish)."""
        if not self.finished_now or elapsed <= 0:
            return None
        return max(self.total - self.done, 0) * elapsed / self.finished_now

    # -- output -------------------------------------------------------------------------
    def _count(self, record: Mapping[str, Any]) -> None:
        self.done += 1
        if is_infra_failure(record):
            self.infra_failed += 1
        for row in record.get(LEAF_ROWS) or [record]:  # a tree rollout's: each leaf
            self.exit_reasons[row["exit_reason"]] += 1
            if row.get("reward") is not None:
                self.rewards.append(float(row["reward"]))

    def _finished_line(self, position: str, job: Any, record: Mapping[str, Any]) -> None:
        reward = record.get("reward")
        metrics = record.get("metrics") or {}
        leaves = record.get(LEAF_ROWS) or []
        solved = sum(1 for row in leaves if (row.get("reward") or 0) >= 1.0)
        self._line(
            f"{position} {_label(job)}: {record['exit_reason']}"
            + (f", reward {reward:g}" if reward is not None else "")
            + f" ({metrics.get('turns', 0)} turns)"
            + (f"; {len(leaves)} leaves, {solved} solved" if leaves else "")
        )

    def _failure(self, text: str) -> None:
        with self._lock:
            self.failures.append(text)
        self._line(text)

    def _line(self, text: str) -> None:
        with self._lock:
            self.stream.write(f"{text}\n")
            self.stream.flush()

    def _start_thread(self) -> None:
        if self.status_every > 0:
            self._thread = threading.Thread(target=self._tick, daemon=True)
            self._thread.start()

    def _tick(self) -> None:
        while not self._stop.wait(self.status_every):
            self._line(f"status: {self.status()}")


class LiveProgress(Progress):
    """The terminal view: running episodes, totals and recent failures, drawn by rich."""

    def __init__(self, stream: TextIO, *, verbose: bool = False, refresh: float = 4.0) -> None:
        super().__init__(stream, live=True, verbose=verbose, status_every=0)
        from rich.console import Console

        self.console = Console(file=stream, stderr=stream is sys.stderr)
        self.refresh = refresh
        self._live: Any = None

    def _start_thread(self) -> None:
        from rich.live import Live

        self._live = Live(
            get_renderable=self.view,
            console=self.console,
            refresh_per_second=self.refresh,
            transient=True,
            redirect_stdout=False,
            redirect_stderr=False,
        )
        self._live.start()

    def end(self, final: bool = True) -> None:
        """Remove the live view; with ``final``, print the counts."""
        if self._live is not None:
            self._live.stop()
            self._live = None
        if final:
            self._line(self.status())

    def _line(self, text: str) -> None:
        with self._lock:
            self.console.print(text, markup=False, highlight=False, soft_wrap=True)

    def _finished_line(self, position: str, job: Any, record: Mapping[str, Any]) -> None:
        pass  # counted in the header; the scroll-back keeps failures only

    def view(self) -> Any:
        """What the live view shows now (a rich renderable)."""
        from rich.console import Group
        from rich.table import Table
        from rich.text import Text

        with self._lock:
            now = time.monotonic()
            states = sorted(self.running.values(), key=lambda s: s.started)
            failures = list(self.failures)
            header = self.status()
        room = max(3, self.console.size.height - 8 - len(failures))
        table = Table(box=None, pad_edge=False, show_edge=False, header_style="bold")
        for column in ("episode", "attempt", "doing", "time"):
            table.add_column(column, justify="right" if column == "time" else "left")
        for state in states[:room]:
            # Text, not markup: a task id or tool name like "a[/b]" is shown as it is.
            table.add_row(
                Text(state.label),
                str(state.attempt),
                Text(state.describe()),
                _duration(now - state.started),
            )
        parts: list[Any] = [Text(header, style="bold")]
        if states:
            parts.append(table)
        if len(states) > room:
            parts.append(Text(f"... and {len(states) - room} more running", style="dim"))
        if failures:
            parts.append(Text("latest failures:", style="bold red"))
            parts.extend(Text(f"  {line}", style="red") for line in failures)
        return Group(*parts)


class _EpisodeLogHandler(logging.Handler):
    """Streams an episode's log records to the progress output (``-v``)."""

    def __init__(self, progress: Progress, label: str) -> None:
        super().__init__(level=logging.INFO)
        self.progress = progress
        self.label = label
        self.setFormatter(logging.Formatter("%(levelname)s %(message)s"))

    def emit(self, record: logging.LogRecord) -> None:
        try:
            for line in self.format(record).splitlines() or [""]:
                self.progress._line(f"{self.label} | {line}")
        except Exception:  # a display must never break an episode
            self.handleError(record)


def _label(job: Any) -> str:
    return f"{job.task.id}#{job.sample}"


def _duration(seconds: float) -> str:
    seconds = int(seconds)
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"


def _key(job: Any) -> tuple[str, int]:
    return (job.task.id, job.sample)
