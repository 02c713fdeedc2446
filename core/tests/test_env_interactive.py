"""SWE-ReX runtime semantics of the host runtime: interactive programs, sessions, interrupts.

Interactive commands follow SWE-ReX 1.4.0's ``BashAction``: ``is_interactive_command``
starts a program (on a pseudo-terminal) or types a line to it and returns at one of
the ``expect`` patterns; ``is_interactive_quit`` ends it; ``BashInterruptAction`` with
``expect`` is Ctrl-C that leaves a REPL running.
"""

from __future__ import annotations

import shutil
from collections.abc import AsyncIterator

import pytest
import pytest_asyncio

from uniagent import open_env
from uniagent.env import ActionTimeoutError, AgentEnv, EnvError
from uniagent.env.errors import CommandTimeoutError
from uniagent.env.runtime import (
    BashAction,
    BashInterruptAction,
    CloseBashSessionRequest,
    CreateBashSessionRequest,
)

PROMPT = [">>> "]
NEEDS_BWRAP = pytest.mark.skipif(shutil.which("bwrap") is None, reason="needs bubblewrap")
ISOLATIONS = ["none", pytest.param("bwrap", marks=NEEDS_BWRAP)]  # as conftest's `env`


def typed(command: str, expect: list[str] = PROMPT, timeout: float = 60) -> BashAction:
    return BashAction(command=command, is_interactive_command=True, expect=expect, timeout=timeout)


async def test_a_python_repl(env: AgentEnv) -> None:
    run = env.runtime.run_in_session
    start = await run(typed("python3"))
    assert start.expect_string == ">>> " and "Python 3" in start.output
    assert (await run(typed("x = 41 + 1"))).output == ""
    obs = await run(typed("print(x)"))
    assert (obs.output, obs.exit_code, obs.expect_string) == ("42\n", 0, ">>> ")
    with pytest.raises(EnvError, match="interactive program is running"):
        await env.runtime.run_in_session(BashAction(command="echo no", check="silent"))
    end = await run(BashAction(command="quit()", is_interactive_quit=True, timeout=60))
    assert end.exit_code == 0
    assert (await env.run_action("echo back")).output == "back\n"


async def test_pdb_steps_through_a_script(env: AgentEnv) -> None:
    await env.write_file("s.py", "x = 1\ny = x + 1\nprint('y is', y)\n")
    run = env.runtime.run_in_session
    pdb = [r"\(Pdb\) "]
    assert "-> x = 1" in (await run(typed("python3 -m pdb s.py", pdb))).output
    assert "-> y = x + 1" in (await run(typed("n", pdb))).output
    assert (await run(typed("p x", pdb))).output == "1\n"
    assert "y is 2" in (await run(typed("c", pdb))).output
    await run(BashAction(command="q", is_interactive_quit=True, timeout=60))
    assert (await env.run_action("echo done")).output == "done\n"


async def test_ctrl_c_in_a_repl_keeps_it_running(env: AgentEnv) -> None:
    run = env.runtime.run_in_session
    await run(typed("python3"))
    with pytest.raises(CommandTimeoutError):
        await run(typed("import time; time.sleep(1000)", timeout=1))
    stopped = await run(BashInterruptAction(expect=PROMPT, timeout=1))
    assert "KeyboardInterrupt" in stopped.output and stopped.expect_string == ">>> "
    assert (await run(typed("print('alive')"))).output == "alive\n"
    await run(BashAction(command="quit()", is_interactive_quit=True, timeout=60))
    assert (await env.run_action("echo shell")).output == "shell\n"


async def test_an_interactive_program_that_never_prompts_times_out(env: AgentEnv) -> None:
    run = env.runtime.run_in_session
    with pytest.raises(CommandTimeoutError):
        await run(typed("python3", ["WONTHITTHIS"], timeout=1))
    await run(BashInterruptAction(timeout=1))  # no expect: the program is stopped
    assert (await env.run_action("echo shell")).output == "shell\n"


async def test_an_interactive_program_that_just_ends(env: AgentEnv) -> None:
    obs = await env.runtime.run_in_session(typed("echo once; (exit 5)"))
    assert (obs.output, obs.exit_code, obs.expect_string) == ("once\n", 5, "")


async def test_expect_needs_an_interactive_command(env: AgentEnv) -> None:
    with pytest.raises(EnvError, match="is_interactive_command"):
        await env.runtime.run_in_session(BashAction(command="echo", expect=[">"]))


async def test_sessions_by_name(env: AgentEnv) -> None:
    runtime = env.runtime
    await runtime.create_session(CreateBashSessionRequest(session="second"))
    obs = await runtime.run_in_session(BashAction(command="echo 2", session="second"))
    assert obs.output == "2\n"
    await runtime.close_session(CloseBashSessionRequest(session="second"))
    with pytest.raises(EnvError, match="no session named 'second'"):
        await runtime.close_session(CloseBashSessionRequest(session="second"))
    with pytest.raises(EnvError, match="no session named"):
        await runtime.run_in_session(BashAction(command="echo", session="second"))


async def test_interrupting_when_nothing_runs_is_a_no_op(env: AgentEnv) -> None:
    obs = await env.runtime.run_in_session(BashInterruptAction())
    assert (obs.output, obs.exit_code) == ("", 0)
    assert (await env.run_action("echo fine")).output == "fine\n"


# -- pty: every command on a terminal, as SWE-ReX's runtime runs them ------------------
@pytest_asyncio.fixture(params=ISOLATIONS)
async def terminal(request: pytest.FixtureRequest) -> AsyncIterator[AgentEnv]:
    """A host sandbox with ``pty: true``, without isolation and under bubblewrap."""
    async with open_env({"type": "host", "isolation": request.param, "pty": True}) as env:
        yield env


async def test_interrupt_pager(terminal: AgentEnv) -> None:
    # SWE-ReX's test_interrupt_pager: the pager waits for a key, so the command times out;
    # an interrupt brings the shell back and the session keeps working.
    run = terminal.runtime.run_in_session
    await run(BashAction(command="cd /tmp && export KEPT=yes", check="raise"))
    with pytest.raises(CommandTimeoutError):
        # -+F to force less to start
        await run(BashAction(command="echo 'blargh'|less -+F", timeout=0.1))
    await run(BashInterruptAction())
    r = await run(BashAction(command="echo 'asdf'", check="raise"))
    assert r.output == "asdf\n"
    assert (await run(BashAction(command='echo "$PWD $KEPT"'))).output == "/tmp yes\n"


async def test_without_pty_the_pager_dumps_and_reads_nothing(env: AgentEnv) -> None:
    # The default: stdin is /dev/null and output a pipe, so nothing waits for a key.
    obs = await env.runtime.run_in_session(BashAction(command="echo 'blargh'|less -+F", timeout=60))
    assert (obs.output, obs.exit_code) == ("blargh\n", 0)
    obs = await env.runtime.run_in_session(BashAction(command="read -r x; echo $?", timeout=60))
    assert obs.output == "1\n"


async def test_on_a_pty_a_prompt_waits_and_a_timeout_keeps_the_session(terminal: AgentEnv) -> None:
    assert (await terminal.run_action("[ -t 0 ] && [ -t 1 ] && echo terminal")).output == (
        "terminal\n"
    )
    with pytest.raises(ActionTimeoutError):
        await terminal.run_action("read -r x; echo got $x", timeout=0.5)
    # A program killed while the terminal was raw leaves it as it was at start.
    with pytest.raises(ActionTimeoutError):
        await terminal.run_action("stty raw -echo; sleep 1000", timeout=0.5)
    modes = (await terminal.run_action("stty -a")).output.split()
    assert "icanon" in modes and "-icanon" not in modes
    obs = await terminal.run_action("printf 'a\\nb\\n'; echo err >&2; (exit 3)")
    assert (obs.output, obs.exit_code) == ("a\nb\nerr\n", 3)
