"""execute_bash: runs in the persistent session; commands that would hang it are refused."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from uniagent import AgentConfig, ConfigError, resolve

from uniagent_tools_swe import BLOCKED_EXIT_CODE, DEFAULT_BLOCKED, BlockRule, make_execute_bash
from uniagent_tools_swe.blocking import screen, split_commands
from uniagent_tools_swe.shell import parse_commands

if TYPE_CHECKING:
    from conftest import Sandbox

REFUSED = "execute_bash refused to run this command, so nothing was executed"

BLOCKED = {
    "vim setup.py": "editor",
    "vi x": "editor",
    "cd /repo && nano README.md": "editor",
    "emacs -nw file.el": "editor",
    "sudo -u root /usr/bin/vim /etc/hosts": "editor",
    "git commit": "git-interactive",
    "git -C /repo commit --amend": "git-interactive",
    "git rebase -i HEAD~3": "git-interactive",
    "git add -p": "git-interactive",
    "sudo su": "repl",
    "su - postgres": "repl",
    "less log.txt": "pager",
    "git log | less": "pager",
    "more README": "pager",
    "top": "monitor",
    "htop": "monitor",
    "tail -f /var/log/syslog": "follow",
    "tail -n 20 -F app.log": "follow",
    "journalctl --follow": "follow",
    "watch -n 1 ls": "watch",
    "python": "repl",
    "python3": "repl",
    "ipython": "repl",
    "python3 -i script.py": "repl",
    "FOO=1 node": "repl",
    "bash": "repl",
    "python server.py &": "background",
    "sleep 100 & echo started": "background",
    "nohup ./daemon 2>&1 &": "background",
    "(cd /srv && ./serve) &": "background",
    "exit": "session",
    "ls || exit 1": "session",
    "exec bash": "session",
    "set -euo pipefail": "session",
    "set -o errexit": "session",
    "{ make || exit 1; }": "session",
    "for f in a b; do vim $f; done": "editor",
    "echo $(python)": "repl",  # its output is captured, but it reads the terminal
}

ALLOWED = [
    "echo vim is an editor",
    "grep -rn 'less than' src/",
    "git --no-pager log -n 3",
    "top -b -n 1",
    "tail -n 50 app.log",
    "tail -n 5 file-final.txt",
    "python -c 'import sys; print(sys.version)'",
    "python3 -m pytest -x tests/",
    "python3 script.py",
    "echo 'print(1)' | python3",
    "python3 - <<'EOF'\nimport os\nvim = 1\nexit()\nEOF",
    "cat > notes.md <<EOF\nuse less memory\nthen exit\nEOF\necho done",
    "timeout 5 tail -f app.log",
    "python server.py > /tmp/server.log 2>&1 &",
    "nohup ./daemon &> daemon.log &",
    "make 2>&1 | tee build.log",
    "ls && echo ok; pwd",
    "bash -c 'exit 3'",
    "emacs --batch -l build.el",
    "set +e",
    "git commit -m 'fix: x'",
    "git commit -am wip",
    "git commit --amend --no-edit",
    "git commit -F msg.txt",
    "git add -A && git status",
    "git rebase main",
    "su -c 'id' nobody",
    "set -x",
    "(exit 3)",
    "false || (exit 4)",
    "echo $(exit 0)",
    "# vim is not run here\necho hi",
    'echo "less; vim"',
    "git diff HEAD~1 -- src/ | head -n 40",
    "echo $(less x)",  # less with its output captured copies the file like cat
]


@pytest.mark.parametrize(("command", "rule"), BLOCKED.items())
def test_screen_catches_commands_that_would_hang_the_session(command: str, rule: str) -> None:
    verdict = screen(command)
    assert verdict is not None, command
    assert verdict.rule.name == rule


@pytest.mark.parametrize("command", ALLOWED)
def test_screen_lets_ordinary_commands_through(command: str) -> None:
    assert screen(command) is None


# -- the words bash runs, found by parsing (bashlex) ----------------------------------------
@pytest.mark.parametrize(
    "command",
    [
        "for n in python python3; do command -v $n; done",
        "for n in\n  python\n  python3\ndo\n  $n --version\ndone",
        "git commit-tree $(git write-tree) -p HEAD -m msg",
        "echo msg | git commit-tree HEAD^{tree}",
        "command -v vim && echo have vim",
        "GIT_EDITOR=true git commit",
        "less README.md | head -n 5",
        "vim --version",
        'git commit -m "-e is for edit"',  # the message, not the -e option
        "git commit -uno -m msg",
    ],
)
def test_words_that_are_not_blocking_commands_are_not_refused(command: str) -> None:
    assert screen(command) is None


@pytest.mark.parametrize(
    ("command", "rule"),
    [
        ("sudo env PYTHONPATH=src timeout 10 python", None),  # bounded: cannot hang
        ("sudo env PYTHONPATH=src nice -n 5 python", "repl"),
        ("ls | (cd src && less)", "pager"),
        ("if true; then git commit; fi", "git-interactive"),
        ("while true; do top; done", "monitor"),
        ("echo `vim notes`", "editor"),
        ("cat <(python3)", "repl"),
        ("bash -c 'cd /repo && vim x'", "editor"),
        ("bash -c 'exit 1'", None),  # its own process
        ("eval 'exit 1'", "session"),  # this shell
        ("ls | exit", None),  # a pipeline's command runs in a subshell
        ("cat <<'EOF' > f.txt\nvim\nEOF\nvim f.txt", "editor"),  # after a quoted heredoc
        ("[[ -f setup.py ]] && vim setup.py", "editor"),  # [[ ]] made parsable
        ("echo $((1 + 2)); python", "repl"),  # so is arithmetic
        ("files=(a b); nano ${files[0]}", "editor"),  # and arrays
        ("time vim x", "editor"),  # and the time keyword
        ("time (make && nano log)", "editor"),
        ("tail -f app.log > /tmp/copy.log 2>&1 &", None),  # the session does not wait
        ("tail -f app.log &", "background"),  # but its output would go everywhere
    ],
)
def test_commands_are_found_where_bash_runs_them(command: str, rule: str | None) -> None:
    verdict = screen(command)
    assert (verdict and verdict.rule.name) == rule


def test_what_bashlex_cannot_parse_runs_unscreened() -> None:
    # bash accepts `case`, bashlex does not implement it: the command is not refused on a
    # guess (the old regex screen refused valid commands that way).
    command = "case $1 in edit) vim x ;; esac"
    assert parse_commands(command) is None
    assert screen(command) is None


def test_a_builtin_rule_matches_a_command_line_given_as_text() -> None:
    editor = next(rule for rule in DEFAULT_BLOCKED if rule.name == "editor")
    assert editor.matches("cd /x && vim a.py")
    assert not editor.matches("command -v vim")


def test_a_rule_from_the_config_needs_a_pattern() -> None:
    with pytest.raises(ValueError, match="needs a `pattern`"):
        BlockRule(name="x", label="x", reason="x")


def test_split_commands_marks_pipes_and_background_jobs() -> None:
    parts = [c.normalized() for c in split_commands("A=1 sudo vim x | less && sleep 1 &")]
    assert parts == ["vim x", "| less", "sleep 1 &"]


def test_heredoc_bodies_are_not_commands() -> None:
    assert split_commands("cat <<-'END' > f\n\tvim\n\tEND\nls")[-1].words == ("ls",)


def test_blocked_message_names_the_command_and_what_to_do_instead() -> None:
    verdict = screen("cd /repo && vim a.py")
    assert verdict is not None
    message = verdict.message()
    assert message.startswith(f"{REFUSED}: `vim a.py`")
    assert "str_replace_editor" in message


def test_description_lists_what_is_refused() -> None:
    description = make_execute_bash().description
    for rule in DEFAULT_BLOCKED:
        assert rule.label in description
    assert "refused" not in make_execute_bash(blocked=()).description


def test_rules_can_be_given_as_config_mappings() -> None:
    spec = make_execute_bash(
        blocked=[
            {
                "name": "no-rm",
                "label": "rm -rf /",
                "pattern": r"^rm\s+-rf\s+/$",
                "reason": "Do not delete the root.",
            }
        ]
    )
    assert "Do not delete the root." in spec.to_command({"command": "rm -rf /"})
    assert spec.to_command({"command": "vim x"}) == "vim x"


def test_a_rule_with_a_bad_pattern_is_rejected() -> None:
    with pytest.raises(ValueError, match="pattern"):
        BlockRule(name="x", label="x", pattern="(", reason="x")


def test_a_default_rule_can_be_removed() -> None:
    rules = [r for r in DEFAULT_BLOCKED if r.name != "background"]
    spec = make_execute_bash(blocked=rules)
    assert spec.to_command({"command": "sleep 1 &"}) == "sleep 1 &"


# -- through a real sandbox --------------------------------------------------------------
@pytest.mark.asyncio
async def test_command_runs_and_its_output_and_exit_code_come_back(sandbox: Sandbox) -> None:
    obs = await sandbox.call(
        "execute_bash", command="echo hello; echo oops >&2; exit_code=3; (exit $exit_code)"
    )
    assert obs.exit_code == 3
    assert "hello" in obs.output
    assert "oops" in obs.output


@pytest.mark.asyncio
async def test_working_directory_and_variables_persist_between_calls(
    sandbox: Sandbox, tmp_path: Path
) -> None:
    target = tmp_path / "elsewhere"
    target.mkdir()
    await sandbox.call("execute_bash", command=f"cd {target} && export GREETING=hi")
    obs = await sandbox.call("execute_bash", command="pwd; echo $GREETING")
    assert obs.output.split() == [str(target), "hi"]


@pytest.mark.asyncio
async def test_a_refused_command_is_explained_and_not_run(sandbox: Sandbox) -> None:
    marker = sandbox.workdir / "ran"
    obs = await sandbox.call("execute_bash", command=f"touch {marker} && vim {marker}")
    assert obs.exit_code == BLOCKED_EXIT_CODE
    assert obs.output.startswith(f"{REFUSED}: `vim {marker}`")
    assert not marker.exists()
    # The session is still usable afterwards.
    obs = await sandbox.call("execute_bash", command="echo still here")
    assert (obs.exit_code, obs.output.strip()) == (0, "still here")


@pytest.mark.asyncio
async def test_a_refused_exit_keeps_the_session_alive(sandbox: Sandbox) -> None:
    obs = await sandbox.call("execute_bash", command="exit 1")
    assert obs.exit_code == BLOCKED_EXIT_CODE
    obs = await sandbox.call("execute_bash", command="echo alive")
    assert obs.output.strip() == "alive"


@pytest.mark.asyncio
async def test_a_command_bashlex_cannot_parse_still_runs(sandbox: Sandbox) -> None:
    obs = await sandbox.call(
        "execute_bash",
        command='for n in python python3; do case $n in python3) echo "$n";; esac; done',
    )
    assert (obs.exit_code, obs.output.strip()) == (0, "python3")


@pytest.mark.asyncio
async def test_an_empty_command_is_explained(sandbox: Sandbox) -> None:
    obs = await sandbox.call("execute_bash", command="   ")
    assert obs.exit_code == BLOCKED_EXIT_CODE
    assert "execute_bash got an empty command" in obs.output


@pytest.mark.asyncio
async def test_a_redirected_background_job_is_allowed(sandbox: Sandbox) -> None:
    log = sandbox.workdir / "bg.log"
    obs = await sandbox.call("execute_bash", command=f"(echo from-bg) > {log} 2>&1 &")
    assert obs.exit_code == 0, obs.output
    obs = await sandbox.call("execute_bash", command=f"wait; cat {log}")
    assert obs.output.strip() == "from-bg"


def test_the_rules_come_from_the_agent_config_as_the_tools_settings() -> None:
    settings = {
        "allow": ["background"],
        "extra": [
            {
                "name": "rm-root",
                "label": "rm -rf /",
                "pattern": r"^rm\s+-rf\s+/$",
                "reason": "Deleting the root would destroy the sandbox.",
            }
        ],
    }
    config = AgentConfig.from_dict({"tools": [{"name": "execute_bash", "settings": settings}]})
    [tool] = resolve(config).tools
    assert tool.to_command({"command": "sleep 5 &"}) == "sleep 5 &"  # allowed now
    assert "(exit 126)" in tool.to_command({"command": "rm -rf /"})
    assert "(exit 126)" in tool.to_command({"command": "vim x"})  # the other defaults stay
    assert "rm -rf /" in tool.description


def test_bad_tool_settings_name_their_key_path() -> None:
    bad = {"tools": [{"name": "execute_bash", "settings": {"allow": ["nope"], "blokced": []}}]}
    with pytest.raises(ConfigError) as err:
        resolve(AgentConfig.from_dict(bad, source="agent.yaml"))
    message = str(err.value)
    assert "agent.yaml" in message and "tools.0.settings.blokced: unknown key" in message
    assert "tools.0.settings.allow: no default rule named 'nope'" in message
