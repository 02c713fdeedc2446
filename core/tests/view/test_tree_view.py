"""A tree rollout (``interaction.branching``) in the viewer: the runs table holds its episode
once with every leaf, the summary counts each leaf as an episode (as the run's own summary
does), the episode's tree is drawn with its branch points' turns and its leaves' rewards,
and each leaf's tokens are its root-to-leaf path in the saved trajectory tree.

The run folder is a real run's (see view_runs.tree_run): one episode of the example task
set split at turns 2 and 3 into four leaves, two of which solve the task; the server is a
real `uniagent view` on 127.0.0.1, the browser headless Chromium.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
import pytest

KEY = "episodes/mean-empty/0"


@pytest.fixture(scope="module")
def tree_viewer(tree_run: Path) -> Any:
    """One `uniagent view` over the tree run for this module."""
    from conftest import start_viewer, stop_viewer

    viewer = start_viewer(str(tree_run))
    # Its first token request loads the tokenizer (imports torch): on a loaded machine that
    # can outlast a request's usual timeout, so it is made here, with a long one.
    params = {"key": KEY, "limit": 1}
    first = httpx.get(viewer.url + "api/runs/0/episode/tokens", params=params, timeout=600)
    assert first.status_code == 200 and first.json()["decoded"] is True, first.text
    yield viewer
    stop_viewer(viewer)


def saved(tree_run: Path, name: str) -> Any:
    return json.loads((tree_run / KEY / name).read_text())


def results(tree_run: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (tree_run / "results.jsonl").read_text().splitlines()]


def path_ids(tree: dict[str, Any], node_id: int) -> list[int]:
    """The ids from the tree's root to ``node_id``."""
    nodes = {n["id"]: n for n in tree["nodes"]}
    path = [nodes[node_id]]
    while path[-1]["parent"] != 0:
        path.append(nodes[path[-1]["parent"]])
    return [i for n in reversed(path) for i in n["ids"]]


def test_the_run_is_a_tree_of_four_leaves(tree_run):
    """What the viewer is shown: four results lines for one episode folder, two solved."""
    lines = results(tree_run)
    assert len(lines) == 4 and len({line["episode_dir"] for line in lines}) == 1
    assert lines[0]["episode_dir"].endswith(KEY)
    assert [line["leaf_index"] for line in lines] == [0, 1, 2, 3]
    assert sorted(line["reward"] for line in lines) == [0.0, 0.0, 1.0, 1.0]
    tree = saved(tree_run, "rollout.json")["tree"]
    assert sorted(s["turn"] for s in tree["splits"]) == [2, 3, 3]


def test_the_table_holds_the_episode_once_with_every_leaf(tree_viewer, tree_run):
    page = tree_viewer.json("/api/runs/0/episodes")
    assert page["total"] == 1
    (row,) = page["rows"]
    assert row["key"] == KEY and row["status"] == "finished"
    lines = results(tree_run)
    assert [(leaf["leaf"], leaf["reward"], leaf["exit_reason"]) for leaf in row["leaves"]] == [
        (line["leaf"], line["reward"], line["exit_reason"]) for line in lines
    ]
    # The row's reward is its leaves' mean, and so is the table's: each leaf counts once.
    assert row["reward"] == pytest.approx(0.5) and page["mean_reward"] == pytest.approx(0.5)
    assert page["rewarded"] == 4
    listed = tree_viewer.json("/api/runs")["runs"][0]
    assert listed["state"] == "finished" and listed["episodes"] == 1
    assert listed["status"] == {"finished": 1}


def test_the_summary_counts_each_leaf_as_the_runs_summary_does(tree_viewer, tree_run):
    summary = tree_viewer.json("/api/runs/0/summary")
    saved_summary = json.loads((tree_run / "summary.json").read_text())
    assert saved_summary["episodes"] == 4
    for key in ("episodes", "tasks", "mean_reward", "exit_reasons", "tool_calls", "pass_at_k"):
        assert summary[key] == pytest.approx(saved_summary[key]), key
    assert summary["status"]["finished"] == 4
    assert summary["reward_classes"] == {"solved": 2, "zero": 2}
    assert {b["label"]: b["count"] for b in summary["turns_histogram"]} == {"4": 4}


def test_the_episode_holds_its_tree_of_splits_and_leaves(tree_viewer, tree_run):
    episode = tree_viewer.json("/api/runs/0/episode", key=KEY)
    record = saved(tree_run, "result.json")
    assert episode["record"]["leaf_rows"] == record["leaf_rows"]
    assert [m["role"] for m in episode["messages"]] == [
        m["role"] for m in saved(tree_run, "messages.json")
    ]
    tree = episode["tree"]
    assert tree["leaves"] == 4 and tree["tokens"] is True
    saved_tree = saved(tree_run, "rollout.json")["tree"]
    by_name = {leaf["leaf"]: (i, leaf) for i, leaf in enumerate(saved_tree["leaves"])}

    root = tree["root"]
    assert root["name"] == "root" and root["leaf"] is None
    assert root["split"] == {"turn": 2, "width": 2, "why": "turn 2"}
    assert [c["name"] for c in root["children"]] == ["0", "1"]
    leaves = []
    for child in root["children"]:
        assert child["split"]["turn"] == 3 and child["split"]["width"] == 2
        name = child["name"]
        assert [g["name"] for g in child["children"]] == [f"{name}.0", f"{name}.1"]
        for grandchild in child["children"]:
            assert grandchild["children"] == [] and grandchild["split"] is None
            leaves.append(grandchild["leaf"])
    assert sorted(leaf["leaf"] for leaf in leaves) == sorted(by_name)
    for leaf in leaves:
        index, expected = by_name[leaf["leaf"]]
        assert leaf["index"] == index
        for field in ("branch", "node", "reward", "exit_reason", "turns", "traj_masked"):
            assert leaf[field] == expected[field], field
    # The two leaves under the branch that fixed the code solve the task, both or neither.
    for child in root["children"]:
        rewards = {g["leaf"]["reward"] for g in child["children"]}
        assert len(rewards) == 1
    assert sorted(leaf["reward"] for leaf in leaves) == [0.0, 0.0, 1.0, 1.0]


def test_each_leafs_tokens_are_its_path_in_the_tree(tree_viewer, tree_run):
    rollout = saved(tree_run, "rollout.json")
    tree = rollout["tree"]
    main = tree_viewer.json("/api/runs/0/episode/tokens", key=KEY, limit=20000)
    assert main["branch"] is None
    assert main["ids"] == rollout["prompt_ids"] + rollout["response_ids"]
    assert [(b["leaf"], b["reward"], b["exit_reason"]) for b in main["branches"]] == [
        (leaf["leaf"], leaf["reward"], leaf["exit_reason"]) for leaf in tree["leaves"]
    ]
    prompt = len(rollout["prompt_ids"])
    for index, leaf in enumerate(tree["leaves"]):
        page = tree_viewer.json("/api/runs/0/episode/tokens", key=KEY, branch=index, limit=20000)
        assert page["branch"] == index and page["ids"] == path_ids(tree, leaf["node"])
        assert page["prompt_length"] == prompt and page["prefix_ok"] is True
        assert page["decoded"] is True and len(page["marks"]) == leaf["turns"]
        assert page["counts"]["model"] == main["branches"][index]["model_tokens"]
    # The first leaf is the rollout saved beside the tree: the same ids and model calls.
    first = tree_viewer.json("/api/runs/0/episode/tokens", key=KEY, branch=0, limit=20000)
    assert first["ids"] == main["ids"] and first["marks"] == main["marks"]
    # Leaves differ after the split: the ones under different turn-2 branches at turn 2.
    texts = {
        tree["leaves"][i]["leaf"]: "".join(
            tree_viewer.json("/api/runs/0/episode/tokens", key=KEY, branch=i, limit=20000)["text"]
        )
        for i in range(4)
    }
    fixed = [name for name, leaf in ((x["leaf"], x) for x in tree["leaves"]) if leaf["reward"]]
    assert all("if values else 0.0" in texts[name] for name in fixed)
    assert all("if values else 0.0" not in texts[n] for n in texts if n not in fixed)


def test_a_leaf_out_of_range_is_a_clear_error(tree_viewer):
    bad = tree_viewer.get("/api/runs/0/episode/tokens", key=KEY, branch=4)
    assert bad.status_code == 400 and "expected 0 to 3" in bad.text


def test_the_other_episode_views_read_the_tree_episode(tree_viewer):
    log = tree_viewer.json("/api/runs/0/episode/log", key=KEY)
    assert log["text"]
    report = tree_viewer.json("/api/runs/0/episode/exactness", key=KEY)
    assert report["available"] is True
    compared = tree_viewer.json("/api/compare", a=0, b=0)
    (task,) = compared["rows"]
    assert task["change"] == "same" and task["a"]["mean_reward"] == pytest.approx(0.5)
    assert sorted(e["leaf"] for e in task["a"]["episodes"]) == ["0.0", "0.1", "1.0", "1.1"]


def test_a_retried_tree_replaces_all_its_leaves(viewer_of, tree_run, tmp_path):
    """A tree whose leaf failed for the infrastructure is run again whole: the later
    attempt's lines are the row's leaves, none of the earlier's."""
    run = tmp_path / "run"
    shutil.copytree(tree_run, run)
    lines = results(tree_run)
    failed = [
        {**line, "attempt": 1, "exit_reason": "env_error" if i == 1 else line["exit_reason"]}
        for i, line in enumerate(lines)
    ]
    retried = [{**line, "attempt": 2} for line in lines]
    (run / "results.jsonl").write_text(
        "".join(json.dumps(line) + "\n" for line in failed[:3] + retried)
    )
    viewer = viewer_of(str(run))
    (row,) = viewer.json("/api/runs/0/episodes")["rows"]
    assert row["attempt"] == 2 and row["status"] == "finished"
    assert [leaf["exit_reason"] for leaf in row["leaves"]] == ["finished"] * 4
    summary = viewer.json("/api/runs/0/summary")
    assert summary["episodes"] == 4 and summary["status"]["finished"] == 4

    # Only the failed attempt on record: the row failed (a retry would run the tree again).
    (run / "results.jsonl").write_text("".join(json.dumps(line) + "\n" for line in failed))
    viewer = viewer_of(str(run))
    (row,) = viewer.json("/api/runs/0/episodes")["rows"]
    assert row["status"] == "failed" and len(row["leaves"]) == 4


# ---------------------------------------------------------------------------------- browser


def test_the_page_draws_the_tree_and_opens_a_leaf(tree_viewer, tree_run, page, screenshot):
    from playwright.sync_api import expect

    tree = saved(tree_run, "rollout.json")["tree"]
    page.goto(tree_viewer.url)
    rows = page.locator("#runs-table tbody tr")
    expect(rows).to_have_count(1)
    expect(rows.first).to_contain_text("2/4 leaves solved")
    rows.first.get_by_role("link", name="mean-empty").click()

    # A tree rollout opens on its tree: the branch points with their turns, the leaves
    # with their rewards and exit reasons.
    drawing = page.locator("#tree")
    expect(page.locator("#tab-tree")).to_have_attribute("aria-selected", "true")
    root = drawing.locator(".tree-item[data-branch=root] > .tree-split")
    expect(root).to_have_attribute("data-turn", "2")
    expect(root).to_contain_text("split at turn 2")
    expect(drawing.locator(".tree-split[data-turn='3']")).to_have_count(2)
    leaves = drawing.locator("button.tree-leaf")
    expect(leaves).to_have_count(4)
    for leaf in tree["leaves"]:
        button = drawing.locator(f"button.tree-leaf[data-leaf='{leaf['leaf']}']")
        expect(button).to_contain_text(f"leaf {leaf['leaf']}")
        expect(button.locator(".reward")).to_have_text("1.0" if leaf["reward"] else "0.0")
        expect(button).to_contain_text(leaf["exit_reason"])
        # Under its branch point: the leaf "0.1" sits under branch "0", split at turn 3.
        parent = drawing.locator(f".tree-item[data-branch='{leaf['leaf'].split('.')[0]}']")
        expect(parent.locator(f"button.tree-leaf[data-leaf='{leaf['leaf']}']")).to_have_count(1)
    expect(page.locator("#episode-head")).to_contain_text("4 (2 solved")
    screenshot("tree-rollout")

    # Open a leaf that did not solve the task: its tokens, the picker on it.
    index, unsolved = next((i, x) for i, x in enumerate(tree["leaves"]) if not x["reward"])
    drawing.locator(f"button.tree-leaf[data-leaf='{unsolved['leaf']}']").click()
    expect(page.locator("#tab-tokens")).to_have_attribute("aria-selected", "true")
    # The viewer's first token view loads the tokenizer (imports torch): on a loaded
    # machine that can take longer than the page's usual wait, so this one waits longer.
    expect(page.locator("#branch")).to_have_value(str(index), timeout=300_000)
    expect(page.locator(".branches")).to_contain_text("4 leaves in this tree rollout")
    stream = page.locator("#token-stream")
    expect(stream.locator(".tok.k-model").first).to_be_visible()
    expect(stream).to_contain_text("len(values) + 1", use_inner_text=True)  # the wrong edit
    assert f"branch={index}" in page.url
    screenshot("tree-rollout-leaf", docs=False)

    # Another leaf from the picker: the one that fixed the code.
    solved = next(i for i, x in enumerate(tree["leaves"]) if x["reward"])
    page.locator("#branch").select_option(str(solved))
    expect(page.locator("#token-stream")).to_contain_text("if values else 0.0", use_inner_text=True)


def test_the_summary_page_counts_the_leaves(tree_viewer, page):
    from playwright.sync_api import expect

    page.goto(tree_viewer.url + "#/r/0/summary")
    summary = page.locator("#summary")
    expect(summary).to_contain_text("a tree rollout's leaves count one each")
    expect(summary.locator(".stat-card").first).to_contain_text("Episodes4")


def test_the_conversation_says_it_is_the_first_leafs(tree_viewer, page):
    from playwright.sync_api import expect

    page.goto(f"{tree_viewer.url}#/r/0/e?key={quote(KEY, safe='')}&tab=conversation")
    expect(page.locator("#first-leaf-note")).to_contain_text("first leaf's conversation")
    expect(page.locator("#conversation .msg-assistant")).to_have_count(4)


def test_a_folder_of_episode_folders_reads_a_trees_leaves_from_its_result(
    viewer_of, tree_run, tmp_path
):
    """Without a results file (a training dump's layout) the leaves come from the episode's
    ``result.json`` (``leaf_rows``): the same row and summary."""
    dump = tmp_path / "dump"
    shutil.copytree(tree_run / KEY, dump / "step-1" / "0")
    viewer = viewer_of(str(dump))
    (row,) = viewer.json("/api/runs/0/episodes")["rows"]
    assert row["key"] == "step-1/0" and row["reward"] == pytest.approx(0.5)
    leaf_rows = saved(tree_run, "result.json")["leaf_rows"]
    assert [leaf["leaf"] for leaf in row["leaves"]] == [r["leaf"] for r in leaf_rows]
    summary = viewer.json("/api/runs/0/summary")
    assert summary["episodes"] == 4 and summary["mean_reward"] == pytest.approx(0.5)
    tree = viewer.json("/api/runs/0/episode", key="step-1/0")["tree"]
    assert tree["root"]["split"]["turn"] == 2 and tree["leaves"] == 4
