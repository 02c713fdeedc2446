"""Labels on the ``local`` backend's containers, and removing those of killed runs.

Every container gets ``uniagent.owner`` (the pid of the process that started
it), ``uniagent.host`` (this machine's name) and, inside ``uniagent run``,
``uniagent.run`` (the run's id, from ``UNIAGENT_RUN_ID``). A container whose
owner is gone on this host is a leftover (its run was killed with SIGKILL or
crashed); so is one of a run being resumed, whose folder lock proves no live
process still uses it. Containers without these labels are never touched.
"""

from __future__ import annotations

import contextvars
import json
import os
import shutil
import socket
import subprocess
from collections.abc import Iterable
from typing import Any

from uniagent.env import cgroups

OWNER_LABEL = "uniagent.owner"
HOST_LABEL = "uniagent.host"
RUN_LABEL = "uniagent.run"
#: The run's id, carried by every sandbox it starts: a process's (a Ray actor's) default.
RUN_ID_ENV = "UNIAGENT_RUN_ID"
#: ``uniagent run``'s id in its own context (asyncio tasks inherit it), so that two runs in
#: one process label their sandboxes each with its own id; it wins over ``RUN_ID_ENV``.
RUN_ID: contextvars.ContextVar[str | None] = contextvars.ContextVar("uniagent_run_id", default=None)
ENGINES = ("podman", "docker")


def current_run_id() -> str | None:
    """The id of the run this context belongs to: :data:`RUN_ID`, else ``$UNIAGENT_RUN_ID``."""
    return RUN_ID.get() or os.environ.get(RUN_ID_ENV) or None


def name_prefix() -> str:
    """The start of a container's name: ``uniagent-<run id or owner pid>-``."""
    return f"uniagent-{current_run_id() or os.getpid()}-"


def label_args() -> list[str]:
    """``run`` flags labelling a container with its owner, host and run."""
    labels = {OWNER_LABEL: str(os.getpid()), HOST_LABEL: socket.gethostname()}
    run_id = current_run_id()
    if run_id:
        labels[RUN_LABEL] = run_id
    return [arg for key, value in labels.items() for arg in ("--label", f"{key}={value}")]


def _labelled(engine: str, timeout: float) -> list[dict[str, Any]]:
    """Every container with an owner label: id, name and labels."""
    done = subprocess.run(
        [engine, "ps", "-a", "--no-trunc", "--filter", f"label={OWNER_LABEL}",
         "--format", "{{json .}}"],
        capture_output=True, text=True, timeout=timeout, check=False,
    )  # fmt: skip
    if done.returncode != 0:
        return []
    text = done.stdout.strip()
    # podman prints one JSON array, docker one JSON object per line.
    items = (
        json.loads(text)
        if text.startswith("[")
        else [json.loads(line) for line in text.splitlines() if line.strip()]
    )
    found = []
    for item in items:
        labels = item.get("Labels") or {}
        if isinstance(labels, str):  # docker: "k=v,k2=v2"
            labels = dict(p.split("=", 1) for p in labels.split(",") if "=" in p)
        names = item.get("Names") or item.get("Name") or ""
        name = names[0] if isinstance(names, list) and names else str(names)
        found.append({"id": item.get("Id") or item.get("ID"), "name": name, "labels": labels})
    return found


def is_leftover(labels: dict[str, str], run_ids: Iterable[str] = ()) -> bool:
    """Whether a labelled container belongs to a dead owner on this host, or to ``run_ids``."""
    if labels.get(RUN_LABEL) and labels.get(RUN_LABEL) in set(run_ids):
        return True
    if labels.get(HOST_LABEL) not in (None, socket.gethostname()):
        return False  # another machine's (a shared engine): its owner is not ours to judge
    owner = labels.get(OWNER_LABEL, "")
    return owner.isdigit() and not cgroups._alive(int(owner))


def installed_engines() -> list[str]:
    """The container engines on PATH."""
    return [engine for engine in ENGINES if shutil.which(engine)]


def remove_leftovers(
    engines: Iterable[str] | None = None, *, run_ids: Iterable[str] = (), timeout: float = 60.0
) -> list[str]:
    """Remove leftover containers (see :func:`is_leftover`); return what was removed."""
    removed = []
    run_ids = tuple(run_ids)
    for engine in installed_engines() if engines is None else engines:
        try:
            containers = _labelled(engine, timeout)
        except (OSError, subprocess.TimeoutExpired, ValueError):
            continue  # an engine that does not answer has nothing we can remove
        for container in containers:
            if not is_leftover(container["labels"], run_ids):
                continue
            if _remove(engine, container["id"], timeout):
                removed.append(f"{engine} container {container['name']}")
    return removed


def _remove(engine: str, container: str, timeout: float) -> bool:
    """``ENGINE rm -f``; False when it fails or hangs (left for the next clean-up)."""
    try:
        done = subprocess.run(
            [engine, "rm", "-f", "-t", "0", container],
            capture_output=True, text=True, timeout=timeout, check=False,
        )  # fmt: skip
        if done.returncode != 0 and "-t" in done.stderr:  # docker has no -t for rm
            done = subprocess.run(
                [engine, "rm", "-f", container],
                capture_output=True, text=True, timeout=timeout, check=False,
            )  # fmt: skip
    except (OSError, subprocess.TimeoutExpired):
        return False
    return done.returncode == 0
