"""What a sandbox backend provides: start, stop, a runtime, a liveness check."""

from __future__ import annotations

from typing import Any, Protocol


class Deployment(Protocol):
    """A sandbox backend, built by ``DeploymentSpec.factory(config)``.

    SWE-ReX deployments satisfy it as they are. (Not ``runtime_checkable``: on
    Python 3.11 ``isinstance`` would evaluate ``runtime``, which raises before
    ``start``.) Optional attributes that
    :class:`uniagent.env.AgentEnv` reads when present (after ``start``):

    - ``workdir: str | None``: the episode's work dir (the host deployment's
      temporary directory); ``EnvConfig.workdir`` overrides it.
    - ``tools_dir: str | None``: where tool scripts go; ``EnvConfig.tools_dir``
      overrides it, and without either it is ``/usr/local/uniagent/tools``.
    """

    async def start(self) -> None:
        """Create the sandbox and make :attr:`runtime` usable."""
        ...

    async def stop(self) -> None:
        """Tear the sandbox down; safe to call twice and after a failed start."""
        ...

    @property
    def runtime(self) -> Any:
        """A :class:`uniagent.env.runtime.Runtime` (SWE-ReX's ``AbstractRuntime`` interface)."""
        ...

    async def is_alive(self) -> Any:
        """Truthy while the sandbox runs (a bool, or SWE-ReX's ``IsAliveResponse``)."""
        ...
