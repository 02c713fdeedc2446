"""The plugin's ``uniagent`` entry point: it contributes the ``{{ cookiecutter.__record_name }}`` deployment.

A deployment is a sandbox backend, chosen in the agent config by ``type``::

    env:
      deployment: {type: {{ cookiecutter.__record_name }}, files: {README.md: "Fix the bug."}}

It is a :class:`uniagent.DeploymentSpec`: a pydantic config model whose
``type`` is ``Literal["{{ cookiecutter.__record_name }}"]`` and a factory that turns a
validated config into a :class:`uniagent.sandbox.Deployment` (``start``, ``stop``, ``runtime``,
``is_alive``, ``sandbox_alive``, ``kill_processes``, ``workdir``, ``tools_dir``). The
example wraps the built-in host deployment and writes the configured files into the
sandbox's work dir when it starts; a real backend would create a container or cloud
sandbox in ``start`` instead.
"""

from __future__ import annotations

import posixpath
from collections.abc import Iterator
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field
from uniagent import DeploymentSpec, hookimpl
from uniagent.sandbox import HostDeployment, HostDeploymentConfig, Runtime, WriteFileRequest


class {{ cookiecutter.__class_name }}Config(BaseModel):
    """``deployment: {type: {{ cookiecutter.__record_name }}, ...}``; unknown keys are errors."""

    model_config = ConfigDict(extra="forbid")

    type: Literal["{{ cookiecutter.__record_name }}"] = "{{ cookiecutter.__record_name }}"
    files: dict[str, str] = Field(
        default_factory=dict,
        description="files written at start: path (relative to the work dir) -> text",
    )
    host: HostDeploymentConfig = Field(
        default_factory=HostDeploymentConfig,
        description="settings of the wrapped host sandbox (e.g. isolation: bwrap)",
    )


class {{ cookiecutter.__class_name }}Deployment:
    """The built-in host deployment, with the configured files in its work dir."""

    def __init__(self, config: {{ cookiecutter.__class_name }}Config) -> None:
        self.config = config
        self._host = HostDeployment(config.host)

    async def start(self) -> None:
        """Start the host sandbox, then write the files; a failed start leaves nothing."""
        await self._host.start()
        try:
            workdir = self._host.workdir or "."
            for path, text in self.config.files.items():
                request = WriteFileRequest(path=posixpath.join(workdir, path), content=text)
                await self._host.runtime.write_file(request)
        except BaseException:
            await self._host.stop()
            raise

    async def stop(self) -> None:
        """Stop the host sandbox and remove its directory; safe to call twice."""
        await self._host.stop()

    @property
    def runtime(self) -> Runtime:
        """The runtime uniagent runs commands through (after :meth:`start`)."""
        return self._host.runtime

    async def is_alive(self) -> bool:
        """Whether the sandbox is started and its shell answers."""
        return await self._host.is_alive()

    async def sandbox_alive(self) -> bool:
        """Whether the sandbox itself runs, even if the agent's shell ended (not infra)."""
        return await self._host.sandbox_alive()

    async def kill_processes(self) -> None:
        """End every process in the sandbox, files kept: the grader calls it after the agent."""
        await self._host.kill_processes()

    @property
    def workdir(self) -> str | None:
        """The session's starting directory (read by ``AgentEnv`` after start)."""
        return self._host.workdir

    @property
    def tools_dir(self) -> str | None:
        """Where tool scripts are uploaded (read by ``AgentEnv`` after start)."""
        return self._host.tools_dir


@hookimpl
def uniagent_deployments() -> Iterator[DeploymentSpec[{{ cookiecutter.__class_name }}Config]]:
    """The ``{{ cookiecutter.__record_name }}`` deployment."""
    yield DeploymentSpec(
        name="{{ cookiecutter.__record_name }}",
        config={{ cookiecutter.__class_name }}Config,
        factory={{ cookiecutter.__class_name }}Deployment,
    )
