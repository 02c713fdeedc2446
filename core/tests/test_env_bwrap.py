"""The host deployment with ``isolation: bwrap``, against real bubblewrap.

Needs ``bwrap`` (Debian: ``apt-get install bubblewrap``). The in-sandbox network
probe uses ``/usr/bin/python3`` when there is one, else bash's ``/dev/tcp``.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import shlex
import shutil
import socket
import subprocess
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio
from pydantic import BaseModel

from uniagent import ToolSpec, open_env
from uniagent.env import (
    ActionTimeoutError,
    AgentEnv,
    EnvError,
    EnvStartError,
    HostDeployment,
    HostDeploymentConfig,
)
from uniagent.env.host import BWRAP_WORKDIR
from uniagent.env.mountns import episode_mounts
from uniagent.env.procfs import group_members

PYTHON = "/usr/bin/python3"


@pytest_asyncio.fixture
async def sandbox() -> AsyncIterator[AgentEnv]:
    async with open_env({"type": "host", "isolation": "bwrap"}) as env:
        yield env


def connect_probe(port: int) -> str:
    """A command that connects to 127.0.0.1:port: exit 0 and "connected", else 3 and "refused"."""
    if not Path(PYTHON).exists():  # bash's /dev/tcp does the same without Python
        return (
            f"(if timeout 3 bash -c 'exec 3<>/dev/tcp/127.0.0.1/{port}' 2>/dev/null; "
            "then echo connected; else echo refused; exit 3; fi)"
        )
    code = (
        "import socket,sys\n"
        "try:\n"
        f"    socket.create_connection(('127.0.0.1', {port}), timeout=3).close()\n"
        "except OSError as e:\n"
        "    print('refused', type(e).__name__); sys.exit(3)\n"
        "print('connected')\n"
    )
    return f"{PYTHON} -c {shlex.quote(code)}"


async def test_the_sandbox_sees_its_own_dirs(sandbox: AgentEnv) -> None:
    assert sandbox.workdir == "/uniagent/work"
    assert (await sandbox.run_action("pwd")).output == "/uniagent/work\n"
    obs = await sandbox.run_action("echo $HOME; ls /; ls /uniagent")
    assert obs.output.split("\n")[0] == "/root"
    assert {"uniagent", "usr", "work", "tools"} <= set(obs.output.split())


async def test_writes_outside_its_dirs_fail_or_stay_inside(sandbox: AgentEnv) -> None:
    for path in ("/usr/uniagent-probe", "/etc/uniagent-probe", "/usr/bin/uniagent-probe"):
        obs = await sandbox.run_action(f"touch {path}")
        assert obs.exit_code != 0 and "Read-only file system" in obs.output
        assert not Path(path).exists()
    marker = f"/var/tmp/uniagent-bwrap-{uuid.uuid4().hex}"
    obs = await sandbox.run_action(f"mkdir -p /var/tmp && touch {marker} && ls {marker}")
    # The sandbox's own root is read-only too (it would live in the host's memory).
    assert obs.exit_code != 0 and "Read-only file system" in obs.output
    assert not Path(marker).exists()
    await sandbox.run_action("echo private > /tmp/scratch.txt")
    assert await sandbox.read_file("/tmp/scratch.txt") == "private\n"
    assert not Path("/tmp/scratch.txt").exists() or Path("/tmp/scratch.txt").read_text() != (
        "private\n"
    )


async def test_the_hosts_home_is_not_visible(sandbox: AgentEnv) -> None:
    secret = Path.home() / f".uniagent-secret-{uuid.uuid4().hex}"
    secret.write_text("do not leak\n")
    try:
        assert secret.name not in (await sandbox.run_action("ls -A /root")).output
        obs = await sandbox.run_action(f"cat {secret}")
        assert obs.exit_code != 0 and "do not leak" not in obs.output
    finally:
        secret.unlink()


async def test_no_network_by_default() -> None:
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        socket.create_connection(("127.0.0.1", port), timeout=3).close()  # it is served
        async with open_env({"type": "host", "isolation": "bwrap"}) as env:
            obs = await env.run_action(connect_probe(port), timeout=30)
            assert obs.exit_code == 3 and "refused" in obs.output, obs.output
        shared = {"type": "host", "isolation": "bwrap", "network": True}
        async with open_env(shared) as env:
            obs = await env.run_action(connect_probe(port), timeout=30)
            assert obs.exit_code == 0 and "connected" in obs.output, obs.output
    finally:
        server.close()
        await server.wait_closed()


class _NoArgs(BaseModel):
    pass


async def test_tools_work_inside(sandbox: AgentEnv, tmp_path: Path) -> None:
    script = tmp_path / "whereami"
    script.write_text('#!/bin/sh\necho "tool in $(pwd) as $(id -u)"\n')
    tool = ToolSpec(name="whereami", description="d", arguments=_NoArgs, scripts=(script,))
    await sandbox.install_tools([tool])
    assert sandbox.tools_dir == "/uniagent/tools"
    assert (await sandbox.run_action("whereami")).output.startswith("tool in /uniagent/work as ")


async def test_file_operations_go_through_the_mounts(sandbox: AgentEnv, tmp_path: Path) -> None:
    await sandbox.write_file("src/main.py", "print('hi')\n")
    main = f"{BWRAP_WORKDIR}/src/main.py"
    assert (await sandbox.run_action(f"cat {main}")).output == "print('hi')\n"
    tree = tmp_path / "tree"
    (tree / "a").mkdir(parents=True)
    (tree / "a" / "b.txt").write_text("b\n")
    await sandbox.upload(tree, f"{BWRAP_WORKDIR}/repo")
    assert (await sandbox.run_action("cat repo/a/b.txt")).output == "b\n"
    assert "root:" in await sandbox.read_file("/etc/passwd")
    with pytest.raises(EnvError, match="read-only"):
        await sandbox.write_file("/etc/uniagent-probe", "x")
    with pytest.raises(EnvError, match="outside"):
        await sandbox.read_file("/proc/self/status")
    # A link made inside the sandbox must not make host-side reads escape it.
    await sandbox.run_action(f"ln -s /root/.bashrc {BWRAP_WORKDIR}/escape")
    with pytest.raises(EnvError, match="symlink"):
        await sandbox.read_file(f"{BWRAP_WORKDIR}/escape")


async def test_timeouts_recover_inside(sandbox: AgentEnv) -> None:
    await sandbox.run_action("cd /tmp && V=1")
    with pytest.raises(ActionTimeoutError):
        await sandbox.run_action("trap '' INT; sleep 100", timeout=1)
    assert (await sandbox.run_action("echo $PWD $V")).output == "/tmp 1\n"


async def test_close_kills_the_whole_sandbox() -> None:
    deployment = HostDeployment(HostDeploymentConfig(isolation="bwrap"))
    env = AgentEnv(deployment)
    await env.start()
    tag = random.randint(100_000, 999_999)  # sleeps nobody else runs
    await env.run_action(f"sleep {tag} & setsid sleep {tag + 1} & true")
    session = deployment.runtime.sessions["default"]
    assert session.pgid is not None
    members = group_members(session.pgid)
    assert len(members) >= 3  # bwrap's init, bash, sleep (setsid's sleep left the group)
    root = deployment.root
    await env.close()
    deadline = time.monotonic() + 10

    def left() -> list[int]:
        return _sleeps(tag) + [p for p in members if _state(p) not in "ZX"]

    while time.monotonic() < deadline and left():
        await asyncio.sleep(0.05)
    assert not left(), [Path(f"/proc/{p}/cmdline").read_bytes() for p in left()]
    assert root is not None and not root.exists()


def _state(pid: int) -> str:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return "X"
    return stat[stat.rfind(")") + 2]


def _sleeps(tag: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                cmdline = (entry / "cmdline").read_bytes()
            except OSError:
                continue
            wanted = (f"sleep\0{tag}\0".encode(), f"sleep\0{tag + 1}\0".encode())
            if cmdline in wanted and _state(int(entry.name)) not in "ZX":
                found.append(int(entry.name))
    return found


async def test_a_missing_bwrap_says_how_to_install_it() -> None:
    env = open_env({"type": "host", "isolation": "bwrap", "bwrap": "no-bwrap-here"})
    with pytest.raises(EnvStartError, match="apt-get install bubblewrap"):
        await env.start()


def test_bwrap_is_installed() -> None:
    assert shutil.which("bwrap"), "install bubblewrap: apt-get install bubblewrap"


@pytest.mark.skipif(os.geteuid() != 0, reason="staging applies when bwrap runs as another uid")
async def test_only_what_the_sandbox_user_cannot_reach_is_staged(tmp_path: Path) -> None:
    """The episode's own dirs (on their 0755 tmpfs) are bound directly: no staging shell,
    `unshare` or `mount` per sandbox; a bind under a 0700 directory is still staged."""
    from uniagent.env.bwrap import reachable

    hidden = tmp_path / "private"  # pytest's tmp_path is below a 0700 directory
    hidden.mkdir()
    (hidden / "data.txt").write_text("staged\n")
    assert not reachable(str(hidden), 65534)
    assert reachable("/usr/bin", 65534)
    async with open_env({"type": "host", "isolation": "bwrap"}) as env:
        layout = env.deployment._layout  # type: ignore[attr-defined]
        assert "unshare" not in layout.prefix, layout.prefix
        assert (await env.run_action("echo hi > f && cat f")).output == "hi\n"
    config = {"type": "host", "isolation": "bwrap", "ro_binds": [f"{hidden}:/data"]}
    async with open_env(config) as env:
        assert "unshare" in env.deployment._layout.prefix  # type: ignore[attr-defined]
        assert (await env.run_action("cat /data/data.txt")).output == "staged\n"


@pytest.mark.skipif(os.geteuid() != 0, reason="staging applies when bwrap runs as another uid")
async def test_staged_mounts_are_made_once_per_sandbox_and_held(tmp_path: Path) -> None:
    """Sources the sandbox's user cannot reach are staged once, by a holder process whose
    mount namespace every command enters (`nsenter`), not per command; a holder that ended
    is never named again (each command stages as before), and stopping ends it."""
    hidden = tmp_path / "private"
    hidden.mkdir()
    (hidden / "data.txt").write_text("staged\n")
    config = {"type": "host", "isolation": "bwrap", "ro_binds": [f"{hidden}:/data"]}
    env = open_env(config)
    await env.start()
    try:
        layout = env.deployment._layout  # type: ignore[attr-defined]
        holder = layout.holder
        assert holder is not None and holder.poll() is None
        argv = layout.wrap(["true"])
        assert "unshare" not in argv and f"--mount=/proc/{holder.pid}/ns/mnt" in argv, argv
        assert (await env.run_action("cat /data/data.txt")).output == "staged\n"
        done = await env.execute(["cat", "/data/data.txt"], env=None)
        assert done.exit_code == 0 and done.stdout == "staged\n"
        # The sandbox cannot see it (the holder waits in `cat`): a PID namespace of its own.
        count = "grep -lx {} /proc/[0-9]*/comm 2>/dev/null | wc -l"
        seen = await env.run_action(count.format("bash"))  # the session's own shell is seen
        assert int(seen.output.strip()) >= 1, seen.output
        seen = await env.run_action(count.format("cat"))
        assert seen.output.strip() == "0", seen.output
        holder.kill()
        await asyncio.to_thread(holder.wait)
        argv = layout.wrap(["true"])
        assert "unshare" in argv and f"--mount=/proc/{holder.pid}/ns/mnt" not in argv, argv
        done = await env.execute(["cat", "/data/data.txt"], env=None)
        assert done.exit_code == 0 and done.stdout == "staged\n"
        layout.holder = holder  # (ended: released below without error)
    finally:
        await env.close()
    assert layout.holder is None


@pytest.mark.skipif(os.geteuid() != 0, reason="staging applies when bwrap runs as another uid")
async def test_a_stopped_sandbox_leaves_no_holder(tmp_path: Path) -> None:
    hidden = tmp_path / "private"
    hidden.mkdir()
    config = {"type": "host", "isolation": "bwrap", "ro_binds": [f"{hidden}:/data"]}
    async with open_env(config) as env:
        holder = env.deployment._layout.holder  # type: ignore[attr-defined]
        assert holder is not None
        assert holder.poll() is None
    assert holder.returncode is not None  # ended and reaped


@pytest.mark.skipif(os.geteuid() != 0, reason="the disk limit's tmpfs needs root")
async def test_a_sandbox_starts_in_a_namespace_without_the_other_sandboxes_mounts() -> None:
    """bwrap copies the mount namespace it starts in and reads its whole table once per bind,
    so every sandbox's tmpfs in this process's namespace made each start cost more. Each
    sandbox's commands start in a namespace of its own (mountns.py), entered by the same
    `nsenter` that makes them the sandbox's user, where its own episode directory is the
    only episode mount; this process's namespace keeps them all, files written on either
    side are seen on the other, and a stopped sandbox's namespace goes."""
    config = {"type": "host", "isolation": "bwrap"}
    async with open_env(config) as one, open_env(config) as two:
        first = one.deployment._layout  # type: ignore[attr-defined]
        second = two.deployment._layout  # type: ignore[attr-defined]
        here = episode_mounts(Path("/proc/self/mountinfo").read_text())
        assert str(first.root) in here and str(second.root) in here
        for layout in (first, second):
            assert layout.namespace is not None
            enter = layout.prefix[: layout.prefix.index("--") + 1]
            assert enter[1] == f"--mount=/proc/{os.getpid()}/fd/{layout.namespace}", enter
            assert "--setuid=65534" in enter and "setpriv" not in layout.prefix, enter
            done = await asyncio.to_thread(
                subprocess.run, [*enter, "cat", "/proc/self/mountinfo"],
                capture_output=True, text=True, check=True,
            )  # fmt: skip
            assert episode_mounts(done.stdout) == [str(layout.root)], done.stdout
        (second.root / "work" / "g").write_text("outside\n")
        seen = await two.run_action("echo inside > f && cat g")
        assert seen.output == "outside\n", seen.output
        assert (second.root / "work" / "f").read_text() == "inside\n"
        fd = second.namespace
        inode = os.readlink(f"/proc/self/fd/{fd}")
        assert inode.startswith("mnt:["), inode
    assert first.namespace is None and second.namespace is None
    with contextlib.suppress(OSError):
        assert os.readlink(f"/proc/self/fd/{fd}") != inode  # closed (or another file now)


@pytest.mark.skipif(os.geteuid() != 0, reason="the disk limit's tmpfs needs root")
async def test_where_no_namespace_can_be_made_the_sandbox_starts_as_before(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A kernel or a security module that refuses `open_tree`, `unshare` or `setns`: the
    sandbox starts from this process's namespace (said in the log), and works."""
    from uniagent.env import mountns

    monkeypatch.setattr(mountns, "_namespaces", None)
    monkeypatch.setattr(mountns, "_SYS_OPEN_TREE", 1 << 20)  # no such call: a kernel before 5.2
    with caplog.at_level("INFO", logger="uniagent.env.mountns"):
        async with open_env({"type": "host", "isolation": "bwrap"}) as env:
            layout = env.deployment._layout  # type: ignore[attr-defined]
            assert layout.namespace is None
            assert not any(a.startswith("--mount=") for a in layout.prefix), layout.prefix
            assert (await env.run_action("echo hi > f && cat f")).output == "hi\n"
    assert "Function not implemented" in caplog.text, caplog.text


@pytest.mark.skipif(os.geteuid() != 0, reason="the disk limit's tmpfs needs root")
@pytest.mark.skipif(shutil.which("setpriv") is None, reason="needs setpriv (util-linux)")
async def test_without_nsenter_no_namespace_is_made_and_setpriv_drops_privileges(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A sandbox's namespace is entered with nsenter: where it is missing none is made (the
    sandbox starts from this process's namespace) and setpriv makes the commands the
    sandbox's user."""
    from uniagent.env import bwrap, host

    def which(name: str) -> str | None:
        return None if name == "nsenter" else shutil.which(name)

    monkeypatch.setattr(bwrap, "which", which)
    monkeypatch.setattr(host, "which", which)
    made: list[int | None] = []
    monkeypatch.setattr(host, "sandbox_namespace", lambda root: made.append(None))
    async with open_env({"type": "host", "isolation": "bwrap"}) as env:
        layout = env.deployment._layout  # type: ignore[attr-defined]
        assert layout.namespace is None and made == []
        assert layout.prefix[0] == "setpriv" and "--reuid=65534" in layout.prefix, layout.prefix
        assert (await env.run_action("echo hi > f && cat f && id -u")).output == "hi\n0\n"


def test_episode_mounts_are_read_from_a_mount_table_deepest_first() -> None:
    table = (
        "27 1 254:0 / / rw,relatime - ext4 /dev/vda rw\n"
        "71 27 0:44 / /tmp/uniagent-7-a rw,relatime - tmpfs uniagent-episode rw,size=1024k\n"
        "72 71 0:45 / /tmp/uniagent-7-a/work rw - overlay uniagent-layers rw,lowerdir=/x\n"
        "73 27 0:46 / /tmp/my\\040dir/uniagent-7-b rw - tmpfs uniagent-episode rw\n"
        "74 27 0:47 / /tmp/other rw - tmpfs tmpfs rw\n"
    )
    points = episode_mounts(table)
    assert sorted(points) == [
        "/tmp/my dir/uniagent-7-b",
        "/tmp/uniagent-7-a",
        "/tmp/uniagent-7-a/work",
    ]
    assert points.index("/tmp/uniagent-7-a/work") < points.index("/tmp/uniagent-7-a")


def test_the_bwrap_probe_binds_only_the_system_directories(monkeypatch: pytest.MonkeyPatch) -> None:
    """bwrap remounts a bind's submounts read-only one by one: a probe that bound `/` failed
    whenever a mount of another process (another run's episode tmpfs) went away meanwhile,
    and then every bwrap sandbox of the process was refused. The probe is a sandbox as
    sessions get it: the system directories only."""
    from uniagent.env import bwrap as module

    seen: list[list[str]] = []
    real = subprocess.run

    def run(argv: list[str], **kwargs: object) -> subprocess.CompletedProcess[str]:
        seen.append(list(argv))
        return real(argv, **kwargs)  # type: ignore[call-overload]

    monkeypatch.setattr(module, "_probes", {})
    monkeypatch.setattr(module.subprocess, "run", run)
    assert module.bwrap_problem("bwrap", 65534 if os.geteuid() == 0 else None) is None
    (argv,) = seen
    binds = [argv[i + 1] for i, arg in enumerate(argv) if arg in ("--bind", "--ro-bind")]
    assert binds and set(binds) <= set(module.SYSTEM_DIRS), argv


@pytest.mark.skipif(os.geteuid() != 0, reason="a mount namespace of one's own needs root")
def test_the_base_namespace_is_made_while_other_sandboxes_come_and_go(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The base namespace detaches every episode mount it finds in the mount table; one that
    another process removed meanwhile (its directory gone, or no longer a mount point) is
    not an error that would turn the namespaces off for the whole process."""
    from uniagent.env import mountns

    listed = mountns.episode_mounts
    gone, unmounted = tmp_path / "uniagent-1-gone", tmp_path / "uniagent-1-unmounted"
    unmounted.mkdir()
    monkeypatch.setattr(
        mountns, "episode_mounts", lambda table: [str(gone), str(unmounted), *listed(table)]
    )
    helper = mountns._Namespaces()
    try:
        fd = helper._pool.submit(helper._make_base).result()
        assert os.readlink(f"/proc/self/fd/{fd}").startswith("mnt:[")
        os.close(fd)
    finally:
        helper._pool.shutdown()


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        ("/opt/data", None),  # a read-only bind with a writable one below it
        ("/opt/data/sub/x", "/srv/data/sub/x"),
        ("/opt/database", None),  # a sibling whose name starts alike: no bind of its own
        ("/opt/data/out", None),  # a writable bind (given with a trailing slash)
        ("/opt/data/out/x", None),
        ("/opt/data/outside", "/srv/data/outside"),
        ("/opt//data/./sub/", "/srv/data/sub"),  # not normalised
        ("/opt", None),  # a writable bind below it
        ("/elsewhere", None),  # outside every mount
    ],
)
def test_a_read_only_source_is_found_by_whole_path_components(path, expected):
    from uniagent.env.bwrap import Mount, read_only_source

    mounts = [
        Mount("/opt/data", "/srv/data", False),
        Mount("/opt/data/out/", "/srv/out", True),
        Mount("/opt/databaseless", "/srv/x", False),
    ]
    assert mounts[1].inside == "/opt/data/out"
    assert read_only_source(mounts, path) == expected
