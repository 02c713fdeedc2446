"""The `agents` plugin kind: agent configs resolve (or fail, naming the key) before any
sandbox starts, and `uniagent plugins --json` describes harnesses. (Harness episodes:
core/tests/gateway/test_harness_episodes.py.)"""

from __future__ import annotations

import logging
import os
import re
import subprocess
from pathlib import Path

import pytest

from uniagent import AgentInstall
from uniagent.agents.install import AgentInstallError, ensure_installed
from uniagent.config import AgentConfig
from uniagent.errors import ConfigError
from uniagent.resolver import resolve
from uniagent.testing.harness import tiny_config


def test_the_default_agent_is_the_built_in_loop() -> None:
    agent = resolve(AgentConfig.from_dict({}))
    assert agent.agent.name == "react" and not agent.agent.is_harness


def test_an_unknown_agent_is_named_with_its_key_path() -> None:
    with pytest.raises(ConfigError, match=r"agent\.name: unknown agent 'nope'.*installed agents"):
        resolve(AgentConfig.from_dict({"agent": {"name": "nope"}}))


def test_an_unknown_agent_setting_is_named_with_its_key_path(tiny) -> None:
    with pytest.raises(ConfigError, match=r"agent\.settings\.stepz: unknown key"):
        resolve(tiny_config({"stepz": 3}))
    with pytest.raises(ConfigError, match=r"agent\.settings: agent 'react' takes no settings"):
        resolve(AgentConfig.from_dict({"agent": {"name": "react", "settings": {"x": 1}}}))


def test_a_harness_needs_a_sandbox_that_reaches_the_gateway(tiny) -> None:
    with pytest.raises(ConfigError, match=r"env\.deployment\.network: agent 'tiny'"):
        resolve(tiny_config(network=None))
    assert resolve(tiny_config(isolation="none", network=None)).agent.name == "tiny"


def test_an_unpinned_install_is_refused() -> None:
    with pytest.raises(ValueError, match="pin one exact version"):
        AgentInstall("pip", "mini-swe-agent", ">=2", "mini")


def test_plugins_json_lists_agents_with_install_and_wire(tiny) -> None:
    from uniagent.cli import plugins_report

    entry = next(p for p in plugins_report()["plugins"] if p["name"] == "test-agents")
    (agent,) = entry["agents"]
    assert agent["name"] == "tiny" and agent["wire"] == "chat"
    assert agent["install"]["kind"] == "binary" and agent["install"]["version"] == "1"
    assert agent["settings"]["properties"]["steps"]["default"] == 5


def test_extras_and_python_are_pinned_and_for_pip_only() -> None:
    with pytest.raises(ValueError, match="pin each extra as name==version"):
        AgentInstall("pip", "a", "1", "a", extras=("b>=2",))
    with pytest.raises(ValueError, match="extras and python are for pip"):
        AgentInstall("npm", "a", "1", "a", python="3.12")
    with pytest.raises(ValueError, match="python is a version like '3.12'"):
        AgentInstall("pip", "a", "1", "a", python=">=3.12")
    install = AgentInstall("pip", "a", "1", "a", extras=("b==2",), python="3.12")
    assert install.describe()["extras"] == ["b==2"] and install.describe()["python"] == "3.12"


def test_a_harness_on_another_python_gets_its_own_folder_and_the_sandbox_sees_it(
    tmp_path, monkeypatch
) -> None:
    import sys

    from uniagent.agents.install import find_python, install_folder, python_home

    monkeypatch.setenv("UNIAGENT_CACHE_DIR", str(tmp_path))
    plain = install_folder(AgentInstall("pip", "a", "1", "a"))
    other = install_folder(AgentInstall("pip", "a", "1", "a", python="3.11"))
    extra = install_folder(AgentInstall("pip", "a", "1", "a", extras=("b==2",)))
    assert len({plain, other, extra}) == 3 and other.name.endswith("-py3.11")
    mine = f"{sys.version_info.major}.{sys.version_info.minor}"
    found = find_python(mine)  # this machine has at least the Python running the tests
    assert Path(found).is_file()
    with pytest.raises(AgentInstallError, match=r"no Python 3\.99 or newer here.*python3\.99"):
        find_python("3.99")
    venv = tmp_path / "venv"
    venv.mkdir()
    (venv / "pyvenv.cfg").write_text("home = /usr/bin\nversion = 3.11.2\n")
    assert python_home(venv) is None  # the system's: every sandbox sees it
    (venv / "pyvenv.cfg").write_text("home = /opt/py312/bin\n")
    assert python_home(venv) == Path("/opt/py312")


def test_what_a_harness_needs_in_the_image_is_named(tmp_path) -> None:
    """The set-up's probe output read: a pip venv's Python (its version), a node script's
    node (its package.json engines), a native executable's loader."""
    import sys

    from uniagent.agents.install import runs_with, sandbox_probe, sandbox_problems

    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python3").symlink_to("/usr/bin/python3")
    (venv / "bin" / "python").symlink_to("python3")
    (venv / "pyvenv.cfg").write_text("home = /usr/bin\nversion = 3.11.2\n")
    (venv / "bin" / "mini").write_text("#!/bin/sh\n")
    pip = AgentInstall("pip", "mini-swe-agent", "1.0", "mini")
    assert "/usr/bin/python3 -c" in sandbox_probe(pip, venv)
    assert sandbox_problems(pip, venv, "uniagent-command=ok\nuniagent-python=3.11\n") == []
    [wrong] = sandbox_problems(pip, venv, "uniagent-command=ok\nuniagent-python=3.9\n")
    assert "the image's /usr/bin/python3 is Python 3.9" in wrong and "3.11" in wrong
    [none] = sandbox_problems(pip, venv, "uniagent-command=ok\n")
    assert none.startswith("the image has no /usr/bin/python3")

    npm = tmp_path / "npm"
    package = npm / "node_modules" / "@acme" / "cli"
    (package / "bin").mkdir(parents=True)
    (package / "package.json").write_text('{"engines": {"node": ">=18.2"}}')
    (package / "bin" / "cli.js").write_text("#!/usr/bin/env node\n")
    (npm / "node_modules" / ".bin").mkdir()
    (npm / "node_modules" / ".bin" / "acme").symlink_to("../@acme/cli/bin/cli.js")
    node = AgentInstall("npm", "@acme/cli", "1.0.0", "acme")
    assert runs_with(node, npm) == "node"
    assert sandbox_problems(node, npm, "uniagent-command=ok\nuniagent-node=v18.19.0\n") == []
    [old] = sandbox_problems(node, npm, "uniagent-command=ok\nuniagent-node=v16.20.0\n")
    assert "the image's node is v16.20.0; @acme/cli needs node >= 18.2" in old
    command, no_node = sandbox_problems(node, npm, "")
    assert "not there or not executable for the agent's user" in command
    assert no_node == "the image has no node (@acme/cli needs node >= 18.2 on PATH)"
    # A native executable (this Python's, linked with the system's loader) needs no node.
    (npm / "node_modules" / ".bin" / "acme").unlink()
    (npm / "node_modules" / ".bin" / "acme").symlink_to(Path(sys.executable).resolve())
    assert runs_with(node, npm) == "elf"
    assert "node -v" not in sandbox_probe(node, npm)
    [loader] = sandbox_problems(node, npm, "uniagent-command=ok\n")
    assert loader.startswith("the image has no /lib64/ld-linux-x86-64.so.2")


async def test_a_sandbox_that_cannot_reach_the_gateway_is_told_before_the_harness_starts() -> None:
    """Asked from inside the sandbox, as the agent, before the first model call: a closed
    port (a container network the gateway is not on) is infrastructure, named."""
    import socket

    from uniagent import open_env
    from uniagent.agents.harness import _reach_gateway, _Unreachable

    with socket.socket() as listening:  # a port that answers
        listening.bind(("127.0.0.1", 0))
        listening.listen()
        port = listening.getsockname()[1]
        async with open_env({"type": "host", "isolation": "none"}) as env:
            await _reach_gateway(env, f"http://127.0.0.1:{port}/s/abc")
            listening.close()  # now nothing listens there
            with pytest.raises(
                _Unreachable, match=rf"cannot reach the gateway at 127.0.0.1:{port}"
            ):
                await _reach_gateway(env, f"http://127.0.0.1:{port}/s/abc")


# -- pip harnesses installed by uv -----------------------------------------------------------

#: A small real package with a console script, from the registry.
COWSAY = AgentInstall("pip", "cowsay", "6.1", "cowsay")


def _uv_on_path(monkeypatch: pytest.MonkeyPatch, folder: Path) -> Path:
    """``folder`` first on PATH, holding a ``uv`` that runs the real one (the uv package's)."""
    from uv import find_uv_bin

    folder.mkdir()
    (folder / "uv").symlink_to(find_uv_bin())
    monkeypatch.setenv("PATH", f"{folder}{os.pathsep}{os.environ['PATH']}")
    return folder / "uv"


def _installed_and_working(folder: Path) -> str:
    """What made the venv (``uv`` or ``pip``); its script runs from the final folder."""
    out = subprocess.run(
        [str(folder / "bin" / "cowsay"), "-t", "moo"], capture_output=True, text=True, check=True
    )
    assert "moo" in out.stdout
    assert (folder / "bin" / "pip").exists()  # as `python -m venv` makes it
    config = (folder / "pyvenv.cfg").read_text()
    return "uv" if re.search(r"^uv = ", config, re.M) else "pip"


def test_a_pip_harness_is_installed_by_uv_with_its_own_copies(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("UNIAGENT_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("UNIAGENT_PIP_INSTALLER", raising=False)
    _uv_on_path(monkeypatch, tmp_path / "bin")
    folder = ensure_installed(COWSAY)
    # compiled at install, as pip does (before anything ran from it)
    assert list(folder.glob("lib/python3*/site-packages/cowsay/__pycache__/*.pyc"))
    assert _installed_and_working(folder) == "uv"
    # copied out of uv's cache, not linked to it: the install shares no inode with it
    module = next(folder.glob("lib/python3*/site-packages/cowsay/__init__.py"))
    assert module.stat().st_nlink == 1


def test_pip_installs_when_asked_or_when_uv_fails(tmp_path, monkeypatch, caplog) -> None:
    monkeypatch.setenv("UNIAGENT_CACHE_DIR", str(tmp_path / "cache"))
    uv = _uv_on_path(monkeypatch, tmp_path / "bin")
    monkeypatch.setenv("UNIAGENT_PIP_INSTALLER", "pip")
    assert _installed_and_working(ensure_installed(COWSAY)) == "pip"

    # a uv that fails (here: one that exits 1) leaves no half-made venv: pip makes it anew
    monkeypatch.delenv("UNIAGENT_PIP_INSTALLER")
    monkeypatch.setenv("UNIAGENT_CACHE_DIR", str(tmp_path / "cache2"))
    uv.unlink()
    uv.write_text("#!/bin/sh\necho 'uv: no solution' >&2\nexit 1\n")
    uv.chmod(0o755)
    with caplog.at_level(logging.WARNING, logger="uniagent.agents.install"):
        folder = ensure_installed(COWSAY)
    assert _installed_and_working(folder) == "pip"
    assert "uv could not install cowsay==6.1, installing with pip" in caplog.text
    assert "uv: no solution" in caplog.text
