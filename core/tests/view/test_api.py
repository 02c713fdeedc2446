"""The viewer's JSON API against real run folders, through a real `uniagent view` server."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from uniagent.rollout import Rollout


def records(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "results.jsonl").read_text().splitlines()]


def test_runs_lists_both_folders_as_finished(viewer, messages_run, token_run):
    listed = viewer.json("/api/runs")["runs"]
    assert [(r["id"], r["name"], r["state"]) for r in listed] == [
        (0, messages_run.name, "finished"),
        (1, token_run.name, "finished"),
    ]
    assert listed[0]["episodes"] == 12 and listed[0]["status"] == {"finished": 12}
    assert listed[0]["n"] == 2 and listed[1]["n"] == 1


def test_the_table_holds_every_result_with_its_figures(viewer, messages_run):
    page = viewer.json("/api/runs/0/episodes", limit=500)
    by_key = {(r["task_id"], r["sample"]): r for r in page["rows"]}
    assert page["total"] == 12 and len(by_key) == 12
    for record in records(messages_run):
        row = by_key[(record["task_id"], record["sample"])]
        assert row["reward"] == record["reward"]
        assert row["exit_reason"] == record["exit_reason"]
        assert row["turns"] == record["metrics"]["turns"]
        assert row["tool_calls"] == record["metrics"]["tool_calls"]
        assert row["model_seconds"] == pytest.approx(record["metrics"]["model_seconds"])
        assert row["status"] == "finished"
        assert row["key"] == f"episodes/{record['task_id']}/{record['sample']}"
    # The plan's order (manifest): tasks as in the task file, samples in turn.
    assert [r["task_id"] for r in page["rows"][:4]] == ["mean-empty"] * 2 + ["fahrenheit"] * 2


def test_sorting_puts_the_highest_reward_first_and_missing_values_last(viewer):
    rows = viewer.json("/api/runs/0/episodes", sort="reward", order="desc", limit=500)["rows"]
    rewards = [r["reward"] for r in rows]
    assert rewards == sorted(rewards, reverse=True) and rewards[0] == 1.0
    by_task = viewer.json("/api/runs/0/episodes", sort="task_id", limit=500)["rows"]
    assert [r["task_id"] for r in by_task] == sorted(r["task_id"] for r in by_task)


@pytest.mark.parametrize(
    ("params", "expected"),
    [
        ({"exit": "format_error"}, {("factorial-zero", 0), ("factorial-zero", 1)}),
        ({"reward": "solved"}, {(t, s) for t in ("mean-empty", "fahrenheit") for s in (0, 1)}),
        ({"q": "FAHR"}, {("fahrenheit", 0), ("fahrenheit", 1)}),
        (
            {"q": "e", "reward": "solved", "exit": "finished"},
            {("mean-empty", 0), ("mean-empty", 1), ("fahrenheit", 0), ("fahrenheit", 1)},
        ),
        ({"status": "running"}, set()),
    ],
)
def test_filters_narrow_the_table(viewer, params, expected):
    page = viewer.json("/api/runs/0/episodes", limit=500, **params)
    assert {(r["task_id"], r["sample"]) for r in page["rows"]} == expected
    assert page["total"] == len(expected)
    # The menus' counts stay those of the whole run.
    assert page["counts"]["exit_reason"] == {"finished": 10, "format_error": 2}


def test_pages_are_disjoint_and_cover_the_run(viewer):
    seen = []
    for offset in range(0, 12, 5):
        page = viewer.json("/api/runs/0/episodes", offset=offset, limit=5)
        assert page["total"] == 12
        seen += [r["key"] for r in page["rows"]]
    assert len(seen) == len(set(seen)) == 12


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"sort": "colour"}, "sort: unknown column 'colour'"),
        ({"status": "done"}, "status: unknown value 'done'"),
        ({"reward": "high"}, "reward: unknown value 'high'; use one of solved"),
        ({"offset": "x"}, "offset: expected a whole number"),
    ],
)
def test_bad_parameters_are_a_400_that_says_what_is_allowed(viewer, params, message):
    response = viewer.get("/api/runs/0/episodes", **params)
    assert response.status_code == 400 and message in response.json()["error"]


def test_unknown_run_and_episode_are_404(viewer):
    assert viewer.get("/api/runs/7/episodes").status_code == 404
    response = viewer.get("/api/runs/0/episode", key="episodes/nope/0")
    assert response.status_code == 404 and "no episode" in response.json()["error"]


def test_summary_agrees_with_the_runs_summary_file(viewer, messages_run):
    summary = viewer.json("/api/runs/0/summary")
    saved = json.loads((messages_run / "summary.json").read_text())
    for key in ("episodes", "tasks", "mean_reward", "exit_reasons", "tool_calls", "pass_at_k"):
        assert summary[key] == pytest.approx(saved[key]), key
    assert summary["time_seconds"] == pytest.approx(saved["time_seconds"], abs=0.01)
    assert summary["masked_share"] == 0.0
    turns = {int(b["label"]): b["count"] for b in summary["turns_histogram"]}
    expected: dict[int, int] = {}
    for record in records(messages_run):
        expected[record["metrics"]["turns"]] = expected.get(record["metrics"]["turns"], 0) + 1
    assert {t: c for t, c in turns.items() if c} == expected
    assert summary["status"]["finished"] == 12


def test_a_tampered_episode_is_flagged_in_its_row(viewer, messages_run):
    rows = viewer.json("/api/runs/0/episodes", q="count-vowels")["rows"]
    assert [(r["tampered"], r["score_reason"], r["reward"]) for r in rows] == [
        (1, "tampered", 0.0)
    ] * 2
    others = viewer.json("/api/runs/0/episodes", q="mean-empty")["rows"]
    assert {(r["tampered"], r["score_reason"]) for r in others} == {(0, None)}
    summary = viewer.json("/api/runs/0/summary")
    assert summary["tampered_episodes"] == 2
    saved = json.loads((messages_run / "summary.json").read_text())
    assert summary["integrity"] == saved["integrity"], "the viewer counts as summary.json does"
    assert summary["integrity"]["tampered"]["protected_file"] == 2
    timeline = summary["integrity_timeline"]
    assert sum(b["tampered"] for b in timeline) == 2
    assert summary["integrity"]["classes"]["task_files"] == 2  # its tests edited
    assert sum(b["classes"]["task_files"] for b in timeline) == 2, "per class over the run"
    assert sum(b["episodes"] for b in timeline) == summary["integrity"]["graded_episodes"]


def test_summary_follows_the_filters(viewer):
    summary = viewer.json("/api/runs/0/summary", reward="solved")
    assert summary["episodes"] == 4 and summary["mean_reward"] == 1.0


def test_an_episode_comes_with_its_conversation_result_and_files(viewer, messages_run):
    key = "episodes/mean-empty/0"
    episode = viewer.json("/api/runs/0/episode", key=key)
    folder = messages_run / key
    assert episode["messages"] == json.loads((folder / "messages.json").read_text())
    assert episode["record"] == json.loads((folder / "result.json").read_text())
    names = {f["name"] for f in episode["files"]}
    assert names == {"messages.json", "rollout.json", "log.txt", "result.json"}
    assert "diff --git a/stats.py" in episode["record"]["submission"]
    log = viewer.json("/api/runs/0/episode/log", key=key)
    assert "finished: finished reward=1.0" in log["text"] and not log["truncated"]


def test_tokens_are_the_rollouts_ids_with_their_owner_text_and_log_prob(
    viewer, token_run, qwen3_tokenizer
):
    key = "episodes/mean-empty/0"
    rollout = json.loads((token_run / key / "rollout.json").read_text())
    page = viewer.json("/api/runs/1/episode/tokens", key=key, offset=0, limit=20000)
    ids = rollout["prompt_ids"] + rollout["response_ids"]
    prompt = len(rollout["prompt_ids"])
    assert page["available"] and page["decoded"]
    assert page["ids"] == ids and page["total"] == len(ids) and page["prompt_length"] == prompt
    mask = rollout["response_mask"]
    assert page["kind"] == [0] * prompt + [1 if m else 2 for m in mask]
    assert 0 < page["counts"]["model"] < len(mask) and page["counts"]["env"] > 0
    for lp, m, expected in zip(page["logprob"][prompt:], mask, rollout["response_logprobs"]):
        assert lp == (pytest.approx(expected, abs=1e-4) if m else None)
    # Token text is exact: the pieces put together are the decoded ids.
    assert "".join(page["text"]) == qwen3_tokenizer.decode(ids)
    assert page["marks"] == [length for length, _ in rollout["turn_marks"]]
    assert page["marks"][0] == prompt and page["prefix_ok"] is True
    # A page in the middle decodes the same pieces as the whole.
    middle = viewer.json("/api/runs/1/episode/tokens", key=key, offset=prompt + 3, limit=50)
    assert middle["ids"] == ids[prompt + 3 : prompt + 53]
    assert middle["text"] == page["text"][prompt + 3 : prompt + 53]


def test_a_messages_only_rollout_says_it_has_no_tokens(viewer):
    page = viewer.json("/api/runs/0/episode/tokens", key="episodes/mean-empty/0")
    assert page["available"] is False and "messages only" in page["reason"]


def test_the_exactness_report_is_the_caches_own(viewer, token_run, qwen3_tokenizer):
    key = "episodes/mean-empty/0"
    report = viewer.json("/api/runs/1/episode/exactness", key=key)
    rollout = json.loads((token_run / key / "rollout.json").read_text())
    direct = Rollout.from_dict(rollout, qwen3_tokenizer).check_exactness()
    assert report["available"] and report["ok"] == direct.ok is True
    assert report["prefix_ok"] and report["ids_match"] == direct.ids_match
    # The model thought before each call; Qwen3's template keeps those thoughts in a
    # re-render of the same task, so the ids are exactly a fresh render.
    assert report["ids_match"] is True and report["differences"] == [] and report["kinds"] == {}


def test_a_rollout_changed_after_the_fact_fails_the_exactness_check(viewer_of, token_run, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(token_run, run)
    path = run / "episodes" / "mean-empty" / "0" / "rollout.json"
    rollout = json.loads(path.read_text())
    env = rollout["response_mask"].index(0)  # an observation token, after the first call
    rollout["response_ids"][env + 3] = rollout["response_ids"][env + 3] + 1
    path.write_text(json.dumps(rollout))
    viewer = viewer_of(str(run))
    tokens = viewer.json("/api/runs/0/episode/tokens", key="episodes/mean-empty/0", limit=1)
    assert tokens["prefix_ok"] is False and tokens["prefix_violations"]
    report = viewer.json("/api/runs/0/episode/exactness", key="episodes/mean-empty/0")
    assert report["ok"] is False and report["kinds"].get("drift", 0) >= 1


def test_compare_shows_what_changed_per_task(viewer):
    result = viewer.json("/api/compare", a=0, b=1, limit=100)
    change = {r["task_id"]: r["change"] for r in result["rows"]}
    assert change["palindrome-case"] == "improved" and change["fahrenheit"] == "regressed"
    assert change["mean-empty"] == "same" and change["factorial-zero"] == "same"
    # Biggest changes first.
    assert {r["task_id"] for r in result["rows"][:2]} == {"palindrome-case", "fahrenheit"}
    assert result["counts"] == {"improved": 1, "regressed": 1, "same": 4}
    only = viewer.json("/api/compare", a=0, b=1, change="improved")
    assert [r["task_id"] for r in only["rows"]] == ["palindrome-case"]
    assert only["rows"][0]["delta"] == 1.0


def test_a_folder_of_episode_folders_is_shown_without_a_results_file(viewer_of, messages_run):
    viewer = viewer_of(str(messages_run / "episodes"))
    listed = viewer.json("/api/runs")["runs"]
    assert listed[0]["kind"] == "tree" and listed[0]["episodes"] == 12
    rows = viewer.json("/api/runs/0/episodes", limit=100)["rows"]
    assert {(r["task_id"], r["sample"]) for r in rows} == {
        (r["task_id"], r["sample"]) for r in records(messages_run)
    }
    row = next(r for r in rows if r["key"] == "mean-empty/0")
    assert row["reward"] == 1.0 and row["status"] == "finished"
    episode = viewer.json("/api/runs/0/episode", key="mean-empty/0")
    assert episode["messages"][0]["role"] == "system"


def test_a_folder_of_run_folders_shows_each_run(viewer_of, messages_run, token_run, tmp_path):
    parent = tmp_path / "runs"
    parent.mkdir()
    (parent / "a").symlink_to(messages_run, target_is_directory=True)
    shutil.copytree(token_run, parent / "b")
    viewer = viewer_of(str(parent))
    assert [r["name"] for r in viewer.json("/api/runs")["runs"]] == ["a", "b"]


def test_an_old_run_folder_without_a_manifest_still_shows(viewer_of, messages_run, tmp_path):
    old = tmp_path / "old"
    shutil.copytree(messages_run, old)
    (old / "manifest.json").unlink()
    # An episode that started but never finished: a folder without a result.
    (old / "episodes" / "extra-task" / "0").mkdir(parents=True)
    viewer = viewer_of(str(old))
    page = viewer.json("/api/runs/0/episodes", limit=100)
    assert page["total"] == 13
    status = {r["key"]: r["status"] for r in page["rows"]}
    assert status["episodes/extra-task/0"] == "interrupted"
    assert sum(1 for s in status.values() if s == "finished") == 12


@pytest.mark.parametrize(
    ("path", "params", "status", "message"),
    [
        ("/api/runs/0/episodes", {"offset": "²"}, 400, "offset: expected a whole number"),
        ("/api/runs/0/episodes", {"limit": "--5"}, 400, "limit: expected a whole number"),
        ("/api/runs/0/episodes", {"limit": "1e3"}, 400, "limit: expected a whole number"),
        ("/api/runs/²/episodes", {}, 404, "no run '²'"),
        ("/api/runs/0/summary", {"status": "done,queued"}, 400, "status: unknown value"),
        ("/api/runs/0/episode", {}, 400, "key: the episode folder"),
        ("/api/runs/0/episode", {"key": "episodes/mean-empty/0\x00"}, 404, "no episode"),
        ("/api/runs/1/episode/tokens", {"key": "episodes/mean-empty/0", "offset": "x"}, 400, ""),
        ("/api/runs/0/episode/log", {"key": "episodes/mean-empty/0", "name": "x.txt"}, 404, ""),
        ("/api/compare", {"a": "0", "b": "٣"}, 404, "b: no run"),
        ("/api/compare", {"a": "0", "b": "1", "limit": "ten"}, 400, "limit: expected"),
    ],
)
def test_malformed_parameters_are_a_clear_error_not_a_500(viewer, path, params, status, message):
    response = viewer.get(path, **params)
    assert response.status_code == status, response.text
    assert message in response.json()["error"]


@pytest.fixture
def damaged(tmp_path: Path, token_run: Path) -> Path:
    """A token run whose files are damaged in the ways a crash or a bad disk leaves them."""
    run = tmp_path / "run"
    shutil.copytree(token_run, run)
    broken = run / "episodes" / "mean-empty" / "0"
    (broken / "messages.json").write_text('[{"role": "system", "content": "cut sh')
    (broken / "rollout.json").write_text("{")
    (broken / "result.json").write_text("not json")
    odd = run / "episodes" / "fahrenheit" / "0"
    rollout = json.loads((odd / "rollout.json").read_text())
    rollout["prompt_ids"] = "not a list"
    (odd / "rollout.json").write_text(json.dumps(rollout))
    record = json.loads((odd / "result.json").read_text())
    record["reward"] = float("nan")  # json writes NaN; JSON has none
    record["seed"] = 10**30  # past 64 bits
    (odd / "result.json").write_text(json.dumps(record))
    return run


def test_a_damaged_file_is_reported_for_its_episode_and_the_rest_still_shows(viewer_of, damaged):
    viewer = viewer_of(str(damaged))
    assert viewer.json("/api/runs/0/episodes")["total"] == 6
    episode = viewer.json("/api/runs/0/episode", key="episodes/mean-empty/0")
    assert "messages.json is not valid JSON" in episode["errors"]["messages.json"]
    assert "rollout.json is not valid JSON" in episode["errors"]["rollout.json"]
    assert "result.json is not valid JSON" in episode["errors"]["result.json"]
    assert episode["messages"] is None
    assert episode["record"]["task_id"] == "mean-empty", "the results line stands in"
    tokens = viewer.json("/api/runs/0/episode/tokens", key="episodes/mean-empty/0")
    assert tokens["available"] is False and "not valid JSON" in tokens["reason"]
    odd = viewer.json("/api/runs/0/episode", key="episodes/fahrenheit/0")
    assert odd["record"]["reward"] is None and odd["errors"] == {}
    assert odd["record"]["seed"] == 10**30
    tokens = viewer.json("/api/runs/0/episode/tokens", key="episodes/fahrenheit/0")
    assert tokens["available"] is False and "rollout.json is malformed" in tokens["reason"]


def test_calls_written_as_text_come_parsed_with_the_conversation(viewer_of, text_run):
    viewer = viewer_of(str(text_run))
    episode = viewer.json("/api/runs/0/episode", key="episodes/fahrenheit/0")
    call, output = episode["messages"][2], episode["messages"][3]
    assert "<tool_call>" in call["content"] and "tool_calls" not in call
    command = "sed -i 's/- 32/+ 32/' temperature.py && git diff"
    parsed = [{"name": "execute_bash", "arguments": {"command": command}}]
    assert call["parsed_tool_calls"] == parsed
    assert call["parsed_content"] == "Step 1: execute bash."
    assert output["role"] == "user" and output["tool_output_of"] == "execute_bash"
    log = viewer.json("/api/runs/0/episode/log", key="episodes/fahrenheit/0")["text"]
    assert f"turn 1: execute_bash $ {command} -> exit 0, " in log
    assert "turn 2: submit {} -> exit 0, " in log


def test_calls_made_through_the_chat_api_are_not_noted_again(viewer):
    messages = viewer.json("/api/runs/0/episode", key="episodes/fahrenheit/0")["messages"]
    assert messages[2]["tool_calls"] and "parsed_tool_calls" not in messages[2]
