"""A uniagent deployment that runs an episode's sandbox on Modal via SWE-ReX.

SWE-ReX 1.4.0's ``ModalDeployment`` does the work (image building, sandbox
creation, the ``swerex-remote`` server behind a Modal tunnel, the
``RemoteRuntime`` client). Four of its defects are worked around here:

- ``stop()`` only terminates sandboxes that have *already exited* (inverted
  condition), so every running sandbox leaked until ``deployment_timeout``;
  :class:`PatchedModalDeployment` terminates the sandbox unconditionally.
- its constructor does network I/O (``modal.App.lookup``), so it is built in
  :meth:`ModalDeployment.start` on a worker thread, never in the factory and
  never on the event loop;
- its wait-until-alive loop sleeps with ``time.sleep``, which blocks the event
  loop (and every other episode on it) for the whole start-up; the override
  sleeps with ``asyncio.sleep``;
- its ``RemoteRuntime`` leaves every request to aiohttp's 300 s total timeout,
  which kills any longer command (a SWE-bench test run), and never retries; once
  the server answers, the runtime is replaced by the core's
  (:func:`uniagent.env.remote.make_runtime`, also used by the ``remote``
  deployment): a command's HTTP timeout is its own timeout plus a margin, and a
  failed connection is retried.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, cast

from swerex.deployment.modal import ModalDeployment as SwerexModalDeployment
from swerex.runtime.abstract import IsAliveResponse

from uniagent import UniAgentError
from uniagent.sandbox import Runtime, kill_all_but_ancestors, make_runtime
from uniagent_deploy_modal.config import ModalDeploymentConfig

log = logging.getLogger(__name__)

#: Seconds between liveness probes while the sandbox's server starts.
POLL_INTERVAL = 0.25
#: At most this long for the courtesy close request before the sandbox is terminated.
CLOSE_TIMEOUT = 10.0


class ModalDeploymentError(UniAgentError, RuntimeError):
    """The Modal deployment could not be created (credentials, image, Modal API)."""


class PatchedModalDeployment(SwerexModalDeployment):
    """SWE-ReX 1.4.0's ModalDeployment with a stop() that really terminates the sandbox."""

    def __init__(
        self,
        *,
        retries: int = 3,
        request_margin: float = 60.0,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self._retries = retries
        self._request_margin = request_margin

    async def start(self) -> None:
        """Start as upstream does, then talk to the server through the core's runtime."""
        await super().start()
        upstream = self._runtime
        assert upstream is not None
        # Upstream's runtime holds no connection (one per request): nothing to close.
        self._runtime = make_runtime(
            host=upstream._config.host,
            port=upstream._config.port,
            auth_token=upstream._config.auth_token,
            retries=self._retries,
            request_timeout=self._runtime_timeout,
            request_margin=self._request_margin,
        )

    async def _wait_until_alive(self, timeout: float = 10.0) -> None:
        """Poll the server until it answers, without blocking the event loop."""
        assert self._runtime is not None
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        attempts = 0
        while True:
            # At least one probe even when sandbox creation used up the start-up budget.
            remaining = max(1.0, deadline - loop.time())
            probe_timeout = min(self._runtime._config.timeout, remaining)
            response: IsAliveResponse = await self.is_alive(timeout=probe_timeout)
            attempts += 1
            if response:
                return
            if loop.time() >= deadline:
                raise TimeoutError(
                    f"the swerex-remote server in Modal sandbox {self._sandbox_id()} did not "
                    f"answer within {timeout:.1f}s ({attempts} probes); last answer: "
                    f"{response.message}. "
                    "Raise sandbox_start_timeout (image builds count against it), or check "
                    "that the image can run swerex-remote (or has apt for install_pipx)."
                )
            await asyncio.sleep(POLL_INTERVAL)

    def _sandbox_id(self) -> str:
        return getattr(self._sandbox, "object_id", None) or "<not created>"

    async def stop(self, *, close_timeout: float | None = None) -> None:
        """Close the runtime, then terminate the sandbox whether or not it is still running."""
        runtime, sandbox = self._runtime, self._sandbox
        self._runtime = None
        self._sandbox = None
        self._app = None  # type: ignore[assignment]  # as upstream stop() does
        try:
            if runtime is not None:
                try:
                    await asyncio.wait_for(runtime.close(), timeout=close_timeout)
                except Exception as exc:
                    log.warning("closing the Modal sandbox's runtime failed (%s); terminating", exc)
        finally:
            # Even when cancelled (e.g. by AgentEnv's close_timeout): a live sandbox bills.
            if sandbox is not None:
                await sandbox.terminate.aio()
                log.info("terminated Modal sandbox %s", getattr(sandbox, "object_id", "?"))

    def __del__(self) -> None:
        # Upstream schedules stop() from the finalizer even for objects whose
        # constructor failed (printing noise); only a started sandbox needs it.
        if getattr(self, "_sandbox", None) is not None:
            log.warning("Modal sandbox %s was never stopped; terminating it", self._sandbox_id())
            super().__del__()


class ModalDeployment:
    """A Modal sandbox per episode; satisfies ``uniagent.Deployment``."""

    def __init__(self, config: ModalDeploymentConfig) -> None:
        self.config = config
        self._deployment: PatchedModalDeployment | None = None
        #: A fork's image: its parent's file-system snapshot (a ``modal.Image``).
        self._snapshot: Any = None

    def _build(self) -> PatchedModalDeployment:
        # Runs on a worker thread: the constructor calls modal.App.lookup (network I/O).
        snapshot = self._snapshot
        return PatchedModalDeployment(
            logger=log,
            image=snapshot if snapshot is not None else self.config.image,
            startup_timeout=self.config.sandbox_start_timeout,
            runtime_timeout=self.config.runtime_timeout,
            deployment_timeout=self.config.deployment_timeout,
            modal_sandbox_kwargs=dict(self.config.modal_sandbox_kwargs),
            install_pipx=self.config.install_pipx and snapshot is None,  # a snapshot has it
            retries=self.config.retries,
            request_margin=self.config.request_margin,
        )

    async def start(self) -> None:
        """Create the sandbox and wait until its swerex-remote server answers."""
        if self._deployment is not None:
            raise RuntimeError("this Modal deployment is already started; call stop() first")
        try:
            self._deployment = await asyncio.to_thread(self._build)
        except Exception as exc:
            raise ModalDeploymentError(
                f"could not set up the Modal deployment for image {self.config.image!r}: "
                f"{type(exc).__name__}: {exc}. Check the Modal credentials (`modal token new`, "
                "or MODAL_TOKEN_ID and MODAL_TOKEN_SECRET) and that the image is a registry "
                "image or an existing Dockerfile."
            ) from exc
        try:
            await self._deployment.start()
        except BaseException:
            # A half-started sandbox would otherwise run (and bill) until deployment_timeout.
            await asyncio.shield(self.stop())
            raise

    async def fork(self) -> ModalDeployment:
        """A new sandbox from this one's file system: Modal's ``snapshot_filesystem()``
        (an image of the sandbox's files; no process is carried), and a sandbox of the same
        config started from it."""
        if self._deployment is None:
            raise RuntimeError("the Modal deployment is not started; nothing to fork")
        try:
            snapshot = await self._deployment.sandbox.snapshot_filesystem.aio()
        except Exception as exc:
            raise ModalDeploymentError(
                f"could not snapshot Modal sandbox {self._deployment._sandbox_id()}: "
                f"{type(exc).__name__}: {exc}"
            ) from exc
        child = ModalDeployment(self.config)
        child._snapshot = snapshot
        await child.start()
        return child

    async def stop(self) -> None:
        """Close the runtime and terminate the sandbox; safe to call twice."""
        deployment, self._deployment = self._deployment, None
        if deployment is not None:
            await deployment.stop(close_timeout=min(self.config.runtime_timeout, CLOSE_TIMEOUT))

    @property
    def runtime(self) -> Runtime:
        """The SWE-ReX-compatible runtime talking to the sandbox's server."""
        if self._deployment is None:
            raise RuntimeError("the Modal deployment is not started; await start() first")
        # SWE-ReX's runtime takes SWE-ReX's models, which mirror ours field for field.
        return cast(Runtime, self._deployment.runtime)

    @property
    def sandbox(self) -> Any:
        """The ``modal.Sandbox`` of the running episode (for logs and debugging)."""
        if self._deployment is None:
            raise RuntimeError("the Modal deployment is not started; await start() first")
        return self._deployment.sandbox

    async def is_alive(self) -> bool:
        """Whether the sandbox still runs and its server answers."""
        if self._deployment is None:
            return False
        try:
            response = await self._deployment.is_alive(timeout=self.config.runtime_timeout)
        except Exception as exc:
            log.debug("Modal sandbox is not alive: %s", exc)
            return False
        return bool(response)

    async def sandbox_alive(self) -> bool:
        """Whether the sandbox and its server run (the agent's shell may be gone)."""
        return await self.is_alive()

    async def kill_processes(self) -> None:
        """End every process in the sandbox except its server (before grading)."""
        if self._deployment is not None:
            await kill_all_but_ancestors(self.runtime)

    @property
    def workdir(self) -> str | None:
        """None: the image's working directory (set ``workdir`` in the env settings)."""
        return None

    @property
    def tools_dir(self) -> str | None:
        """None: ``/usr/local/uniagent/tools`` unless the env settings say otherwise."""
        return None
