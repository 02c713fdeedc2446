"""``OUT/manifest.json``: what a run is, so that a resume continues the same run.

Written when a run starts in a folder and updated at every resume. It holds the
run's id (sandboxes carry it), this invocation's pid, its start time and every
planned job (``uniagent view`` reads them), the resolved agent config, the model (its spec
without credentials and where its API key came from, never the key), the
versions of Python, uniagent and every installed plugin, the task file's
path and SHA-256, and what ``--exclude`` took out of it (``exclude``: the file, the
ids of its tasks skipped, the ids that matched no task). A resume whose config, model
or task file differ is refused unless ``--force-resume`` (the change is then recorded
under ``changes``).
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import socket
import sys
import uuid
from collections.abc import Mapping, Sequence
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path
from typing import Any

from uniagent import __version__, procfs
from uniagent.cache import file_digest
from uniagent.config import AgentConfig
from uniagent.errors import ConfigError
from uniagent.models.openai_chat import public_url
from uniagent.run.layout import MANIFEST

FORMAT = 1
#: What must be the same for a resume to continue a run.
CHECKED = ("config", "model.spec", "tasks.sha256")


def public_model_spec(spec: str) -> str:
    """``spec`` without credentials: a URL's user, password, query and fragment dropped.

    ``openai:https://user:key@host/v1?api-key=K#model`` becomes
    ``openai:https://host/v1#model``.
    """
    kind, sep, rest = spec.partition(":")
    if kind != "openai" or not sep:
        return spec
    url, hash_sign, name = rest.rpartition("#")
    if not hash_sign:
        url, name = rest, ""
    return f"openai:{public_url(url)}" + (f"#{name}" if hash_sign else "")


def public_argv(argv: Sequence[str]) -> list[str]:
    """The command line with every ``--model`` spec made public (:func:`public_model_spec`)."""
    out: list[str] = []
    for arg in argv:
        if out and out[-1] == "--model":
            arg = public_model_spec(arg)
        elif arg.startswith("--model="):
            arg = "--model=" + public_model_spec(arg.removeprefix("--model="))
        out.append(arg)
    return out


def plugin_versions() -> dict[str, str]:
    """Every installed distribution with a ``uniagent`` entry point, with its version."""
    found: dict[str, str] = {}
    for entry in metadata.entry_points(group="uniagent"):
        dist = entry.dist
        if dist is not None and dist.metadata["Name"]:
            found[dist.metadata["Name"]] = dist.version
    return dict(sorted(found.items()))


def build(
    *,
    run_id: str | None,
    config: AgentConfig,
    config_path: str | None,
    model: Mapping[str, Any],
    tasks_path: Path | None,
    tasks: Sequence[Any] = (),
    n: int,
    jobs: Sequence[tuple[str, int]],
    exclude: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """A manifest for a run starting now (``run_id`` None: a new id).

    The task file's digest is of its bytes; without a file (tasks given in-process),
    of the tasks' ids and rows. ``exclude`` (what ``--exclude`` took out) is recorded
    when given.
    """
    task_info: dict[str, str | None]
    if tasks_path is not None:
        task_info = {"path": str(tasks_path), "sha256": file_digest(tasks_path)}
    else:
        rows = json.dumps([[t.id, t.row] for t in tasks], sort_keys=True, default=str)
        task_info = {"path": None, "sha256": hashlib.sha256(rows.encode()).hexdigest()}
    manifest = {
        "format": FORMAT,
        "run_id": run_id or uuid.uuid4().hex[:12],
        "started_at": _now(),
        "n": n,
        "pid": os.getpid(),  # this invocation's: uniagent view tells a live run by it
        # ... together with its start (clock ticks since boot, from /proc where there is
        # one): a later process that reuses the pid has another start.
        "pid_start": pid_start(os.getpid()),
        "jobs": [[task_id, sample] for task_id, sample in jobs],  # every planned job
        "config_file": config_path,
        "config": json.loads(config.model_dump_json()),
        "model": dict(model),
        "tasks": task_info,
        "versions": {
            "python": platform.python_version(),
            "uniagent": __version__,
            "plugins": plugin_versions(),
        },
        "host": socket.gethostname(),
        "argv": public_argv([Path(sys.argv[0]).name, *sys.argv[1:]]),
    }
    if exclude is not None:
        manifest["exclude"] = dict(exclude)
    return manifest


def pid_start(pid: int) -> int | None:
    """When process ``pid`` started, in clock ticks since boot; None without /proc."""
    proc = procfs.info(pid)
    return proc.start_ticks if proc is not None else None


def load(out: Path) -> dict[str, Any] | None:
    """The manifest in ``out``, or None when there is none."""
    path = out / MANIFEST
    if not path.exists():
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise ConfigError(
            f"{path} is not readable JSON ({exc}); move it away to start over"
        ) from None
    if not isinstance(data, dict) or "run_id" not in data:
        raise ConfigError(f"{path} is not a uniagent run manifest; use another --out")
    return data


def differences(old: Mapping[str, Any], new: Mapping[str, Any]) -> list[str]:
    """What differs between two manifests in the checked parts, one line each."""
    found: list[str] = []
    for part in CHECKED:
        a, b = _get(old, part), _get(new, part)
        if a == b:
            continue
        if isinstance(a, Mapping) and isinstance(b, Mapping):
            for key in sorted(set(_flatten(a)) | set(_flatten(b))):
                x, y = _flatten(a).get(key, "(unset)"), _flatten(b).get(key, "(unset)")
                if x != y:
                    found.append(f"{part}.{key}: {_short(x)} -> {_short(y)}")
        else:
            found.append(f"{part}: {_short(a)} -> {_short(b)}")
    return found


def resume(old: Mapping[str, Any], new: dict[str, Any], *, force: bool) -> dict[str, Any]:
    """The manifest of a resumed run: the old run's id and start, the new settings.

    Raises :class:`ConfigError` listing the differences unless ``force``.
    """
    changed = differences(old, new)
    if changed and not force:
        listed = "\n  ".join(changed[:20])
        more = f"\n  ... and {len(changed) - 20} more" if len(changed) > 20 else ""
        raise ConfigError(
            "the output folder holds a run with a different config, model or task file:\n  "
            f"{listed}{more}\nuse another --out, or --force-resume to continue it anyway "
            "(the change is recorded in manifest.json)"
        )
    merged = {**new, "run_id": old["run_id"], "started_at": old.get("started_at")}
    merged["resumed_at"] = [*old.get("resumed_at", []), new["started_at"]]
    merged["changes"] = list(old.get("changes", []))
    if changed:
        merged["changes"].append({"at": new["started_at"], "differences": changed})
    return merged


def _get(data: Mapping[str, Any], dotted: str) -> Any:
    value: Any = data
    for part in dotted.split("."):
        value = value.get(part) if isinstance(value, Mapping) else None
    return value


def _flatten(data: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for key, value in data.items():
        path = f"{prefix}{key}"
        if isinstance(value, Mapping) and value:
            flat.update(_flatten(value, path + "."))
        else:
            flat[path] = value
    return flat


def _short(value: Any) -> str:
    text = json.dumps(value, ensure_ascii=False, default=str)
    return text if len(text) <= 80 else text[:77] + "..."


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")
