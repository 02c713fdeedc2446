"""uniagent: build, run and train tool-using LLM agents."""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

from uniagent.hookspecs import hookimpl
from uniagent.specs import DeploymentSpec, ParserSpec, RewardSpec, ServiceSpec, ToolSpec

try:
    __version__ = version("uniagent")
except PackageNotFoundError:  # running from a source tree without an install
    __version__ = "0.0.0+unknown"

__all__ = [
    "DeploymentSpec",
    "ParserSpec",
    "RewardSpec",
    "ServiceSpec",
    "ToolSpec",
    "__version__",
    "hookimpl",
]
