"""uniagent: build, run and train tool-using LLM agents.

This module is the front door for plugin authors: everything a plugin needs
(the records and ``hookimpl``, the reward and grading types, tool calls and
parsers, the sandbox protocols and ``AgentEnv``, the errors, the registry
look-ups) is importable from ``uniagent`` itself; ``uniagent.testing`` holds the
test helpers. Deeper module paths are internal and may change in any release
(see docs/plugins.md for the compatibility policy).
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

from uniagent.config import AgentConfig
from uniagent.env import AgentEnv, EnvConfig, HostDeployment, HostDeploymentConfig, Observation
from uniagent.env.errors import (
    ActionSyntaxError,
    ActionTimeoutError,
    CommandEncodingError,
    CommandTimeoutError,
    EnvError,
    EnvStartError,
    NonZeroExitError,
    ShellKilledError,
    TerminalNotAliveError,
    ToolInstallError,
)
from uniagent.env.host import SANDBOX_UID
from uniagent.env.killall import kill_all_but_ancestors
from uniagent.env.remote import make_runtime, retrying_runtime_class
from uniagent.env.runtime import (
    BashAction,
    BashInterruptAction,
    BashObservation,
    CloseBashSessionRequest,
    Command,
    CommandResponse,
    CreateBashSessionRequest,
    Deployment,
    IsAliveResponse,
    ReadFileRequest,
    Runtime,
    UploadRequest,
    WriteFileRequest,
)
from uniagent.errors import (
    ConfigError,
    PluginConflictError,
    PluginLoadError,
    UniAgentError,
    UnknownPluginNameError,
)
from uniagent.grading.integrity import GradingSetupError
from uniagent.grading.rules import ContentRule, ProtectRule
from uniagent.grading.sandbox import GradingOutput, GradingSandbox
from uniagent.grading.settings import IntegrityDefaults, Workspace
from uniagent.hookspecs import hookimpl
from uniagent.interaction.exit import ExitReason
from uniagent.parsers import (
    ErrorKind,
    ParseResult,
    ToolCall,
    ToolCallFormatError,
    ToolCallParser,
    get_parser,
    tool_calls_from_openai,
    validate_call,
)
from uniagent.parsers.base import check_count, example_call, format_error
from uniagent.plugins import load_plugins, reset_plugins
from uniagent.registry import (
    get_deployments,
    get_rewards,
    get_services,
    get_tool_parsers,
    get_tools,
    validate_deployment_config,
)
from uniagent.resolve import ResolvedAgent, resolve
from uniagent.reward import RewardContext, RewardInfraError, RewardResult
from uniagent.services import ServiceStartError, running_services
from uniagent.specs import (
    DeploymentSpec,
    ParserSpec,
    RewardSpec,
    RunningService,
    ServiceSpec,
    ToolSpec,
)

try:
    __version__ = version("uniagent")
except PackageNotFoundError:  # running from a source tree without an install
    __version__ = "0.0.0+unknown"

__all__ = [
    "SANDBOX_UID",
    "ActionSyntaxError",
    "ActionTimeoutError",
    "AgentConfig",
    "AgentEnv",
    "BashAction",
    "BashInterruptAction",
    "BashObservation",
    "CloseBashSessionRequest",
    "Command",
    "CommandEncodingError",
    "CommandResponse",
    "CommandTimeoutError",
    "ConfigError",
    "ContentRule",
    "CreateBashSessionRequest",
    "Deployment",
    "DeploymentSpec",
    "EnvConfig",
    "EnvError",
    "EnvStartError",
    "ErrorKind",
    "ExitReason",
    "GradingOutput",
    "GradingSandbox",
    "GradingSetupError",
    "HostDeployment",
    "HostDeploymentConfig",
    "IntegrityDefaults",
    "IsAliveResponse",
    "NonZeroExitError",
    "Observation",
    "ParseResult",
    "ParserSpec",
    "PluginConflictError",
    "PluginLoadError",
    "ProtectRule",
    "ReadFileRequest",
    "ResolvedAgent",
    "RewardContext",
    "RewardInfraError",
    "RewardResult",
    "RewardSpec",
    "RunningService",
    "Runtime",
    "ServiceSpec",
    "ServiceStartError",
    "ShellKilledError",
    "TerminalNotAliveError",
    "ToolCall",
    "ToolCallFormatError",
    "ToolCallParser",
    "ToolInstallError",
    "ToolSpec",
    "UniAgentError",
    "UnknownPluginNameError",
    "UploadRequest",
    "Workspace",
    "WriteFileRequest",
    "__version__",
    "check_count",
    "example_call",
    "format_error",
    "get_deployments",
    "get_parser",
    "get_rewards",
    "get_services",
    "get_tool_parsers",
    "get_tools",
    "hookimpl",
    "kill_all_but_ancestors",
    "load_plugins",
    "make_runtime",
    "reset_plugins",
    "resolve",
    "retrying_runtime_class",
    "running_services",
    "tool_calls_from_openai",
    "validate_call",
    "validate_deployment_config",
]
