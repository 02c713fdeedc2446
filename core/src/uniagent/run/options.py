"""The options of one ``uniagent run``, as one typed value handed down the runner."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from uniagent.errors import ConfigError

if TYPE_CHECKING:  # pragma: no cover
    from uniagent.harbor.folders import Exclusion


@dataclass(frozen=True)
class RunOptions:
    """How to run a task set; every field has the CLI's default.

    ``concurrency`` and ``warm`` ``None`` take the agent config's; ``breaker`` ``None`` a window
    that grows with the concurrency; ``model_info`` is what the manifest records of
    the model (its spec, never a key); ``ray_address`` runs the episodes on a Ray
    cluster (``ray_workers`` actors); ``exclude`` is what ``--exclude`` took out of the
    task set (recorded in the manifest and the summary; its unknown ids are warned of).
    """

    concurrency: int | None = None
    warm: int | None = None
    n: int = 1
    limit: int | None = None
    retries: int = 2
    retry_delay: float = 10.0
    breaker: int | None = None
    keep_failures: bool = False
    force_resume: bool = False
    model_info: Mapping[str, Any] | None = None
    tasks_path: Path | None = None
    config_path: str | None = None
    ray_address: str | None = None
    ray_workers: int | None = None
    exclude: Exclusion | None = None

    def __post_init__(self) -> None:
        if self.n < 1:
            raise ConfigError("--n must be at least 1")
        if self.concurrency is not None and self.concurrency < 1:
            raise ConfigError("--concurrency must be at least 1")
        if self.warm is not None and self.warm < 0:
            raise ConfigError("--warm must be 0 or more")
        if self.retries < 0:
            raise ConfigError("--retries must be 0 or more")
        if self.limit is not None and self.limit < 0:
            raise ConfigError("--limit must be 0 or more")
