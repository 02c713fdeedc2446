"""Errors a user can cause; each message says what was wrong and what to do."""

from __future__ import annotations


class UniAgentError(Exception):
    """Base class of uniagent's own errors."""


class PluginLoadError(UniAgentError):
    """A plugin failed to load and ``UNIAGENT_STRICT_PLUGINS=1`` made it fatal."""


class PluginConflictError(UniAgentError):
    """Two plugins contribute a record of the same kind under the same name."""


class ConfigError(UniAgentError, ValueError):
    """A configuration is invalid; the message names the offending key."""


class UnknownPluginNameError(ConfigError, LookupError):
    """A config names a tool, deployment, parser or reward that no plugin provides."""
