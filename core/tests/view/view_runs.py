"""Real run folders for the viewer's tests: `uniagent run` over the tiny SWE tasks, the
model a scripted chat server on 127.0.0.1 (real HTTP), the sandboxes real host shells.

The policy is varied on purpose, so every part of the viewer has something to show: an
editor fix (a diff), a sed fix, a failing test run, a long output, a reply with no tool
call (format errors), an edit of the tests (tampering).
"""

from __future__ import annotations

import io
import itertools
import json
import os
import random
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from uniagent.testing import Reply, ScriptedChatServer, tool_call

ROOT = Path(__file__).resolve().parents[3]
MAKE_TASKS = ROOT / "examples" / "swe_tiny" / "make_tasks.py"
CONFIG = """\
tool_parser: hermes
tools: [execute_bash, str_replace_editor, submit]
instance_template: "{problem_statement}"
interaction:
  max_turns: 6
  action_timeout: 30
  timeout_budget: 120
  max_format_errors: 2
env:
  deployment:
    type: host
reward:
  name: command
  settings:
    timeout: 60
  integrity:
    protect_paths: [tests/]
concurrency: 3
sampling:
  temperature: 0.0
  max_tokens: 256
"""
TEST = "python3 -m unittest discover -s tests"

# Per task: the tool calls the policy makes, in order; then it submits. "TEXT" is a
# reply without a tool call.
PLANS: dict[str, list[Any]] = {
    "mean-empty": [
        ("execute_bash", {"command": "pwd && cat stats.py"}),
        (
            "str_replace_editor",
            {
                "command": "str_replace",
                "path": "{cwd}/stats.py",
                "old_str": "    return sum(values) / len(values)",
                "new_str": "    if not values:\n        return 0.0\n"
                "    return sum(values) / len(values)",
            },
        ),
        ("execute_bash", {"command": TEST}),
    ],
    "fahrenheit": [
        ("execute_bash", {"command": "sed -i 's/- 32/+ 32/' temperature.py && git diff"}),
    ],
    "palindrome-case": [("execute_bash", {"command": TEST})],
    "factorial-zero": ["TEXT", "TEXT"],
    "clamp-order": [("execute_bash", {"command": "seq 1 400"})],
    # Cheating: the tests are emptied so that they pass; the grader restores and reports it.
    "count-vowels": [("execute_bash", {"command": "echo 'import unittest' > tests/test_text.py"})],
}
# A second policy for A/B comparisons: one task better (palindrome), one worse (fahrenheit).
PLANS_B: dict[str, list[Any]] = {
    **PLANS,
    "palindrome-case": [
        (
            "execute_bash",
            {"command": """sed -i 's/replace(" ", "")/replace(" ", "").lower()/' words.py"""},
        ),
        ("execute_bash", {"command": TEST}),
    ],
    "fahrenheit": [],
}


THOUGHTS = [
    "Let me look at the code before changing anything.",
    "The bug is clear now; I will make the smallest fix.",
    "I should run the tests to check the fix.",
    "The work is done; time to submit.",
]


def make_tasks(out: Path) -> Path:
    """The example task set (git repositories and tasks.jsonl) under ``out``."""
    subprocess.run([sys.executable, str(MAKE_TASKS), str(out)], check=True, capture_output=True)
    return out / "tasks.jsonl"


def write_config(path: Path) -> Path:
    """The agent config these runs use."""
    path.write_text(CONFIG)
    return path


def task_of(messages: list[dict[str, Any]], task_ids: list[str]) -> str:
    """Which task a conversation is about (the problem statement names its function)."""
    hints = {
        "mean-empty": "stats.mean",
        "fahrenheit": "celsius_to_fahrenheit",
        "palindrome-case": "is_palindrome",
        "factorial-zero": "factorial",
        "clamp-order": "clamp",
        "count-vowels": "count_vowels",
    }
    user = next(m["content"] for m in messages if m["role"] == "user")
    return next((t for t in task_ids if hints.get(t, t) in user), task_ids[-1])


def next_message(body: dict[str, Any], plans: dict[str, list[Any]] = PLANS) -> dict[str, Any]:
    """The policy: the assistant message for this request."""
    messages = body["messages"]
    plan = plans[task_of(messages, list(plans))]
    step = sum(1 for m in messages if m["role"] == "assistant")
    if step < len(plan):
        action = plan[step]
        if action == "TEXT":
            return {"role": "assistant", "content": "I think the bug is in the loop bounds."}
        name, args = action
        if "path" in args:  # the editor wants an absolute path: the first output's `pwd`
            outputs = [  # a tool message, or (calls written as text) a user message
                m["content"].removeprefix("<tool_response>\n")
                for m in messages
                if m["role"] == "tool" or str(m["content"]).startswith("<tool_response>")
            ]
            cwd = outputs[0].split("\n")[0]
            args = {**args, "path": args["path"].format(cwd=cwd)}
        thought = f"Step {step + 1}: {name.replace('_', ' ')}."
        call = tool_call(name, args, f"call_{step}")
        return {"role": "assistant", "content": thought, "tool_calls": [call]}
    call = tool_call("submit", {}, "call_submit")
    return {"role": "assistant", "content": "Submitting.", "tool_calls": [call]}


def chat_policy(gate: threading.Event | None = None) -> Callable[[dict[str, Any]], Reply]:
    """Replies for a plain chat API; with ``gate``, each reply waits until it is set."""

    def reply(body: dict[str, Any]) -> Reply:
        if gate is not None:
            gate.wait()
        message = next_message(body)
        return Reply(message.get("content"), tool_calls=message.get("tool_calls"))

    return reply


def text_policy() -> Callable[[dict[str, Any]], Reply]:
    """Replies that write the calls as text, as a model served without a tool parser does:
    the agent's parser (hermes) reads them."""

    def reply(body: dict[str, Any]) -> Reply:
        message = next_message(body)
        text = message.get("content") or ""
        for call in message.get("tool_calls") or []:
            fn = call["function"]
            block = json.dumps({"name": fn["name"], "arguments": json.loads(fn["arguments"])})
            text += f"\n<tool_call>\n{block}\n</tool_call>"
        return Reply(text)

    return reply


def token_policy(tokenizer: Any) -> Callable[[dict[str, Any]], Reply]:
    """Replies the vLLM way (the message, its token ids and log-probs), by the B policy."""
    from uniagent.testing.tokenizers import template_generation_ids

    lock = threading.Lock()

    def reply(body: dict[str, Any]) -> Reply:
        # A Qwen3 model thinks first; vLLM's reasoning parser returns the thought apart.
        # (Qwen3's template keeps non-empty thoughts of the current task in a re-render,
        # so the server's prompt stays the cache's context: the trajectory is exact.)
        message = next_message(body, PLANS_B)
        step = sum(1 for m in body["messages"] if m["role"] == "assistant")
        message["reasoning_content"] = THOUGHTS[min(step, len(THOUGHTS) - 1)]
        ids = template_generation_ids(
            tokenizer,
            body["messages"],
            message,
            body.get("tools"),
            **(body.get("chat_template_kwargs") or {}),
        )
        with lock:  # mostly confident, now and then not: a realistic spread of log-probs
            rng = random.Random(len(body["messages"]) * 7919 + len(ids))
            logprobs = [-round(6 * rng.random() ** 6, 4) for _ in ids]
        return Reply(
            message.get("content"),
            tool_calls=message.get("tool_calls"),
            reasoning_content=message["reasoning_content"],
            token_ids=ids,
            logprobs=logprobs,
        )

    return reply


def cli_command(config: Path, tasks: Path, server: ScriptedChatServer, out: Path, *extra: str):
    """The ``uniagent run`` command line against the scripted server."""
    model = f"openai:{server.base_url}#scripted"
    return [
        *(sys.executable, "-m", "uniagent.cli", "run", str(config)),
        *("--data", str(tasks), "--model", model, "--out", str(out), *extra),
    ]


def run_env(tmp: Path) -> dict[str, str]:
    """The environment of a run: its own TMPDIR for sandboxes, a dummy API key."""
    tmp.mkdir(parents=True, exist_ok=True)
    return {**os.environ, "TMPDIR": str(tmp), "OPENAI_API_KEY": "test"}


def finished_run(workdir: Path, name: str, server: ScriptedChatServer, command: Any) -> Path:
    """Run ``command(config, tasks, out)`` (a child process) to the end against ``server``."""
    tasks = make_tasks(workdir / "swe_tiny")
    config = write_config(workdir / "config.yaml")
    out = workdir / name
    with server:
        proc = subprocess.run(
            command(config, tasks, out),
            capture_output=True,
            text=True,
            env=run_env(workdir / "tmp"),
            timeout=600,
        )
    if proc.returncode != 0:
        raise RuntimeError(f"the run {name} failed:\n{proc.stderr[-3000:]}")
    return out


def messages_run(workdir: Path, *, n: int = 2) -> Path:
    """A finished ``uniagent run`` (messages mode) with ``n`` samples per task."""
    server = ScriptedChatServer(default=chat_policy())
    return finished_run(
        workdir,
        "run-messages",
        server,
        lambda config, tasks, out: cli_command(config, tasks, server, out, "--n", str(n)),
    )


def text_run(workdir: Path) -> Path:
    """A finished run whose model writes its calls as text (messages mode), 2 tasks."""
    server = ScriptedChatServer(default=text_policy())
    return finished_run(
        workdir,
        "run-text",
        server,
        lambda config, tasks, out: cli_command(config, tasks, server, out, "--limit", "2"),
    )


def token_run(workdir: Path, tokenizer: Any) -> Path:
    """A finished run in token mode: what ``uniagent run`` writes against a vLLM server.

    The command line has no tokenizer option for an OpenAI endpoint yet, so a child
    process (this file run as a script) drives the same runner with the OpenAI backend
    given the real Qwen3 tokenizer; the scripted server answers here.
    """
    server = ScriptedChatServer(tokenizer=tokenizer, default=token_policy(tokenizer))
    return finished_run(
        workdir,
        "run-tokens",
        server,
        lambda config, tasks, out: [
            *(sys.executable, __file__, str(config), str(tasks), server.base_url, str(out))
        ],
    )


TREE_FIX = "sed -i 's|/ len(values)$|/ len(values) if values else 0.0|' stats.py"
TREE_WRONG = "sed -i 's|len(values)|(len(values) + 1)|' stats.py"


def tree_policy() -> Callable[[Any], str]:
    """The tree rollout's policy (as core/tests/test_tree_rollout.py's): turn 1 reads the
    code, turn 2 (the first branch point) fixes it or breaks it, turn 3 (the second) runs
    the tests, then it submits. Which leaves solve the task is in the record, not here."""
    from uniagent.testing.scripted import hermes_call

    second = itertools.cycle([TREE_FIX, TREE_WRONG])

    def reply(cache: Any) -> str:
        turn = cache.num_turns + 1
        if turn == 1:
            return hermes_call("execute_bash", {"command": "cat stats.py"}, "Let me look.")
        if turn == 2:
            return hermes_call("execute_bash", {"command": next(second)})
        if turn == 3:
            return hermes_call("execute_bash", {"command": TEST})
        return hermes_call("submit")

    return reply


def tree_run(workdir: Path) -> Path:
    """A finished tree rollout (``interaction.branching``): the example's config over its
    mean-empty task, in token mode (the scripted token policy, the real Qwen3 tokenizer),
    split in two at turn 2 and each branch in two again at turn 3: four leaves, the two
    under the fix solve the task. The runner test_tree_rollout uses, in a child process
    (this file run as a script: no event loop of the tests' is in its way)."""
    tasks = make_tasks(workdir / "swe_tiny")
    out = workdir / "run-tree"
    proc = subprocess.run(
        [sys.executable, __file__, "tree", str(tasks), str(out)],
        capture_output=True,
        text=True,
        env=run_env(workdir / "tmp"),
        timeout=600,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"the tree run failed:\n{proc.stderr[-3000:]}")
    return out


def _run_tree(tasks_path: str, out: str) -> None:
    """What ``uniagent run`` does with ``interaction.branching``, the model scripted."""
    import yaml

    from uniagent.config import AgentConfig
    from uniagent.run.progress import Progress
    from uniagent.run.runner import run_sync
    from uniagent.tasks import load_tasks
    from uniagent.testing import load_qwen3_tokenizer
    from uniagent.testing.scripted import ScriptedTokenModel

    data = yaml.safe_load((ROOT / "examples" / "swe_tiny" / "config.yaml").read_text())
    data["env"]["deployment"]["isolation"] = "none"
    data["interaction"]["branching"] = {"at_turns": [2, 3], "width": 2}
    tasks, bad = load_tasks(tasks_path)
    mean = [t for t in tasks if t.id == "mean-empty"]
    model = ScriptedTokenModel(load_qwen3_tokenizer(), policy=tree_policy())
    run_sync(
        AgentConfig.from_dict(data), mean, bad, lambda: model, Path(out),
        progress=Progress(io.StringIO(), live=False),
    )  # fmt: skip


def _run_in_token_mode(config_path: str, tasks_path: str, base_url: str, out: str) -> None:
    """What ``uniagent run`` does, with a tokenizer for the OpenAI backend."""
    from uniagent.config import AgentConfig
    from uniagent.models import OpenAIChatModel
    from uniagent.run.progress import Progress
    from uniagent.run.runner import run_sync
    from uniagent.tasks import load_tasks
    from uniagent.testing import load_qwen3_tokenizer

    config = AgentConfig.from_yaml(config_path)
    tasks, bad = load_tasks(tasks_path)
    tokenizer = load_qwen3_tokenizer()

    def factory() -> OpenAIChatModel:
        return OpenAIChatModel(
            base_url,
            "scripted",
            api_key="test",
            tokenizer=tokenizer,
            sampling_params=dict(config.sampling),
            max_model_len=16384,
        )

    run_sync(config, tasks, bad, factory, Path(out), progress=Progress(io.StringIO(), live=False))


if __name__ == "__main__":
    if sys.argv[1] == "tree":
        _run_tree(*sys.argv[2:4])
    else:
        _run_in_token_mode(*sys.argv[1:5])
