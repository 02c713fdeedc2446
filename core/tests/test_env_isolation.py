"""Host sandboxes under pressure: resource limits, isolation, every process ended, leftovers.

Each hostile test runs under ``isolation: none`` and ``bwrap`` (real bubblewrap,
real cgroups and tmpfs mounts where this machine allows them: CI runs as root).
"""

from __future__ import annotations

import asyncio
import json
import os
import select
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from uniagent import open_env
from uniagent.env import AgentEnv, HostDeployment, HostDeploymentConfig
from uniagent.env import cgroups as cgroup_module
from uniagent.env.host import BWRAP_WORKDIR, EPISODE_PREFIX, SANDBOX_UID, cleanup_leftovers

ISOLATIONS = ["none", "bwrap"]
SMALL = {"pids": 128, "memory": "256m", "disk": "64m"}


def config(isolation: str, **settings: object) -> dict:
    return {"type": "host", "isolation": isolation, "limits": SMALL, **settings}


def alive(pid: int, timeout: float = 30.0) -> bool:
    """Whether ``pid`` still runs ``timeout`` s from now at the latest. A process killed as
    the sandbox closed leaves its cgroup as it starts to exit, a moment before it has ended
    (on a loaded machine, a noticeable one): its pidfd becomes readable when it has."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return False
    try:
        return not select.select([fd], [], [], timeout)[0]
    finally:
        os.close(fd)


async def host_pids(env: AgentEnv) -> list[int]:
    """Every process of the sandbox, as host pids (through its cgroup)."""
    group = env.deployment._layout.cgroup
    assert group is not None, "this machine gives host sandboxes a cgroup (root)"
    return group.pids()


# -- resource limits -----------------------------------------------------------------------


@pytest.mark.parametrize("isolation", ISOLATIONS)
async def test_a_fork_bomb_is_contained_and_the_session_survives(isolation):
    async with open_env(config(isolation)) as env:
        obs = await env.run_action(
            "timeout 10 bash -c 'f(){ f | f & }; f' 2>&1 | grep -m1 -o 'Resource temporarily "
            "unavailable'; true",
            timeout=60,
        )
        assert "Resource temporarily unavailable" in obs.output
        group = env.deployment._layout.cgroup
        assert group.pids_refused()
        assert (await env.run_action("echo still here", timeout=30)).output == "still here\n"


@pytest.mark.parametrize("isolation", ISOLATIONS)
async def test_a_memory_hog_is_killed_and_reported(isolation):
    async with open_env(config(isolation)) as env:
        obs = await env.run_action(
            "python3 -c 'b = bytearray(2 * 1024 ** 3)'; echo exit=$?", timeout=60
        )
        assert "exit=137" in obs.output  # SIGKILL by the kernel's OOM killer
        assert env.deployment._layout.cgroup.oom_killed()
        assert (await env.run_action("echo still here", timeout=30)).output == "still here\n"


@pytest.mark.parametrize("isolation", ISOLATIONS)
async def test_a_disk_filler_stops_at_the_disk_limit(isolation):
    async with open_env(config(isolation)) as env:
        obs = await env.run_action("head -c 200M /dev/zero > big; echo exit=$?", timeout=60)
        assert "No space left on device" in obs.output and "exit=1" in obs.output
        size = (env.deployment.root / "work" / "big").stat().st_size
        assert size <= 64 * 1024 * 1024
        assert (await env.run_action("rm big && echo freed", timeout=30)).output == "freed\n"


# -- isolation -----------------------------------------------------------------------------


async def test_bubblewrap_root_is_not_host_root_for_host_files(tmp_path):
    async with open_env({"type": "host", "isolation": "bwrap"}) as env:
        obs = await env.run_action("id -u; cat /etc/shadow; touch mine", timeout=30)
        assert obs.output.startswith("0\n")  # root inside...
        assert "Permission denied" in obs.output  # ...but not for the host's files
        owner = (env.deployment.root / "work" / "mine").stat().st_uid
        assert owner != 0


@pytest.mark.parametrize("where", ["tmp", "home"])
async def test_binds_are_visible_wherever_they_point(where, tmp_path):
    base = Path("/tmp") if where == "tmp" else Path.home()
    data = Path(os.path.realpath(base)) / f"uniagent-bind-test-{os.getpid()}"
    data.mkdir(exist_ok=True)
    try:
        (data / "hello.txt").write_text("hi\n")
        writable = tmp_path / "out"
        writable.mkdir()
        os.chown(writable, SANDBOX_UID, SANDBOX_UID)  # the sandbox's root is this host uid
        settings = {"ro_binds": [str(data)], "binds": [f"{writable}:/data/out"]}
        async with open_env({"type": "host", "isolation": "bwrap", **settings}) as env:
            obs = await env.run_action(
                f"cat {data}/hello.txt; echo x > {data}/no 2>&1; echo made > /data/out/f",
                timeout=30,
            )
            assert obs.output.startswith("hi\n") and "Read-only file system" in obs.output
        assert (writable / "f").read_text() == "made\n"
    finally:
        for child in data.iterdir():
            child.unlink()
        data.rmdir()


@pytest.mark.parametrize("isolation", ISOLATIONS)
async def test_host_secrets_never_enter_the_sandbox(isolation, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-secret-of-the-host")
    monkeypatch.setenv("UNIAGENT_TEST_PASSED", "yes")
    settings = {"pass_env": ["UNIAGENT_TEST_*"]}
    async with open_env({"type": "host", "isolation": isolation, **settings}) as env:
        obs = await env.run_action("env", timeout=30)
    assert "sk-secret-of-the-host" not in obs.output
    assert "UNIAGENT_TEST_PASSED=yes" in obs.output


@pytest.mark.parametrize("isolation", ISOLATIONS)
async def test_every_process_ends_at_close_setsid_and_daemons_too(isolation):
    env = open_env(config(isolation))
    await env.start()
    await env.run_action(
        "setsid sleep 1000 >/dev/null 2>&1 < /dev/null & "
        "(setsid bash -c 'sleep 1001 & disown' &) ; nohup sleep 1002 >/dev/null 2>&1 &",
        timeout=30,
    )
    pids = await host_pids(env)
    assert len(pids) >= 4  # bash and its sleeps (and bwrap)
    root = env.deployment.root
    await env.close()
    assert not any(alive(p) for p in pids)
    assert not root.exists()


async def test_the_default_is_bubblewrap_where_it_works():
    async with open_env({"type": "host"}) as env:
        assert env.workdir == "/uniagent/work"
        assert (await env.run_action("hostname", timeout=30)).output == "sandbox\n"


@pytest.mark.parametrize("isolation", ["auto", "bwrap"])
def test_a_bind_into_the_sandboxs_own_dirs_is_refused_when_the_config_loads(isolation):
    for inside in (BWRAP_WORKDIR, f"{BWRAP_WORKDIR}/repo", "/uniagent/tools/x"):
        with pytest.raises(ValueError, match="would appear inside the sandbox's"):
            HostDeploymentConfig(isolation=isolation, ro_binds=[f"/srv:{inside}"])
    # Plain host paths, wherever the host keeps its checkouts (/srv, /tmp, ...), are fine.
    HostDeploymentConfig(isolation=isolation, ro_binds=["/srv/checkouts/repo", "/tmp/repo"])


async def test_without_bubblewrap_the_default_runs_unisolated_with_a_warning(caplog):
    cfg = {"type": "host", "bwrap": "no-such-bwrap-here"}
    async with open_env(cfg) as env:
        assert env.workdir != "/uniagent/work"
    assert "WITHOUT isolation" in caplog.text
    with pytest.raises(Exception, match="no-such-bwrap-here"):
        async with open_env({**cfg, "isolation": "bwrap"}):
            pass


async def test_cancelling_start_leaves_no_episode_directory(tmp_path):
    base = tmp_path / "episodes"
    for _ in range(20):
        deployment = HostDeployment(HostDeploymentConfig(isolation="none", base_dir=str(base)))
        task = asyncio.ensure_future(deployment.start())
        await asyncio.sleep(0)  # let it begin
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await deployment.stop()
    # What a cancelled start made is removed once its thread is done.
    for _ in range(500):
        if not any(base.iterdir()):
            break
        await asyncio.sleep(0.01)
    assert list(base.iterdir()) == []


# -- leftovers of a killed run -------------------------------------------------------------


def test_a_killed_runs_sandboxes_are_found_and_removed(tmp_path):
    base = tmp_path / "episodes"
    script = textwrap.dedent(
        f"""
        import asyncio, sys
        from uniagent import open_env
        async def main():
            env = open_env({{"type": "host", "isolation": sys.argv[1],
                                        "base_dir": {str(base)!r}}})
            await env.start()
            await env.run_action("setsid sleep 1000 >/dev/null 2>&1 < /dev/null &", timeout=30)
            print(env.deployment.root, flush=True)
            await asyncio.sleep(3600)
        asyncio.run(main())
        """
    )
    for isolation in ISOLATIONS:
        proc = subprocess.Popen(
            [sys.executable, "-c", script, isolation], stdout=subprocess.PIPE, text=True
        )
        root = Path(proc.stdout.readline().strip())
        assert root.name.startswith(f"{EPISODE_PREFIX}{proc.pid}-")
        [group] = _groups_of(proc.pid)
        pids = group.pids()
        assert pids
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        # Another test process's run may clean the dead owner's cgroup up first (cgroups
        # are machine-wide): what counts is the state after this call, and that the work
        # dir, which only this base holds, was found here.
        removed = cleanup_leftovers(str(base))
        assert str(root) in removed
        assert not root.exists()
        assert not _groups_of(proc.pid)
        assert not any(alive(p) for p in pids)
        ours = f"{EPISODE_PREFIX}{proc.pid}-"
        assert not [r for r in cleanup_leftovers(str(base)) if ours in r or str(base) in r]


def test_a_process_entering_the_group_as_it_is_removed_is_ended_and_the_group_goes() -> None:
    """A command can start into the sandbox's groups while the sandbox closes (an
    interrupted set-up: its process moves itself in after the close killed the others).
    The kernel then refuses to remove a group; before, that was ignored and the groups
    outlived the run."""
    group = cgroup_module.create(pids=64, memory=None)
    assert group is not None, "this machine gives host sandboxes a cgroup (root)"
    started: list[subprocess.Popen[bytes]] = []

    class Racing(cgroup_module.SandboxCgroup):
        def kill(self, timeout: float = 30.0) -> bool:
            ended = super().kill(timeout)
            if not started:  # the first kill is done: a process enters now
                proc = subprocess.Popen(self.wrap(["sleep", "600"]))
                started.append(proc)
                while proc.pid not in self.pids():  # (its shell moves itself in first)
                    assert proc.poll() is None, "the late process could not start"
            return ended

    racing = Racing(group.name, group.paths, group.v2)
    try:
        racing.remove()
        assert started and not [p for p in group.paths if p.exists()], "every group removed"
        assert started[0].wait(timeout=60) == -signal.SIGKILL
    finally:
        for proc in started:
            proc.kill()
            proc.wait()
        for path in group.paths:
            if path.exists():
                cgroup_module.SandboxCgroup(group.name, [path]).remove()


def _groups_of(pid: int) -> list[cgroup_module.SandboxCgroup]:
    """The live sandbox groups owned by ``pid`` (not yet leftovers)."""
    found: dict[str, cgroup_module.SandboxCgroup] = {}
    for hierarchy in cgroup_module._hierarchies():
        for entry in hierarchy.parent.glob(f"{cgroup_module.PREFIX}{pid}-*"):
            found.setdefault(entry.name, cgroup_module.SandboxCgroup(entry.name)).paths.append(
                entry
            )
    return list(found.values())


#: What the process that starts a sandbox may carry to it: a Ray worker (verl's agent-loop
#: workers) blocks SIGINT in all its threads; a script's background job ignores SIGINT and
#: SIGQUIT. A blocked or ignored signal stays so across exec.
INHERITED = {
    "blocked": "signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGQUIT})",
    "ignored": "signal.signal(signal.SIGINT, signal.SIG_IGN); "
    "signal.signal(signal.SIGQUIT, signal.SIG_IGN)",
}


@pytest.mark.parametrize("inherited", sorted(INHERITED))
@pytest.mark.parametrize("isolation", ISOLATIONS)
def test_a_timeout_interrupts_whatever_signals_the_starter_blocks_or_ignores(
    isolation: str, inherited: str
) -> None:
    """The shell gets signals as a login shell does, so a timed-out command is interrupted
    and the session goes on (before: the interrupt never arrived and the session was
    killed: every command timeout of a verl rollout lost its sandbox); so do the one-off
    processes (a reward's tests see the signals they see under ``uniagent run``)."""
    script = textwrap.dedent(
        f"""
        import asyncio, json, os, signal
        {INHERITED[inherited]}
        from uniagent import open_env
        from uniagent.env.errors import ActionTimeoutError

        async def main():
            async with open_env({config(isolation)!r}) as env:
                try:
                    await env.run_action("echo before; sleep 1000", timeout=1)
                except ActionTimeoutError:
                    timed_out = True
                else:
                    timed_out = False
                status = "grep -E '^Sig(Blk|Ign):' /proc/self/status"
                obs = await env.run_action(f"cd /tmp && {{status}}")
                # and the one-off processes (the grader's, the reward's tests)
                one_off = await env.execute(["bash", "-c", status], env=None)
                bounded = await env.run_bounded(
                    status, env=dict(os.environ), cwd=None, timeout=60, max_bytes=1024,
                    hold_grace=1,
                )
                statuses = [obs.output, one_off.stdout]
                statuses += [bounded.output.decode()] if bounded is not None else []
                print(json.dumps({{"timed_out": timed_out, "statuses": statuses}}))

        asyncio.run(main())
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.splitlines()[-1])
    assert result["timed_out"], result
    # what the session's commands and the one-off processes get: no signal blocked or ignored
    expected = ["SigBlk:", "0" * 16, "SigIgn:", "0" * 16]
    assert [s.split() for s in result["statuses"]] == [expected] * (3 - (isolation != "none"))
