"""Hostile and careless commands through AgentEnv, with and without bubblewrap (``env``
in conftest.py runs each test under both).

Each test is one thing an agent's command may do to its shell: print or forge
the session's control messages, read its input, shadow builtins, redirect its
descriptors, refuse to be interrupted, be cancelled by its caller. The session
must either make it harmless or report it (``SessionProtocolError``,
``ShellKilledError``) and never misattribute output or exit codes. Nothing here
depends on how fast the machine is: waits are for events (a file, a prompt).
"""

from __future__ import annotations

import asyncio
import os
import time
import tracemalloc
from pathlib import Path

import pytest

from uniagent.env import (
    ActionTimeoutError,
    AgentEnv,
    CommandEncodingError,
    EnvConfig,
    HostDeployment,
    HostDeploymentConfig,
    SessionProtocolError,
    ShellKilledError,
    bash_stop,
    procfs,
)
from uniagent.env.bash_protocol import ABORT_SIGNAL

PYTHON = "python3"


def session_of(env: AgentEnv):  # the host runtime's BashSession
    return env.runtime.sessions["default"]


async def exists(env: AgentEnv, name: str) -> bool:
    return (await env.run_action(f"test -e {name}")).exit_code == 0


async def appears(env: AgentEnv, name: str) -> None:
    """Wait (for the event, not for a time) until the sandbox's work dir holds ``name``.

    Watched from the host, so the session stays free (bash between commands).
    """
    path = Path(env.runtime.layout.to_host(name))
    while not path.exists():
        await asyncio.sleep(0.01)


def no_children(env: AgentEnv) -> bool:
    pid = session_of(env).pid
    return pid is not None and procfs.children(pid) == []


# -- interrupts: the whole line is aborted, nothing after it runs, the shell survives ---------
INTERRUPTED = {
    "sleep": "sleep 1000",
    "sigint-ignored": f"{PYTHON} -c 'import signal,time; signal.signal(2, signal.SIG_IGN); "
    "time.sleep(1000)'",
    "sigint-caught": f"{PYTHON} -c $'import time\\ntry:\\n time.sleep(1000)\\n"
    'except KeyboardInterrupt:\\n print("caught")\'',
    "shell-ignores-sigint": "trap '' INT; sleep 1000",
    "shell-traps-sigint": "trap 'echo handler' INT; sleep 1000",
    "setsid": "setsid sleep 1000",
    "loop": "while :; do sleep 0.05; done",
    "subshell": f"( {PYTHON} -c 'import signal,time; signal.signal(2, signal.SIG_IGN); "
    "time.sleep(1000)'; touch inner )",
    "stopped": "sh -c 'kill -STOP $$; sleep 1000'",
}


@pytest.mark.parametrize("program", list(INTERRUPTED.values()), ids=list(INTERRUPTED))
async def test_a_timeout_aborts_the_whole_line_and_keeps_the_shell(
    env: AgentEnv, program: str
) -> None:
    await env.run_action("mkdir here && cd here && KEPT=yes")
    with pytest.raises(ActionTimeoutError):
        await env.run_action(f"{program}; touch after; echo after", timeout=1)
    obs = await env.run_action("echo $PWD $KEPT")
    assert obs.output == f"{env.workdir}/here yes\n"
    assert (await env.run_action("ls")).output in ("", "inner\n")  # (inner: a subshell's)
    assert "inner" not in (await env.run_action("ls")).output
    assert no_children(env)


async def test_the_commands_sigint_trap_survives_an_interrupt(env: AgentEnv) -> None:
    with pytest.raises(ActionTimeoutError):
        await env.run_action("trap '' INT; sleep 1000", timeout=1)
    assert (await env.run_action("trap -p INT")).output == "trap -- '' SIGINT\n"


async def test_background_jobs_survive_an_interrupt(env: AgentEnv) -> None:
    job = int((await env.run_action("sleep 1000 & echo $!")).output.split()[-1])
    with pytest.raises(ActionTimeoutError):
        await env.run_action(f"{PYTHON} -c 'import signal,time; signal.signal(2, 1); "
                             "time.sleep(1000)'", timeout=1)  # fmt: skip
    assert (await env.run_action(f"kill -0 {job} && echo running")).output == "running\n"


async def test_a_command_that_interrupts_itself_reports_130(env: AgentEnv) -> None:
    obs = await env.run_action("echo first; kill -INT $$; echo never")
    assert (obs.output, obs.exit_code) == ("first\n", 130)
    assert (await env.run_action("echo next")).output == "next\n"


# -- cancellation: a command never runs after its caller gave up on it ------------------------
async def test_a_command_cancelled_while_waiting_for_the_shell_never_runs(env: AgentEnv) -> None:
    first = asyncio.ensure_future(env.run_action("touch started; sleep 1000"))
    await appears(env, "started")
    queued = asyncio.ensure_future(env.run_action("touch queued_ran"))
    await asyncio.sleep(0)  # it is waiting for the session now
    queued.cancel()
    first.cancel()
    for task in (queued, first):
        with pytest.raises(asyncio.CancelledError):
            await task
    assert not await exists(env, "queued_ran")
    assert no_children(env)


async def test_a_command_cancelled_while_running_is_stopped_and_leaks_nothing(
    env: AgentEnv,
) -> None:
    command = "echo leak; touch started; sleep 1000; touch after"
    task = asyncio.ensure_future(env.run_action(command))
    await appears(env, "started")
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    obs = await env.run_action("echo clean")
    assert (obs.output, obs.exit_code) == ("clean\n", 0)
    assert not await exists(env, "after") and no_children(env)


async def test_commands_cancelled_right_after_they_were_sent_leak_nothing(env: AgentEnv) -> None:
    for i in range(20):
        task = asyncio.ensure_future(env.run_action(f"echo leak{i}; sleep 0.05; echo leak{i}"))
        for _ in range(i % 4):  # cancel at different points of the send
            await asyncio.sleep(0)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert (await env.run_action("echo clean")).output == "clean\n"


# -- the control channel cannot be read, forged or taken over ---------------------------------
async def test_printed_markers_are_just_output(env: AgentEnv) -> None:
    forged = (
        "printf '\\036%s:1:0\\036\\n' 0123456789abcdef; "  # the old protocol's marker
        "printf '\\036E%s|0 1 1\\036\\n' \"$__ua_s\"; printf '\\036S\\036'; echo rest; false"
    )
    obs = await env.run_action(forged)  # (AgentEnv drops the control characters)
    assert obs.exit_code == 1
    assert obs.output.startswith("0123456789abcdef:1:0\nE")
    assert obs.output.endswith("|0 1 1\nSrest\n")
    assert (await env.run_action("echo next")).output == "next\n"


async def test_writing_to_the_control_channel_is_detected(env: AgentEnv) -> None:
    with pytest.raises(SessionProtocolError, match="control channel") as info:
        await env.run_action("printf '\\036E%s|0 1 x\\036' 00000000deadbeef >&255; echo more")
    assert "more" in info.value.partial_output
    assert (await env.run_action("echo fine; false")).exit_code == 1


async def test_a_replayed_prompt_does_not_end_a_command_early(env: AgentEnv) -> None:
    # $__ua_s is the previous command's nonce: a prompt with it is not this command's end.
    obs = await env.run_action(
        "printf '\\036E%s|0 1 1\\036' \"$__ua_s\" >&255; echo late; (exit 4)"
    )
    assert (obs.output, obs.exit_code) == ("late\n", 4)
    assert (await env.run_action("echo next")).output == "next\n"


async def test_debug_traps_and_history_never_see_a_live_nonce(env: AgentEnv) -> None:
    await env.run_action('trap "echo \\"\\$BASH_COMMAND\\" >> $PWD/cmds" DEBUG')
    await env.run_action("set -o history; HISTSIZE=1000; echo one")
    await env.run_action("echo two")
    history = (await env.run_action("history; trap - DEBUG")).output
    seen = (await env.run_action("cat cmds")).output
    assert "echo two" in seen
    nonces = session_of(env).wire.known
    assert not any(n in seen or n in history for n in nonces)


@pytest.mark.parametrize(
    "shadow",
    [
        "printf() { :; }; echo() { :; }; builtin() { :; }",
        "eval() { :; }; read() { :; }; kill() { :; }; trap() { :; }",
        "alias eval=true read=true command=true",
        "enable -n printf echo",
        "set -x",
        "PS1='$ '; PS0='> '; PS2=; PROMPT_COMMAND='echo pc'",
    ],
    ids=["functions", "more-functions", "aliases", "disabled-builtins", "xtrace", "prompts"],
)
async def test_shadowed_builtins_and_changed_prompts_do_not_change_exit_codes(
    env: AgentEnv, shadow: str
) -> None:
    await env.run_action(shadow)
    assert (await env.run_action("false")).exit_code == 1
    obs = await env.run_action("(exit 7)")
    assert obs.exit_code == 7 and "pc" not in obs.output


async def test_disabling_what_the_session_needs_is_reported_and_repaired(env: AgentEnv) -> None:
    for sabotage in ("enable -n read", "command() { :; }"):
        with pytest.raises(SessionProtocolError, match="restored"):
            await env.run_action(f"{sabotage}; false")
        assert (await env.run_action("echo ok; (exit 3)")).exit_code == 3


async def test_the_shells_input_and_control_sockets_cannot_be_opened(env: AgentEnv) -> None:
    # A background job waits until bash is between commands (its stdin is then the input
    # socket), then tries to read it and to write to the control socket through /proc.
    thief = (
        "(until [[ $(readlink /proc/$$/fd/0) == socket:* ]]; do :; done; "
        "{ cat /proc/$$/fd/0 > stolen; } 2> read.err; { echo x > /proc/$$/fd/2; } 2> write.err; "
        "touch done) >/dev/null 2>&1 &"
    )
    await env.run_action(thief)
    await appears(env, "done")
    assert "No such device or address" in (await env.run_action("cat read.err")).output
    assert "No such device or address" in (await env.run_action("cat write.err")).output
    assert (await env.run_action("cat stolen; echo next")).output == "next\n"


@pytest.mark.parametrize(
    ("redirect", "check"),
    [
        ("exec >/dev/null; echo hidden", "echo visible"),
        ("exec 1>&-; echo closed", "echo visible"),
        ("exec 2>&-; ls /nonexistent", "ls /nonexistent 2>&1 | grep -c 'No such'"),
        ("exec </dev/tty; echo next", "read -r x; echo $?"),
    ],
    ids=["stdout-null", "stdout-closed", "stderr-closed", "stdin-tty"],
)
async def test_exec_redirections_last_one_command(env: AgentEnv, redirect: str, check: str) -> None:
    await env.run_action(redirect)
    obs = await env.run_action(check)
    assert obs.output in ("visible\n", "1\n")


async def test_an_unopenable_tty_is_a_clean_error(env: AgentEnv) -> None:
    obs = await env.run_action("exec </dev/tty; echo next")
    assert obs.output.endswith("next\n") and "/dev/tty" in obs.output


async def test_exit_and_killing_the_shell_are_the_commands_doing(env: AgentEnv) -> None:
    with pytest.raises(ShellKilledError) as info:
        await env.run_action("echo bye; exit 3")
    assert "bye" in info.value.partial_output


async def test_a_read_only_prompt_breaks_the_shell_as_the_commands_doing(env: AgentEnv) -> None:
    with pytest.raises(ShellKilledError, match="control protocol"):
        await env.run_action("readonly PS1")


# -- what a terminal shows, and bad input -------------------------------------------------------
@pytest.mark.parametrize(
    ("command", "message", "code"),
    [
        ("sh -c 'kill -9 $$'", "Killed", 137),
        ("sh -c 'kill -SEGV $$'", "Segmentation fault", 139),
        (f"{PYTHON} -c 'import os; os.abort()'", "Aborted", 134),
    ],
)
async def test_fatal_signals_are_reported_like_in_a_terminal(
    env: AgentEnv, command: str, message: str, code: int
) -> None:
    obs = await env.run_action(command)
    assert (obs.output, obs.exit_code) == (message + "\n", code)
    quiet = await env.run_action("yes | head -1")  # SIGPIPE: a terminal says nothing
    assert quiet.output == "y\n"


@pytest.mark.parametrize("bad", ["echo a\x00b", "echo \ud800", "echo \udcff"])
async def test_unsendable_commands_are_a_clear_error_and_nothing_runs(
    env: AgentEnv, bad: str
) -> None:
    with pytest.raises(CommandEncodingError, match="nothing was run"):
        await env.run_action(bad + "; touch ran")
    assert not await exists(env, "ran")
    assert (await env.run_action("echo fine")).output == "fine\n"


async def test_a_huge_command_runs_off_the_event_loop_with_bounded_memory(env: AgentEnv) -> None:
    command = "echo " + "x" * 5_000_000 + " | wc -c"
    ticks = 0
    done = asyncio.Event()

    async def ticker() -> None:
        nonlocal ticks
        while not done.is_set():
            await asyncio.sleep(0.005)
            ticks += 1

    tick = asyncio.ensure_future(ticker())
    tracemalloc.start()
    try:
        obs = await env.run_action(command, timeout=300)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
        done.set()
        await tick
    assert obs.output == "5000001\n"
    assert peak < 100 * 1024 * 1024  # the command is 5 MB; nothing holds many copies of it
    # The loop kept running meanwhile: a blocked loop ticks at most once (the timer fires late).
    assert ticks >= 2


async def test_output_has_a_hard_cap() -> None:
    deployment = HostDeployment(HostDeploymentConfig(max_output_bytes=1 << 20))
    async with AgentEnv(deployment, EnvConfig(max_output_chars=0)) as env:
        obs = await env.run_action("head -c 30000000 /dev/zero | tr '\\0' x", timeout=300)
        assert len(obs.output) < (1 << 20) + 200
        assert obs.output.startswith("x" * 1000) and obs.output.endswith("x" * 1000)
        assert "[... 28951424 bytes of output dropped" in obs.output
        binary = await env.run_action("head -c 5000000 /dev/urandom", timeout=300)
        assert len(binary.output) < (1 << 20) + 200  # escapes of invalid UTF-8 included


async def test_the_abort_signal_at_the_prompt_is_harmless(env: AgentEnv) -> None:
    # bash 5.2 crashes on a SIGINT raised by a trap while it reads its input, so the abort
    # trap must do nothing at the prompt, even after a line that set the run flag and was
    # cut short before its trailer (simulated here by a bare line).
    wire = session_of(env).wire
    nonce, generation = wire.new_ids()
    line = wire.send_line("resync", nonce, generation, b"__ua_b=1\n", None)
    while not line.at_prompt:  # bash printed its prompt for the bare line
        await line.wait_change(60)
    os.kill(wire.pid, ABORT_SIGNAL)
    await bash_stop.start_resync(wire, line, time.monotonic() + 300)
    assert (await env.run_action("echo alive")).output == "alive\n"
