"""SWE-bench rows (Verified, Lite, full) as ``uniagent run`` tasks: one official image each.

Each task keeps the SWE-bench columns the reward reads (``instance_id``, ``repo``,
``base_commit``, ``FAIL_TO_PASS``, ``PASS_TO_PASS``, ``test_patch``, ...) and the
``problem_statement`` the prompt shows, and gets ``config_overrides`` that point the
deployment at the instance's image (``swebench/sweb.eval.x86_64.<id>:latest``, with
``__`` spelled ``_1776_`` as on Docker Hub; swebench's own ``expected_image``).
The gold ``patch`` is left out unless asked for: no prompt template can show the
agent the answer by mistake. Other columns (a wrapper's own, such as NeMo-Gym's
``responses_create_params``) are dropped.

From the command line::

    python -m uniagent_reward_swebench.tasks verified.parquet tasks.jsonl
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from swebench.task.checks import expected_image

from uniagent_reward_swebench.errors import TaskRowError

#: The columns of a SWE-bench row that a task keeps (those present).
SWE_BENCH_COLUMNS = (
    "instance_id",
    "repo",
    "base_commit",
    "problem_statement",
    "hints_text",
    "test_patch",
    "FAIL_TO_PASS",
    "PASS_TO_PASS",
    "version",
    "environment_setup_commit",
    "created_at",
    "difficulty",
    "eval_script",
    "log_parser",
    "eval_type",
)


def swe_bench_task(
    row: Mapping[str, Any], *, namespace: str = "swebench", keep_gold_patch: bool = False
) -> dict[str, Any]:
    """One ``uniagent run`` task from a SWE-bench row, its image set through its
    ``config_overrides``."""
    instance_id = row.get("instance_id")
    if not isinstance(instance_id, str) or not instance_id:
        raise TaskRowError(f"a SWE-bench row needs an instance_id (present: {', '.join(row)})")
    missing = [c for c in ("repo", "problem_statement", "FAIL_TO_PASS", "PASS_TO_PASS")
               if row.get(c) in (None, "")]  # fmt: skip
    if missing:
        raise TaskRowError(f"task {instance_id!r} has no {', '.join(missing)}")
    columns = (*SWE_BENCH_COLUMNS, "patch") if keep_gold_patch else SWE_BENCH_COLUMNS
    task = {c: _plain(row[c]) for c in columns if c in row and row[c] is not None}
    task["image"] = expected_image(instance_id, namespace)
    task["config_overrides"] = {"env": {"deployment": {"image": task["image"]}}}
    return task


def read_rows(path: Path) -> Iterator[dict[str, Any]]:
    """Rows of a ``.jsonl``, ``.json`` (a list) or ``.parquet`` file (Hugging Face's export)."""
    if path.suffix == ".parquet":
        try:
            import pyarrow.parquet as pq
        except ImportError:
            raise ValueError("reading .parquet needs pyarrow: pip install pyarrow") from None

        yield from pq.read_table(path).to_pylist()
    elif path.suffix == ".json":
        data = json.loads(path.read_text(encoding="utf-8"))
        yield from data if isinstance(data, list) else [data]
    else:
        with path.open(encoding="utf-8") as handle:
            yield from (json.loads(line) for line in handle if line.strip())


def write_tasks(rows: Iterable[Mapping[str, Any]], out: Path, **options: Any) -> int:
    """Write the tasks of ``rows`` to a JSONL file; return how many."""
    out.parent.mkdir(parents=True, exist_ok=True)
    count = 0
    with out.open("w", encoding="utf-8") as handle:
        for row in rows:
            handle.write(json.dumps(swe_bench_task(row, **options), ensure_ascii=False) + "\n")
            count += 1
    return count


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m uniagent_reward_swebench.tasks ROWS OUT.jsonl``."""
    parser = argparse.ArgumentParser(
        prog="python -m uniagent_reward_swebench.tasks",
        description="Turn SWE-bench rows (.parquet, .jsonl, .json) into uniagent run tasks, "
        "each pointing the sandbox at the instance's official image.",
    )
    parser.add_argument("rows", type=Path)
    parser.add_argument("out", type=Path, help="tasks file to write (.jsonl)")
    parser.add_argument("--namespace", default="swebench", help="image namespace (Docker Hub)")
    parser.add_argument("--keep-gold-patch", action="store_true", help="keep the `patch` column")
    args = parser.parse_args(argv)
    try:
        count = write_tasks(
            read_rows(args.rows), args.out, namespace=args.namespace,
            keep_gold_patch=args.keep_gold_patch,
        )  # fmt: skip
    except (TaskRowError, OSError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"wrote {count} tasks to {args.out}")
    return 0


def _plain(value: Any) -> Any:
    """JSON-ready: Parquet gives timestamps and NumPy-free lists; dates become text."""
    if isinstance(value, str | int | float | bool) or value is None:
        return value
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return str(value)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
