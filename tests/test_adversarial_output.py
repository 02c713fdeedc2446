"""Host-side work on what the agent prints and writes is bounded and off the event loop.

One ``uniagent run`` of two episodes in one process: ``flood`` prints megabytes of
backspaces, carriage returns, escape sequences and a 1 MB line, and leaves a patch of
1 MB lines made to tempt the patch screen's rules; ``steady`` runs three small commands
and then its tests hang, so its grading timeout must fire. The steady episode's commands
answer as ever and its grading ends at its timeout: nothing the flood does holds the
process.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import yaml

from uniagent.testing.chat_server import ScriptedChatServer, shell_policy

#: About 5 MB: runs of backspaces and carriage returns, escapes, then a 1 MB line.
FLOOD = (
    "python3 -c \"import sys; c = 'x' * 1000 + chr(8) * 900 + chr(13) * 50 + "
    "chr(27) + '[2K' + chr(27) + ']0;t' + chr(7) + 'y' * 3000 + chr(10); "
    "sys.stdout.write(c * 1000 + 'z' * 1000000 + chr(10))\""
)
#: A source file of 1 MB lines shaped like what the content rules look for, each ending in a
#: real hit (a result line in a literal, an assignment into sys.path).
BAIT = (
    "python3 -c \"open('bait.py', 'w').write('x = \\\"' + 'PASSED ' * 150000 + "
    "'t::x\\\"' + chr(10) + 'y = ' + 'sys.path[' * 100000 + ' sys.path[0] = 1' + chr(10) + "
    "'z = \\\"' + 'a' * 1000000 + '\\\"' + chr(10))\""
)
SCRIPTS = {
    "flood": [FLOOD, BAIT],
    "steady": ["echo one", "echo two", "echo three"],
}
TESTS = {"flood": "test -f bait.py", "steady": "sleep 600"}
GRADING_TIMEOUT = 20


def commands(messages: list[dict]) -> list[str]:
    return SCRIPTS[messages[1]["content"].split()[0]]


def test_a_flood_of_output_does_not_hold_another_episode(tmp_path: Path) -> None:
    setup = "git init -q && git config user.email t@t && git config user.name t && "
    setup += "echo base > README && git add -A && git commit -qm base"
    rows = [
        {"instance_id": name, "problem_statement": f"{name} task", "test_command": TESTS[name]}
        for name in ("flood", "steady")
    ]
    (tmp_path / "tasks.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    config = {
        "tool_parser": "hermes",
        "tools": ["execute_bash", "submit"],
        "instance_template": "{problem_statement}",
        "interaction": {"max_turns": 6, "action_timeout": 120},
        "env": {"deployment": {"type": "host", "isolation": "none"}, "post_setup": [setup]},
        "reward": {"name": "command", "integrity": {"grading_timeout": GRADING_TIMEOUT}},
        "concurrency": 2,
    }
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(config))
    out = tmp_path / "out"
    with ScriptedChatServer(default=shell_policy(commands)) as server:
        done = subprocess.run(
            [sys.executable, "-m", "uniagent.cli", "run", str(tmp_path / "config.yaml"),
             "--data", str(tmp_path / "tasks.jsonl"), "--model",
             f"openai:{server.base_url}#scripted", "--out", str(out)],
            capture_output=True, text=True, timeout=900,
            env={**os.environ, "OPENAI_API_KEY": "test", "TMPDIR": str(tmp_path)},
        )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    records = {
        r["task_id"]: r for r in map(json.loads, (out / "results.jsonl").read_text().splitlines())
    }
    flood, steady = records["flood"], records["steady"]

    def shown(name: str) -> list[str]:  # what the episode's model saw of its commands
        messages = json.loads((out / "episodes" / name / "0" / "messages.json").read_text())
        return [m["content"] for m in messages if m["role"] == "tool"]

    # The steady episode saw its own output, exactly, and was graded to its timeout: its
    # tests hang, which is the policy's doing (0, trained on), not an infrastructure error.
    outputs = shown("steady")
    assert [o.strip() for o in outputs[:3]] == ["one", "two", "three"], outputs
    assert steady["reward"] == 0.0 and not steady["traj_masked"]
    assert steady["reward_info"]["score_reason"] == "grading_timed_out"
    # Its commands and its grading are bounded by what they do, not by the flood: three
    # echoes, and a grading that ends at its timeout (the tests would sleep 600 s).
    assert steady["metrics"]["env_seconds"] < 60, steady["metrics"]
    assert steady["timings"]["grading"] < GRADING_TIMEOUT + 60, steady["timings"]

    # The flood's output reached its model cut to the limit, the cut counted; its patch
    # was screened (the bait's lines are reported) and it was graded, not masked.
    flooded = shown("flood")[0]
    assert len(flooded) < 31_000 and "characters of output omitted" in flooded
    assert not flood["traj_masked"] and flood["error"] is None
    rules = {t["rule"] for t in flood["reward_info"]["integrity"]["tampered"]}
    assert {"fake-results", "import-path"} <= rules, flood["reward_info"]
