"""Stopping a running command line and bringing bash back to a known state.

Holds on a saturated machine. bash itself only ever gets
:data:`~uniagent.env.bash_protocol.ABORT_SIGNAL`, whose trap does nothing
until the line's first statement has run, so a signal can never land while
bash parses a line (a SIGINT then could make it run a fragment of it).
SIGINT goes to the foreground programs (bash's descendants that are not
background jobs, ``setsid`` ones included) and
:data:`~uniagent.env.bash_protocol.ABORT_SIGNAL` to bash, whose trap then
aborts the rest of the line once they end, however they ended: bash itself
would go on after a program that caught or ignored SIGINT, or after running
the command's own SIGINT trap. Then SIGTERM and SIGKILL to the foreground
programs, never to bash or to background jobs. Each escalation waits while
``/proc`` shows progress (a signal still pending because the target has not
run yet, a runnable target, CPU time within the window) and escalates once the
targets sleep without exiting, ignore the signal, or use up the window's CPU
time; a deadline bounds it all. Finally a fresh trailer
(:func:`~uniagent.env.bash_protocol.resync_line`) re-establishes
the protocol; if bash never answers, the session is declared broken.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time

from uniagent.env import procfs
from uniagent.env.bash_protocol import ABORT_SIGNAL, resync_line
from uniagent.env.bash_wire import BashWire, Line
from uniagent.env.errors import ShellKilledError, TerminalNotAliveError
from uniagent.env.output import render_output


async def stop(wire: BashWire, line: Line, window: float, n_retry: int) -> None:
    """Interrupt ``line`` and resynchronise; ``line.done`` is resolved when this returns.

    Returns early, leaving the program running, when the line's expect
    patterns show up (an interactive program back at its prompt).
    """
    deadline = time.monotonic() + max(30.0, 20 * window)
    if not line.done.done():
        await _escalate(wire, line, window, n_retry, deadline)
    if line.done.done():
        return
    if line.expect and line.expect_hit():
        line.signalled = False  # it runs on; if it ends by itself later, resync then
        return
    await start_resync(wire, line, deadline)


async def _escalate(
    wire: BashWire, line: Line, window: float, n_retry: int, deadline: float
) -> None:
    # Let bash read the line first (on a saturated machine it may not have yet).
    while wire.unread() and not line.done.done():
        if time.monotonic() >= deadline:
            raise TimeoutError("bash did not read the command line")
        await line.wait_change(0.02)
    stages = [signal.SIGINT] * max(1, n_retry) + [signal.SIGTERM, signal.SIGKILL]
    for stage, sig in enumerate(stages):
        if await _back(wire, line, deadline) or (line.expect and line.expect_hit()):
            return
        # A first SIGINT with expect patterns is Ctrl-C in a REPL: the program should
        # survive it, so bash is not told to abort the line when the program ends.
        await _signal(wire, line, sig, abort=not (stage == 0 and line.expect))
        if await _watch(wire, line, sig, window, deadline):
            return
    # Even SIGKILL of every foreground program did not bring bash back.
    if not await bash_idle(wire, window, deadline):
        raise TimeoutError("bash itself does not come back (it ignores SIGINT in a shell loop?)")


async def _signal(wire: BashWire, line: Line, sig: int, *, abort: bool) -> None:
    """``sig`` to the foreground programs (never to bash: on a SIGINT bash would run a
    SIGINT trap of the command and go on with the line); ``abort`` tells bash to abort
    the line once they end."""
    line.signalled = True
    targets = await asyncio.to_thread(foreground, wire, line)
    if abort and wire.pid is not None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(wire.pid, ABORT_SIGNAL)
    for proc in targets:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(proc.pid, sig)
            if proc.state == "T":  # a stopped program handles signals once continued
                os.kill(proc.pid, signal.SIGCONT)


async def _back(wire: BashWire, line: Line, deadline: float) -> bool:
    """Whether bash is done with ``line``; a prompt with an earlier nonce counts only when
    bash really sits at its prompt (a command can print such a prompt itself)."""
    if line.done.done():
        return True
    if not line.at_prompt:
        return False
    if await bash_idle(wire, 0.5, deadline):
        return True
    line.at_prompt = False
    return False


def foreground(wire: BashWire, line: Line) -> list[procfs.ProcInfo]:
    """The programs the line runs: bash's descendants that are not background jobs.

    A background job is a child that existed before the line was written, or one
    started with ``&`` (bash without job control starts those with SIGINT and
    SIGQUIT ignored); its whole subtree is left alone.
    """
    if wire.pid is None:
        return []
    try:
        age = int((time.monotonic() - line.written_at) * procfs.CLOCK_TICKS)
        written = procfs.boot_ticks() - age - 1
    except OSError:
        written = 0
    found = []
    for child in procfs.children(wire.pid):
        info = procfs.info(child)
        if info is None:
            continue
        if info.start_ticks < written or (
            info.ignores(signal.SIGINT) and info.ignores(signal.SIGQUIT)
        ):
            continue
        for pid in procfs.subtree(child):
            sub = info if pid == child else procfs.info(pid)
            if sub is not None and sub.state not in "ZX" and pid not in wire.protected:
                found.append(sub)
    return found


async def _watch(wire: BashWire, line: Line, sig: int, window: float, deadline: float) -> bool:
    """Wait after ``sig``: True when bash is back, False when it is time to escalate."""
    quiet_since = time.monotonic()
    cpu_used = 0.0
    previous: dict[int, procfs.ProcInfo] = {}
    poll = 0.005
    next_scan = quiet_since + poll
    while True:
        if line.expect and line.expect_hit():
            return True
        if line.back and await _back(wire, line, deadline):
            return True
        now = time.monotonic()
        if now >= deadline:
            return False
        if now < next_scan:  # output wakes us often; /proc is read at most every `poll`
            await line.wait_change(min(next_scan, deadline) - now)
            continue
        poll = min(poll * 1.5, 0.1)
        next_scan = now + poll
        targets = {p.pid: p for p in await asyncio.to_thread(foreground, wire, line)}
        now = time.monotonic()
        if not targets:
            if await bash_idle(wire, 0.0, deadline):
                line.at_prompt = True  # at a prompt that is not ours (PS1 changed): resync
                return True
            bash = procfs.info(wire.pid) if wire.pid else None
            if bash is not None and (bash.state in "RD" or bash.has_pending(sig)):
                quiet_since = now  # bash itself is busy or has not run yet
            elif now - quiet_since > window:
                return False
            continue
        progress = set(targets) != set(previous)
        for pid, proc in targets.items():
            if proc.has_pending(sig) or proc.state == "R":
                progress = True  # not delivered yet, or being handled
            before = previous.get(pid)
            if before is not None and proc.cpu > before.cpu:
                cpu_used += proc.cpu - before.cpu
                progress = True
        if sig != signal.SIGKILL and all(p.ignores(sig) for p in targets.values()):
            return False
        previous = targets
        if progress:
            quiet_since = now
        if cpu_used > window or now - quiet_since > window:
            return False


async def bash_idle(wire: BashWire, window: float, deadline: float) -> bool:
    """Whether bash sits at its prompt reading input, waiting up to ``window`` for it."""
    if wire.pid is None:
        return False
    end = min(time.monotonic() + window, deadline)
    while True:
        reading = await asyncio.to_thread(procfs.reading_stdin, wire.pid)
        if reading is None:  # the kernel does not say: trust a sleeping, childless bash
            info = procfs.info(wire.pid)
            reading = info is not None and info.state == "S" and not procfs.children(wire.pid)
        if reading:
            return True
        if time.monotonic() >= end:
            return False
        await asyncio.sleep(0.02)


def start_resync(wire: BashWire, line: Line, deadline: float) -> asyncio.Future[None]:
    """Resynchronise after ``line`` (once, however many ask)."""
    if line.resync is None:
        line.resync = asyncio.ensure_future(_resync(wire, line, deadline))
        line.resync.add_done_callback(lambda t: t.cancelled() or t.exception())
    return line.resync


async def _resync(wire: BashWire, line: Line, deadline: float) -> None:
    """bash is back at its prompt without ``line``'s trailer: send a fresh one."""
    try:
        for attempt in range(3):
            if attempt or line.signalled:
                # Pending traps run before bash blocks reading: wait for that, so that no
                # signal lands while bash parses the resync line.
                await bash_idle(wire, 1.0, deadline)
            nonce, generation = wire.new_ids()
            resync = wire.send_line(
                "resync", nonce, generation, resync_line(nonce, generation).encode(), line.output
            )
            idle_checks = 0
            while not resync.done.done() and time.monotonic() < deadline:
                if await resync.wait_change(0.05):
                    continue
                if wire.unread() == 0 and await bash_idle(wire, 0.0, deadline):
                    idle_checks += 1  # bash read it all and waits for more: it was lost
                    if idle_checks >= 3:
                        break
                else:
                    idle_checks = 0
            if resync.done.done():
                end, _ = resync.done.result()
                if not line.done.done():
                    line.done.set_result((end, True))
                return
            if time.monotonic() >= deadline:
                break
            # Swallowed by an unfinished construct: SIGINT to bash while it reads
            # discards that; then try again.
            if wire.pid is not None:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(wire.pid, signal.SIGINT)
        wire.broken = wire.diagnose()
        head, dropped, tail = line.output.take()
        partial = render_output(head, dropped, tail, wire.buffer_limit, None)
        raise ShellKilledError(wire.broken, partial_output=partial)
    except TerminalNotAliveError as exc:
        wire.resolve_error(line, exc)
        raise
