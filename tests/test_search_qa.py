"""``uniagent run`` of the search QA example end to end: the real Wikipedia corpus and
FanOutQA questions, the retrieval service started by the run, bubblewrap sandboxes that
reach it only through its socket, ``finish`` (uniagent-tools-swe) and ``search_qa``.

The model is a scripted chat server: it searches for the question, reads the first
result, and answers with a gold alias only if that alias appeared in what the tools
showed it (so a reward of 1.0 proves the search went through), except for one task
where it answers wrongly on purpose.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import yaml
from uniagent_tools_search.qa import normalize_answer

from uniagent.testing.chat_server import Reply, ScriptedChatServer, tool_call

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "search_qa" / "config.yaml"
TASKS = 8


@pytest.fixture(scope="module")
def prepared(tmp_path_factory) -> dict:
    """The example's data, prepared with the commands its README gives."""
    out = tmp_path_factory.mktemp("search_qa")
    data = subprocess.run(
        [sys.executable, "-m", "uniagent_tools_search.cli", "example-data", str(out)],
        capture_output=True,
        text=True,
        check=True,
    )
    report = json.loads(data.stdout)
    subprocess.run(
        [
            sys.executable,
            "-m",
            "uniagent_tools_search.cli",
            "index",
            report["corpus"],
            "--out",
            str(out / "index"),
        ],
        capture_output=True,
        check=True,
    )
    tasks = [json.loads(line) for line in Path(report["tasks"]).read_text().splitlines()]
    subset = out / "tasks.subset.jsonl"
    subset.write_text("".join(json.dumps(t) + "\n" for t in tasks[:TASKS]))
    return {"dir": out, "tasks": tasks[:TASKS], "data": subset}


@pytest.fixture
def config(prepared, tmp_path) -> Path:
    """The example config with this test's index and a private socket directory."""
    # Outside /tmp: the sandbox's private /tmp would hide a bind below it.
    sockets = Path(tempfile.mkdtemp(prefix="uniagent-search-e2e-", dir="/var/tmp"))
    socket = sockets / "search.sock"
    data = yaml.safe_load(EXAMPLE.read_text())
    data["services"]["search"].update(index=str(prepared["dir"] / "index"), unix_socket=str(socket))
    data["env"]["deployment"]["ro_binds"] = [str(sockets)]
    data["env"]["env"]["UNIAGENT_SEARCH_URL"] = f"unix://{socket}"
    data["reward"]["settings"]["check_service_url"] = f"unix://{socket}"
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(data))
    yield path
    shutil.rmtree(sockets, ignore_errors=True)


def policy(tasks: list[dict], wrong: str):
    answers = {t["question"]: t["answers"] for t in tasks}

    def reply(body: dict) -> Reply:
        messages = body["messages"]
        question = messages[1]["content"].removeprefix("Question: ")
        seen = [m["content"] for m in messages if m["role"] == "tool"]
        if not seen:
            return Reply(tool_calls=[tool_call("search", {"query": question}, "c1")])
        if len(seen) == 1:
            first = next(
                line.split("id: ", 1)[1]
                for line in seen[0].splitlines()
                if line.startswith("    id: ")
            )
            return Reply(tool_calls=[tool_call("fetch_document", {"id": first}, "c2")])
        if question == wrong:
            return Reply(tool_calls=[tool_call("finish", {"answer": "Atlantis"}, "c3")])
        shown = normalize_answer("\n".join(seen))
        found = next((a for a in answers[question] if normalize_answer(a) in shown), "unknown")
        return Reply(tool_calls=[tool_call("finish", {"answer": found}, "c3")])

    return reply


def test_the_example_runs_end_to_end_with_a_scripted_model(prepared, config, tmp_path):
    tasks = prepared["tasks"]
    out = tmp_path / "out"
    with ScriptedChatServer(default=policy(tasks, wrong=tasks[0]["question"])) as server:
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "uniagent.cli",
                "run",
                str(config),
                "--data",
                str(prepared["data"]),
                "--model",
                f"openai:{server.base_url}#scripted",
                "--out",
                str(out),
                "--concurrency",
                "4",
            ],
            capture_output=True,
            text=True,
            timeout=600,
            env={**os.environ, "OPENAI_API_KEY": "test"},
        )
    assert proc.returncode == 0, proc.stderr
    records = {r["task_id"]: r for r in map(json.loads, (out / "results.jsonl").open())}
    assert len(records) == TASKS
    assert {r["exit_reason"] for r in records.values()} == {"finished"}
    for task in tasks:
        record = records[task["id"]]
        messages = json.loads(Path(record["episode_dir"], "messages.json").read_text())
        outputs = [m["content"] for m in messages if m["role"] == "tool"]
        assert outputs[0].startswith("Found "), outputs[0]  # the search went through
        shown = normalize_answer("\n".join(outputs))
        answerable = any(normalize_answer(a) in shown for a in task["answers"])
        expected = 1.0 if answerable and task is not tasks[0] else 0.0
        assert record["reward"] == expected, (task, record["reward_info"])
        assert record["reward_info"]["answers"] == task["answers"]
    assert records[tasks[0]["id"]]["reward_info"]["prediction"] == "Atlantis"
    summary = json.loads((out / "summary.json").read_text())
    assert summary["tool_calls"] == {"search": TASKS, "fetch_document": TASKS, "finish": TASKS}
    assert summary["mean_reward"] >= 0.5, summary  # retrieval found most answers
    socket = Path(yaml.safe_load(config.read_text())["services"]["search"]["unix_socket"])
    assert not socket.exists(), "the run stops the service it started"


def test_uniagent_plugins_lists_the_search_plugin():
    proc = subprocess.run(
        [sys.executable, "-m", "uniagent.cli", "plugins"],
        capture_output=True,
        text=True,
        check=True,
    )
    lines = proc.stdout.split("uniagent-tools-search ", 1)[1].splitlines()
    section = "\n".join([lines[0], *[line for line in lines[1:] if line.startswith("  ")]])
    assert "tools: fetch_document, search, search_arxiv" in section
    assert "rewards: search_qa" in section and "services: search" in section
