"""The SWE-bench Verified recipe on real rows: the ones that ship in the nemo-gym 0.4.0 wheel.

The wheel is fetched with pip at test time (it holds five SWE-bench Verified rows and
one more in NeMo-Gym's wrapper format). Schema only: the rows' repositories and
images cannot be fetched here, so no episode runs; every row must become a task
that uniagent loads, whose per-task config resolves with the recipe's config and
points at the instance's image, and that the ``swe_bench`` reward accepts.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from swebench.task.checks import expected_image
from uniagent_reward_swebench import SweBenchRewardConfig, build_spec
from uniagent_reward_swebench.tasks import main, read_rows, swe_bench_task

from uniagent import AgentConfig, resolve
from uniagent.testing import swe_bench_verified_rows

RECIPE = Path(__file__).resolve().parents[3] / "examples" / "swe_bench_verified" / "config.yaml"


@pytest.fixture(scope="module")
def verified_rows(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The SWE-bench Verified rows of the nemo-gym 0.4.0 wheel, in one JSONL file."""
    tmp = tmp_path_factory.mktemp("nemo_gym")
    path = tmp / "verified.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in swe_bench_verified_rows(tmp)))
    return path


def test_every_verified_row_becomes_a_task_the_recipe_runs(
    verified_rows: Path, tmp_path: Path
) -> None:
    rows = list(read_rows(verified_rows))
    assert len(rows) == 6
    tasks_file = tmp_path / "tasks.jsonl"
    assert main([str(verified_rows), str(tasks_file)]) == 0

    tasks = [json.loads(line) for line in tasks_file.read_text().splitlines()]
    assert [t["instance_id"] for t in tasks] == [r["instance_id"] for r in rows]
    recipe = AgentConfig.from_yaml(RECIPE)
    assert recipe.tools, "the recipe names its tools"
    # Its tools come from uniagent-tools-swe, which this suite does not install (the
    # integration suite runs the whole recipe): the rest of it resolves here.
    config = recipe.model_copy(update={"tools": ()})
    assert config.reward is not None and config.reward.grade_in == "fresh"
    reward_config = SweBenchRewardConfig.model_validate(config.reward.settings)
    for task, row in zip(tasks, rows, strict=True):
        source = f"task {task['instance_id']}"
        overrides = task["config_overrides"]
        agent = resolve(config.with_overrides(overrides, source=source), source=source)
        image = agent.deployment_config.image  # type: ignore[attr-defined]
        assert image == expected_image(row["instance_id"]) == task["image"]
        assert "__" not in image and image.startswith("swebench/sweb.eval.x86_64.")
        assert agent.config.env.workdir == "/testbed"
        assert config.instance_template.format_map(task)  # every field the prompt needs
        spec = build_spec("swe_bench", task, reward_config)
        assert spec.instance_id == row["instance_id"] and spec.workdir == "/testbed"
        assert spec.fail_to_pass, "FAIL_TO_PASS read (a list, or its JSON text)"
        assert "patch" not in task, "the gold patch stays out of the task"


def test_a_row_without_its_tests_is_refused_by_name() -> None:
    from uniagent_reward_swebench import TaskRowError

    with pytest.raises(TaskRowError, match="task 'x__y-1' has no FAIL_TO_PASS"):
        swe_bench_task({"instance_id": "x__y-1", "repo": "x/y", "problem_statement": "p",
                        "PASS_TO_PASS": []})  # fmt: skip
