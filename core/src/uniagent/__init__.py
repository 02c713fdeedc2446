"""uniagent: build, run and train tool-using LLM agents.

The front door for plugin authors and users: the records and ``hookimpl``, the
config and its resolve step, opening a sandbox, tool calls and parsers, the reward
and grading types, the errors. Backend authors also use :mod:`uniagent.sandbox`
(the typed ``Runtime``/``Deployment`` protocols, their request models, the kill and
retry helpers); tests use :mod:`uniagent.testing`. Deeper module paths are internal
and may change in any release (docs/plugins.md, "Compatibility").

Names load on first use: ``import uniagent`` (or ``uniagent.errors``) imports no
sandbox backend, no grader and no runner.
"""

from __future__ import annotations

import importlib
import warnings
from importlib.metadata import PackageNotFoundError, version
from typing import TYPE_CHECKING, Any

try:
    __version__ = version("uniagent")
except PackageNotFoundError:  # running from a source tree without an install
    __version__ = "0.0.0+unknown"

#: Each public name and the module that defines it (imported on first access).
_EXPORTS: dict[str, str] = {
    # the plugin contract
    "hookimpl": "uniagent.hookspecs",
    "ToolSpec": "uniagent.specs",
    "AgentSpec": "uniagent.specs",
    "AgentInstall": "uniagent.specs",
    "AgentLaunch": "uniagent.specs",
    "AgentCommand": "uniagent.specs",
    "AgentOutcome": "uniagent.specs",
    "AgentRun": "uniagent.agent_run",
    "EpisodeAgent": "uniagent.agent_run",
    "EpisodeContext": "uniagent.agent_run",
    "EpisodeMetrics": "uniagent.interaction.metrics",
    "DeploymentSpec": "uniagent.specs",
    "ParserSpec": "uniagent.specs",
    "RewardSpec": "uniagent.specs",
    "ServiceSpec": "uniagent.specs",
    "RunningService": "uniagent.specs",
    # plugins and their look-ups
    "load_plugins": "uniagent.plugins",
    "reset_plugins": "uniagent.plugins",
    "get_registry": "uniagent.registry",
    "get_parser": "uniagent.registry",
    # configs, the one resolve step, sandboxes from config
    "AgentConfig": "uniagent.config",
    "EnvConfig": "uniagent.env.config",
    "resolve": "uniagent.resolver",
    "ResolvedAgent": "uniagent.resolver",
    "open_env": "uniagent.resolver",
    "AgentEnv": "uniagent.env.agent_env",
    "Observation": "uniagent.env.agent_env",
    "ExitReason": "uniagent.exit",
    # tool calls
    "ToolCall": "uniagent.parsers.base",
    "ToolCallParser": "uniagent.parsers.base",
    "CallReader": "uniagent.parsers.base",
    "ToolCallFormatError": "uniagent.parsers.base",
    "ParseResult": "uniagent.parsers.base",
    "ErrorKind": "uniagent.parsers.base",
    "tool_calls_from_openai": "uniagent.parsers.base",
    "validate_call": "uniagent.parsers.base",
    "check_count": "uniagent.parsers.base",
    "example_call": "uniagent.parsers.base",
    "format_error": "uniagent.parsers.base",
    # rewards and what the grader protects
    "RewardContext": "uniagent.reward",
    "RewardResult": "uniagent.reward",
    "RewardInfraError": "uniagent.reward",
    # an OpenAI-compatible judge (the llm_judge reward's endpoint, for plugins' judges)
    "JudgeEndpoint": "uniagent.judge",
    "JudgeError": "uniagent.judge",
    "ask_judge": "uniagent.judge",
    "GradingSandbox": "uniagent.grading.sandbox",
    "GradingOutput": "uniagent.grading.sandbox",
    "GradingReadError": "uniagent.grading.sandbox",
    "GradingSetupError": "uniagent.grading.integrity",
    "StatusRecords": "uniagent.grading.statuses",
    "status_recorder": "uniagent.grading.statuses",
    "keep_recorder": "uniagent.grading.statuses",
    "read_status_records": "uniagent.grading.statuses",
    "module_shadow_reports": "uniagent.grading.statuses",
    "Workspace": "uniagent.protect.settings",
    "IntegrityDefaults": "uniagent.protect.settings",
    "TestEnv": "uniagent.protect.settings",
    "script_test_env": "uniagent.grading.testenv",
    "ContentRule": "uniagent.protect.rules",
    "ProtectRule": "uniagent.protect.rules",
    # the download cache (tokenizers, wheels, harness installs): built once per machine
    "cache_dir": "uniagent.cache",
    "build_once": "uniagent.cache",
    # services
    "running_services": "uniagent.services",
    "ServiceStartError": "uniagent.services",
    # errors
    "UniAgentError": "uniagent.errors",
    "ConfigError": "uniagent.errors",
    "PluginLoadError": "uniagent.errors",
    "PluginConflictError": "uniagent.errors",
    "UnknownPluginNameError": "uniagent.errors",
    "EnvError": "uniagent.env.errors",
    "EnvStartError": "uniagent.env.errors",
    "ToolInstallError": "uniagent.env.errors",
    "TerminalNotAliveError": "uniagent.env.errors",
    "ShellKilledError": "uniagent.env.errors",
    "CommandTimeoutError": "uniagent.env.errors",
}

#: Names that left the front door in 0.3 (still served until 0.4, with a warning).
_MOVED: dict[str, str] = {
    **{
        name: "uniagent.sandbox"
        for name in (
            "SANDBOX_UID",
            "kill_all_but_ancestors",
            "make_runtime",
            "retrying_runtime_class",
            "Runtime",
            "Deployment",
            "HostDeployment",
            "HostDeploymentConfig",
            "BashAction",
            "BashInterruptAction",
            "BashObservation",
            "CloseBashSessionRequest",
            "Command",
            "CommandResponse",
            "CreateBashSessionRequest",
            "IsAliveResponse",
            "ReadFileRequest",
            "UploadRequest",
            "WriteFileRequest",
            "ActionSyntaxError",
            "ActionTimeoutError",
            "CommandEncodingError",
            "NonZeroExitError",
        )
    },
    **{
        name: "uniagent.registry"
        for name in (
            "get_tools",
            "get_deployments",
            "get_tool_parsers",
            "get_rewards",
            "get_services",
            "validate_deployment_config",
        )
    },
}

__all__ = [
    "AgentCommand",
    "AgentConfig",
    "AgentEnv",
    "AgentInstall",
    "AgentLaunch",
    "AgentOutcome",
    "AgentRun",
    "AgentSpec",
    "CallReader",
    "CommandTimeoutError",
    "ConfigError",
    "ContentRule",
    "DeploymentSpec",
    "EnvConfig",
    "EnvError",
    "EnvStartError",
    "EpisodeAgent",
    "EpisodeContext",
    "EpisodeMetrics",
    "ErrorKind",
    "ExitReason",
    "GradingOutput",
    "GradingReadError",
    "GradingSandbox",
    "GradingSetupError",
    "IntegrityDefaults",
    "JudgeEndpoint",
    "JudgeError",
    "Observation",
    "ParseResult",
    "ParserSpec",
    "PluginConflictError",
    "PluginLoadError",
    "ProtectRule",
    "ResolvedAgent",
    "RewardContext",
    "RewardInfraError",
    "RewardResult",
    "RewardSpec",
    "RunningService",
    "ServiceSpec",
    "ServiceStartError",
    "ShellKilledError",
    "StatusRecords",
    "TerminalNotAliveError",
    "TestEnv",
    "ToolCall",
    "ToolCallFormatError",
    "ToolCallParser",
    "ToolInstallError",
    "ToolSpec",
    "UniAgentError",
    "UnknownPluginNameError",
    "Workspace",
    "__version__",
    "ask_judge",
    "build_once",
    "cache_dir",
    "check_count",
    "example_call",
    "format_error",
    "get_parser",
    "get_registry",
    "hookimpl",
    "keep_recorder",
    "load_plugins",
    "module_shadow_reports",
    "open_env",
    "read_status_records",
    "reset_plugins",
    "resolve",
    "running_services",
    "script_test_env",
    "status_recorder",
    "tool_calls_from_openai",
    "validate_call",
]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None and name in _MOVED:
        module = _MOVED[name]
        if module == "uniagent.sandbox":  # the registry's old look-ups warn when called
            warnings.warn(
                f"uniagent.{name} moved to {module}.{name} in uniagent 0.3; the old name "
                "goes in 0.4",
                DeprecationWarning,
                stacklevel=2,
            )
    if module is None:
        raise AttributeError(f"module 'uniagent' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    if name in _EXPORTS:
        globals()[name] = value  # later look-ups skip __getattr__
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_EXPORTS])


if TYPE_CHECKING:  # pragma: no cover - what type checkers and IDEs see
    from uniagent.agent_run import AgentRun, EpisodeAgent, EpisodeContext
    from uniagent.cache import build_once, cache_dir
    from uniagent.config import AgentConfig
    from uniagent.env.agent_env import AgentEnv, Observation
    from uniagent.env.config import EnvConfig
    from uniagent.env.errors import (
        CommandTimeoutError,
        EnvError,
        EnvStartError,
        ShellKilledError,
        TerminalNotAliveError,
        ToolInstallError,
    )
    from uniagent.errors import (
        ConfigError,
        PluginConflictError,
        PluginLoadError,
        UniAgentError,
        UnknownPluginNameError,
    )
    from uniagent.exit import ExitReason
    from uniagent.grading.integrity import GradingSetupError
    from uniagent.grading.sandbox import GradingOutput, GradingReadError, GradingSandbox
    from uniagent.grading.statuses import (
        StatusRecords,
        keep_recorder,
        module_shadow_reports,
        read_status_records,
        status_recorder,
    )
    from uniagent.grading.testenv import script_test_env
    from uniagent.hookspecs import hookimpl
    from uniagent.interaction.metrics import EpisodeMetrics
    from uniagent.judge import JudgeEndpoint, JudgeError, ask_judge
    from uniagent.parsers.base import (
        CallReader,
        ErrorKind,
        ParseResult,
        ToolCall,
        ToolCallFormatError,
        ToolCallParser,
        check_count,
        example_call,
        format_error,
        tool_calls_from_openai,
        validate_call,
    )
    from uniagent.plugins import load_plugins, reset_plugins
    from uniagent.protect.rules import ContentRule, ProtectRule
    from uniagent.protect.settings import IntegrityDefaults, TestEnv, Workspace
    from uniagent.registry import get_parser, get_registry
    from uniagent.resolver import ResolvedAgent, open_env, resolve
    from uniagent.reward import RewardContext, RewardInfraError, RewardResult
    from uniagent.services import ServiceStartError, running_services
    from uniagent.specs import (
        AgentCommand,
        AgentInstall,
        AgentLaunch,
        AgentOutcome,
        AgentSpec,
        DeploymentSpec,
        ParserSpec,
        RewardSpec,
        RunningService,
        ServiceSpec,
        ToolSpec,
    )
