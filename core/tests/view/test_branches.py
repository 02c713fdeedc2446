"""A harness episode's tree in the token view: its branches are listed, each one's tokens
are its root-to-leaf path exactly, and the default view stays the saved main branch."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from uniagent.gateway.tree import TrajectoryTree, Turn

KEY = "episodes/mean-empty/0"


def with_tree(token_run: Path, tmp_path: Path) -> tuple[Path, list[list[int]]]:
    """A copy of the token run whose episode's rollout gains a tree of two branches: its
    own ids, and a fork after its prompt (another generation from the same prompt)."""
    run = tmp_path / "run"
    shutil.copytree(token_run, run)
    path = run / KEY / "rollout.json"
    rollout = json.loads(path.read_text())
    prompt, response = rollout["prompt_ids"], rollout["response_ids"]
    p = len(prompt)
    tree = TrajectoryTree()
    paths = [prompt + response, prompt + response[::-1][:7]]
    masks = [[0] * p + rollout["response_mask"], [0] * p + [1] * 7]
    for index, (ids, mask) in enumerate(zip(paths, masks)):
        end = tree.insert(ids, mask, [-0.5 if m else 0.0 for m in mask])
        turn = Turn(index, "chat", {}, p, len(ids) - p, "render", "stop", exact=True)
        tree.record(end, turn)
    rollout["tree"] = tree.to_dict()
    path.write_text(json.dumps(rollout))
    return run, paths


def test_the_token_view_lists_the_branches_and_shows_each(viewer_of, token_run, tmp_path):
    run, paths = with_tree(token_run, tmp_path)
    viewer = viewer_of(str(run))
    saved = json.loads((run / KEY / "rollout.json").read_text())
    main = viewer.json("/api/runs/0/episode/tokens", key=KEY, limit=20000)
    assert main["ids"] == saved["prompt_ids"] + saved["response_ids"] and main["branch"] is None
    assert [b["tokens"] for b in main["branches"]] == [len(p) for p in paths]
    for index, ids in enumerate(paths):
        page = viewer.json("/api/runs/0/episode/tokens", key=KEY, branch=index, limit=20000)
        assert page["ids"] == ids and page["branch"] == index
        assert page["prompt_length"] == len(saved["prompt_ids"]) and page["prefix_ok"] is True
    fork = viewer.json("/api/runs/0/episode/tokens", key=KEY, branch=1, limit=20000)
    assert fork["counts"]["model"] == 7 and fork["marks"] == [len(paths[1])]


def test_an_episode_without_a_tree_has_no_branches(viewer, token_run):
    page = viewer.json("/api/runs/1/episode/tokens", key=KEY, limit=1)
    assert page["branches"] == []
    bad = viewer.get("/api/runs/1/episode/tokens", key=KEY, branch=0)
    assert bad.status_code == 400 and "holds no tree" in bad.text


def test_a_branch_out_of_range_is_a_clear_error(viewer_of, token_run, tmp_path):
    run, _ = with_tree(token_run, tmp_path)
    viewer = viewer_of(str(run))
    bad = viewer.get("/api/runs/0/episode/tokens", key=KEY, branch=5)
    assert bad.status_code == 400 and "expected 0 to 1" in bad.text


def test_the_page_picks_a_branch_and_shows_its_tokens(viewer_of, token_run, tmp_path, page):
    from urllib.parse import quote

    from playwright.sync_api import expect

    run, _ = with_tree(token_run, tmp_path)
    viewer = viewer_of(str(run))
    page.goto(f"{viewer.url}#/r/0/e?key={quote(KEY, safe='')}&tab=tokens")
    picker = page.locator("#branch")
    expect(picker).to_be_visible()
    expect(page.locator(".branches")).to_contain_text("2 branches")
    stream = page.locator("#token-stream")
    expect(stream.locator(".tok.k-model").first).to_be_visible()
    picker.select_option("1")
    expect(stream.locator(".tok")).to_have_count(7)  # the fork: its 7 generated tokens
    expect(page.locator("#branch")).to_have_value("1")
