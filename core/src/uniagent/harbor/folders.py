"""Harbor task folders (one, or a folder of them) as ``uniagent run`` tasks.

A task folder holds ``task.toml``, ``instruction.md``, ``tests/test.sh``, an
``environment/Dockerfile`` or a prebuilt ``[environment] docker_image``, and optionally
``solution/solve.sh``. Each becomes one task row: its id is the folder's name, its
``problem_statement`` the instruction (the default ``instance_template`` shows it),
``harbor`` what the ``harbor`` reward and ``uniagent verify`` need, and ``config_overrides``
point the deployment at the task's environment (see :func:`deployment_overrides`).
A folder that is not a usable task is a bad row with the reason, like a bad JSONL line.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from uniagent.errors import ConfigError
from uniagent.harbor.hostenv import check_host_verifier, host_environment
from uniagent.harbor.paths import AGENT_DIRS, ARTIFACTS, SANDBOX_DIRS
from uniagent.harbor.schema import (
    TaskToml,
    artifact_sources,
    load_task_toml,
    unset_variables,
    unsupported,
    verifier_mode,
)
from uniagent.tasks import BadRow, Task

TASK_FILE = "task.toml"
#: Under bubblewrap the root is read-only and each process gets its own mounts, so the
#: fixed paths are symlinks into the sandbox's private ``/tmp`` (made when first used).
BWRAP_HOME = "/tmp/.harbor"

#: Builds (or finds) the image of a task folder: ``(task_dir, config) -> image tag``; with a
#: third argument, of that build context (``"tests"``: a separate verifier's image).
ImageBuilder = Callable[..., str]


def is_task_set(path: str | Path) -> bool:
    """Whether ``path`` is a Harbor task folder or a folder holding some."""
    path = Path(path)
    if not path.is_dir():
        return False
    return (path / TASK_FILE).is_file() or any(
        (child / TASK_FILE).is_file() for child in path.iterdir() if child.is_dir()
    )


def task_dirs(path: str | Path) -> list[Path]:
    """The task folders of ``path`` (itself, or its sub-folders that hold a ``task.toml``)."""
    path = Path(path).resolve()
    if (path / TASK_FILE).is_file():
        return [path]
    return sorted(c for c in path.iterdir() if c.is_dir() and (c / TASK_FILE).is_file())


def read_task(task_dir: Path) -> tuple[TaskToml, dict[str, Any]]:
    """The parsed ``task.toml`` and the task row (without ``config_overrides``) of one folder."""
    config = load_task_toml(task_dir / TASK_FILE)
    problems = unsupported(config, task_dir)
    if problems:
        raise ConfigError("; ".join(problems))
    instruction = task_dir / "instruction.md"
    if not instruction.is_file():
        raise ConfigError("no instruction.md")
    text = instruction.read_text(encoding="utf-8")
    if not text.strip():
        raise ConfigError("instruction.md is empty")
    if not (task_dir / "tests" / "test.sh").is_file():
        raise ConfigError("no tests/test.sh (the verifier)")
    unset = unset_variables(config.verifier.env, "verifier.env")
    unset += unset_variables(config.solution.env, "solution.env")
    if unset:
        raise ConfigError("; ".join(unset))
    env = config.environment
    dockerfile = task_dir / "environment" / "Dockerfile"
    verifier = config.verifier
    separate = verifier_mode(config) == "separate"
    harbor = {
        "dir": str(task_dir),
        "name": config.task.name if config.task else task_dir.name,
        "verifier": {
            "timeout_sec": verifier.timeout_sec,
            "env": dict(verifier.env),
            "user": None if verifier.user is None else str(verifier.user),
        },
        "agent": {
            "timeout_sec": config.agent.timeout_sec,
            "user": None if config.agent.user is None else str(config.agent.user),
        },
        "solution": (task_dir / "solution" / "solve.sh").is_file(),
        "solution_env": dict(config.solution.env),
        "docker_image": env.docker_image,
        "dockerfile": dockerfile.is_file(),
        "workdir": env.workdir,
        "network_mode": config.network_mode(),
        "resources": {"cpus": env.cpus, "memory_mb": env.memory_mb, "storage_mb": env.storage_mb},
        "metadata": dict(config.metadata),
        # A separate verifier: its own sandbox (the task row's verifier_env), given the
        # agent's ARTIFACTS and artifacts; tests bundled in its image (set with the
        # deployment: verifier_overrides) are not copied in.
        "verifier_mode": "separate" if separate else "shared",
        "artifacts": [ARTIFACTS, *artifact_sources(config)] if separate else [],
        "verifier_bundled": False,
    }
    row = {"task_id": task_dir.name, "problem_statement": text, "instruction": text}
    return config, {**row, "harbor": harbor}


def deployment_overrides(
    config: TaskToml,
    task_dir: Path,
    deployment: Mapping[str, Any],
    build: ImageBuilder | None,
) -> dict[str, Any]:
    """The ``config_overrides`` that run the task on the config's ``deployment``.

    ``local``: the task's ``docker_image``, or its Dockerfile built by ``build``; its
    ``workdir``; ``no-network`` as ``--network none``. ``host``: bubblewrap only (the
    task writes ``/tests``, ``/logs`` and ``/solution``: symlinks into the sandbox's own
    ``/tmp``), no image: the Dockerfile's ``WORKDIR`` and ``ENV`` reproduced, anything it
    would build refused (:mod:`uniagent.harbor.hostenv`). Any other backend: the prebuilt
    ``docker_image``.
    """
    kind = deployment.get("type", "host")
    env = config.environment
    if kind == "host":
        if deployment.get("isolation") != "bwrap":
            raise ConfigError(
                "Harbor tasks on the host backend need env.deployment.isolation: bwrap "
                f"(the verifier writes {', '.join(SANDBOX_DIRS)}, private to each sandbox)"
            )
        args = [*deployment.get("bwrap_args", [])]
        for inside in SANDBOX_DIRS:
            args += ["--symlink", f"{BWRAP_HOME}{inside}", inside]
        # what a Harbor container has from the start: where the agent leaves its logs
        # and a separate verifier's artifacts (the verifier's own dirs are made at grading)
        for inside in AGENT_DIRS:
            args += ["--dir", f"{BWRAP_HOME}{inside}"]
        # The environment as far as the host reproduces it faithfully; else refused.
        host = host_environment(config, task_dir)
        sandbox: dict[str, Any] = {"bwrap_args": args}
        if "workdir" in host:
            sandbox["sandbox_workdir"] = host["workdir"]
        env_overrides: dict[str, Any] = {"deployment": sandbox}
        if "env" in host:
            env_overrides["env"] = host["env"]
        return {"env": env_overrides, **time_limit(config)}
    if kind == "local":
        if env.docker_image:
            image = env.docker_image
        elif (task_dir / "environment" / "Dockerfile").is_file():
            if build is None:
                raise ConfigError("environment/Dockerfile: no image builder for this run")
            image = build(task_dir, config)
        else:
            raise ConfigError("neither environment/Dockerfile nor environment.docker_image")
        out: dict[str, Any] = {"env": {"deployment": {"image": image}}}
        if config.network_mode() == "no-network":
            out["env"]["deployment"]["run_args"] = [
                *deployment.get("run_args", []),
                "--network",
                "none",
            ]
        if env.workdir:
            out["env"]["workdir"] = env.workdir
        return {**out, **time_limit(config)}
    if not env.docker_image:
        raise ConfigError(
            f"the {kind} backend runs prebuilt images only: set environment.docker_image"
        )
    return {"env": {"deployment": {"image": env.docker_image}}, **time_limit(config)}


def verifier_overrides(
    config: TaskToml,
    task_dir: Path,
    deployment: Mapping[str, Any],
    build: ImageBuilder | None,
) -> tuple[dict[str, Any], bool]:
    """The overrides of the agent's deployment that make a separate verifier's sandbox, and
    whether its image holds the tests (else they are copied in).

    ``host``: none (a new sandbox of the same deployment, the tests copied in). ``local``:
    ``[verifier.environment] docker_image``, else ``tests/Dockerfile`` built with ``tests/``
    as its context (both bundle the tests), else a new copy of the task's own image (the
    tests copied in); its workdir; ``no-network`` from the verifier's network policy. Any
    other backend: a prebuilt image (the verifier's, else the task's).
    """
    kind = deployment.get("type", "host")
    if kind == "host":
        check_host_verifier(config, task_dir)
        return {}, False
    own = config.verifier.environment
    bundled = True
    if own is not None and own.docker_image:
        image = own.docker_image
    elif (task_dir / "tests" / "Dockerfile").is_file() and kind == "local":
        if build is None:
            raise ConfigError("tests/Dockerfile: no image builder for this run")
        image = build(task_dir, config, "tests")
    else:
        agent_env = deployment_overrides(config, task_dir, deployment, build)["env"]
        image, bundled = agent_env["deployment"]["image"], False
    if kind != "local":
        return {"env": {"deployment": {"image": image}}}, bundled
    env = own or config.environment
    offline = (config.verifier.network_mode or env.network_mode) == "no-network" or (
        env.allow_internet is False
    )
    run_args = [*deployment.get("run_args", []), *(["--network", "none"] if offline else [])]
    out: dict[str, Any] = {"env": {"deployment": {"image": image, "run_args": run_args}}}
    if env.workdir:
        out["env"]["workdir"] = env.workdir
    return out, bundled


def time_limit(config: TaskToml) -> dict[str, Any]:
    """``[agent] timeout_sec`` as the agent's time limit (``interaction.time_limit``), if set."""
    seconds = config.agent.timeout_sec
    return {} if seconds is None else {"interaction": {"time_limit": seconds}}


def load_harbor_tasks(
    path: str | Path,
    deployment: Mapping[str, Any] | None = None,
    *,
    build: ImageBuilder | None = None,
) -> tuple[list[Task], list[BadRow]]:
    """The tasks of a Harbor task folder (or folder of them); unusable folders are bad rows.

    With ``deployment`` (the config's ``env.deployment``) each task gets the
    ``config_overrides`` that run it there; without, none (``uniagent data prepare``).
    """
    dirs = task_dirs(path)
    if not dirs:
        raise ConfigError(f"{path} holds no Harbor task (no task.toml in it or its sub-folders)")
    tasks: list[Task] = []
    bad: list[BadRow] = []
    for number, task_dir in enumerate(dirs, 1):
        try:
            config, row = read_task(task_dir)
            if deployment is not None:
                row["config_overrides"] = deployment_overrides(config, task_dir, deployment, build)
                if verifier_mode(config) == "separate":
                    overrides, bundled = verifier_overrides(config, task_dir, deployment, build)
                    row["verifier_env"] = overrides
                    row["harbor"]["verifier_bundled"] = bundled
        except ConfigError as exc:
            bad.append(BadRow(number, f"{task_dir.name}: {exc}", task_dir.name))
            continue
        tasks.append(Task(row["task_id"], row))
    return tasks, bad


def load_task_set(
    path: str | Path,
    deployment: Mapping[str, Any] | None = None,
    *,
    build: ImageBuilder | None = None,
) -> tuple[list[Task], list[BadRow]]:
    """Tasks of a JSONL/Parquet file or a Harbor task folder (see :func:`exclude_tasks`)."""
    from uniagent.tasks import load_tasks

    if is_task_set(path):
        return load_harbor_tasks(path, deployment, build=build)
    return load_tasks(path)


def read_exclude(path: str | Path) -> frozenset[str]:
    """Task ids of an exclude file: one a line; ``#`` starts a comment (``uniagent verify``)."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"--exclude {path}: cannot read it: {exc}") from None
    ids = (line.split("#", 1)[0].strip() for line in text.splitlines())
    return frozenset(i for i in ids if i)


@dataclass(frozen=True)
class Exclusion:
    """What ``--exclude FILE`` took out of a task set: the ids of its tasks (in the set's
    order) and the ids of the file that name none of them (a typo, another set's task)."""

    file: str
    tasks: tuple[str, ...]
    unmatched: tuple[str, ...]

    def to_json(self) -> dict[str, Any]:
        """What the run's manifest and summary (and ``uniagent verify``'s summary) record."""
        return {"file": self.file, "tasks": list(self.tasks), "unmatched": list(self.unmatched)}

    def warning(self) -> str | None:
        """The line that says which ids matched no task, or None when every id did."""
        if not self.unmatched:
            return None
        n = len(self.unmatched)
        return (
            f"--exclude {self.file}: {n} {'id matches' if n == 1 else 'ids match'} no task of "
            f"the task set: {', '.join(self.unmatched)}"
        )


def _in_set_order(tasks: Sequence[Task], bad: Sequence[BadRow]) -> list[str]:
    """The ids of ``tasks`` and of the named bad rows in the set's order: a Harbor folder
    that could not load is a bad row whose line is its place among the set's folders."""
    named = {b.line: b.task_id for b in bad if b.task_id is not None}
    order: list[str] = []
    rest = iter(t.id for t in tasks)
    for place in range(1, len(tasks) + len(named) + 1):
        if place in named:
            order.append(named.pop(place))
        elif (task_id := next(rest, None)) is not None:
            order.append(task_id)
    return order + list(rest) + list(named.values())


def exclude_tasks(
    path: str | Path, tasks: Sequence[Task], bad: Sequence[BadRow]
) -> tuple[list[Task], list[BadRow], Exclusion]:
    """``tasks`` and ``bad`` without the ids of the exclude file ``path`` (a bad row whose
    task id it names is excluded too, not reported), and what was taken out."""
    ids = read_exclude(path)
    known = _in_set_order(tasks, bad)
    exclusion = Exclusion(
        str(path),
        tuple(dict.fromkeys(i for i in known if i in ids)),
        tuple(sorted(ids - set(known))),
    )
    kept = [t for t in tasks if t.id not in ids]
    return kept, [b for b in bad if b.task_id not in ids], exclusion
