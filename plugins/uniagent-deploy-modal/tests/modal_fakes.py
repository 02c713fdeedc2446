"""A fake of Modal's cloud at its narrowest seam: ``App.lookup`` and ``Sandbox.create``.

Modal has no offline mode. The fake sandbox runs exactly the command SWE-ReX
asks Modal to run (``swerex-remote ... || pipx run swe-rex ...``) as a local
process; the only liberty it takes is the one Modal's tunnel takes, mapping the
container port 8880 to a reachable address (here a free port on 127.0.0.1).
Everything above the seam is real: SWE-ReX's ModalDeployment and RemoteRuntime,
the plugin, uniagent's registry and AgentEnv.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class Method:
    """A Modal-style callable with an ``.aio`` coroutine variant (as synchronicity provides)."""

    def __init__(self, sync: Callable[..., Any], aio: Callable[..., Awaitable[Any]] | None = None):
        self._sync = sync
        if aio is None:

            async def aio(*args: Any, **kwargs: Any) -> Any:
                return sync(*args, **kwargs)

        self.aio = aio

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._sync(*args, **kwargs)


@dataclass
class FakeTunnel:
    """What ``Sandbox.tunnels()`` maps a container port to."""

    url: str


@dataclass
class FakeApp:
    """What ``App.lookup`` returns; SWE-ReX only reads its name."""

    name: str


class _Stream:
    def __init__(self, path: Path) -> None:
        self.read = Method(lambda: path.read_text(errors="replace"))


class FakeSandbox:
    """A "container" that is a local process group running the requested command."""

    def __init__(
        self,
        args: tuple[str, ...],
        kwargs: dict[str, Any],
        workdir: Path,
        n: int,
        boot_seconds: float = 0.0,
    ):
        self.args = args
        self.kwargs = kwargs
        self.object_id = f"sb-fake{n}"
        self.terminate_calls = 0
        self.host_port = _free_port()
        ports = kwargs.get("unencrypted_ports") or []
        assert ports, "SWE-ReX must expose the server port through a tunnel"
        self.container_port = ports[0]
        # The tunnel's job: the server's container port becomes a host address.
        command = [
            re.sub(
                rf"--port {self.container_port}\b",
                f"--host 127.0.0.1 --port {self.host_port}",
                arg,
            )
            for arg in args
        ]
        if boot_seconds:
            # A container takes a while to boot before it runs the command.
            command = ["/bin/sh", "-c", 'sleep "$0"; exec "$@"', str(boot_seconds), *command]
        env = dict(os.environ)
        env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
        self._stdout_path = workdir / f"{self.object_id}.out"
        self._stderr_path = workdir / f"{self.object_id}.err"
        with open(self._stdout_path, "wb") as out, open(self._stderr_path, "wb") as err:
            self.process = subprocess.Popen(
                command, stdout=out, stderr=err, env=env, start_new_session=True
            )
        self.poll = Method(self.process.poll)
        self.terminate = Method(self._terminate)
        self.wait = Method(lambda raise_on_termination=True: self.process.wait())
        self.tunnels = Method(
            lambda timeout=50: {
                self.container_port: FakeTunnel(url=f"http://127.0.0.1:{self.host_port}")
            }
        )
        self._get_task_id = Method(lambda: f"ta-{self.object_id}")
        #: Images snapshot_filesystem() returned (Modal: an image of the sandbox's files).
        self.snapshots: list[Any] = []
        self.snapshot_filesystem = Method(self._snapshot)
        self.stdout = _Stream(self._stdout_path)
        self.stderr = _Stream(self._stderr_path)

    def _snapshot(self, timeout: int = 55) -> Any:
        import modal

        # A real, lazily built modal.Image (nothing is sent until Modal builds it).
        image = modal.Image.from_registry(f"fake-snapshot/{self.object_id}:{len(self.snapshots)}")
        self.snapshots.append(image)
        return image

    def _terminate(self, wait: bool = False) -> None:
        self.terminate_calls += 1
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()

    @property
    def running(self) -> bool:
        """Whether the sandbox's process still runs (Modal would still bill it)."""
        return self.process.poll() is None

    def _signal_server(self, sig: signal.Signals) -> None:
        children = Path(f"/proc/{self.process.pid}/task/{self.process.pid}/children").read_text()
        assert children.split(), "the sandbox's server process is not running"
        for pid in children.split():
            os.kill(int(pid), sig)

    def kill_server(self) -> None:
        """Kill the server process inside the "container" (the command's children), by pid."""
        self._signal_server(signal.SIGKILL)

    def freeze_server(self) -> None:
        """Stop the server process (SIGSTOP): requests hang, as with a wedged container."""
        self._signal_server(signal.SIGSTOP)

    def kill(self) -> None:
        """Clean up after a test, whatever the code under test did."""
        if self.running:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()


@dataclass
class FakeModal:
    """Records what SWE-ReX asked of Modal and owns the fake sandboxes."""

    workdir: Path
    lookups: list[tuple[tuple[Any, ...], dict[str, Any]]] = field(default_factory=list)
    sandboxes: list[FakeSandbox] = field(default_factory=list)
    app: FakeApp | None = None
    boot_seconds: float = 0.0

    def lookup(self, name: str, **kwargs: Any) -> FakeApp:
        self.lookups.append(((name,), kwargs))
        self.app = FakeApp(name=name)
        return self.app

    async def create(self, *args: str, **kwargs: Any) -> FakeSandbox:
        sandbox = FakeSandbox(
            tuple(args), kwargs, self.workdir, len(self.sandboxes), self.boot_seconds
        )
        self.sandboxes.append(sandbox)
        return sandbox

    @property
    def sandbox(self) -> FakeSandbox:
        """The only sandbox created so far."""
        assert len(self.sandboxes) == 1, f"expected one sandbox, got {len(self.sandboxes)}"
        return self.sandboxes[0]
