"""The plugin is found once installed, and its deployment runs a real sandbox."""

from __future__ import annotations

import os

from uniagent import get_registry, open_env

DEPLOYMENT = "{{ cookiecutter.__record_name }}"


def test_plugin_is_discovered() -> None:
    """After ``pip install``, uniagent lists the deployment as this distribution's."""
    assert get_registry().deployments()[DEPLOYMENT].distribution == "{{ cookiecutter.__dist_name }}"


def test_config_with_its_type_validates_to_its_model() -> None:
    """``deployment: {type: ...}`` in an agent config now means this backend."""
    registry = get_registry()
    config = registry.validate_deployment_config({"type": DEPLOYMENT, "files": {"a.txt": "A"}})
    assert isinstance(config, registry.deployments()[DEPLOYMENT].config)


async def test_sandbox_starts_with_the_files_in_its_work_dir() -> None:
    """Commands run in the sandbox see the configured files."""
    files = {"notes/hello.txt": "hello from the config\n"}
    async with open_env({"type": DEPLOYMENT, "files": files}) as env:
        observation = await env.run_action("cat notes/hello.txt", timeout=30)
    assert observation.exit_code == 0, observation.output
    assert observation.output.strip() == "hello from the config"


async def test_stop_ends_the_sandbox_and_removes_its_directory() -> None:
    """A ``Deployment`` that is alive after ``start`` and gone after ``stop``."""
    spec = get_registry().deployments()[DEPLOYMENT]
    # Without isolation the work dir is a host path, so the test can see it go.
    deployment = spec.factory(spec.config(host={"isolation": "none"}))
    await deployment.start()
    try:
        assert deployment.runtime is not None  # the Deployment protocol, once started
        workdir = deployment.workdir
        assert workdir is not None and os.path.isdir(workdir)
        assert await deployment.is_alive()
    finally:
        await deployment.stop()
    assert not await deployment.is_alive()
    assert not os.path.exists(workdir)
