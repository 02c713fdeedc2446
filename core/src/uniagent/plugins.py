"""Finding, loading and reporting plugins (entry-point group ``uniagent``).

Built-in plugins ship inside the core and register through the same hooks as
external ones. Environment variables:

- ``UNIAGENT_LOAD_PLUGINS``: comma list of distributions to load; set but empty
  loads no external plugin. A name no installed distribution has is a warning naming
  the installed ones (fatal under ``UNIAGENT_STRICT_PLUGINS=1``).
- ``UNIAGENT_DISABLE_PLUGINS``: comma list of distributions to block.
- ``UNIAGENT_STRICT_PLUGINS=1``: a plugin that fails to load is fatal.
"""

from __future__ import annotations

import difflib
import importlib
import importlib.metadata as metadata
import logging
import os
import threading
import traceback
from collections.abc import Iterable
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any, Literal

import pluggy

from uniagent import hookspecs
from uniagent.errors import PluginLoadError
from uniagent.hookspecs import PROJECT

log = logging.getLogger(__name__)

ENTRY_POINT_GROUP = "uniagent"
BUILTIN_DISTRIBUTION = "uniagent"
BUILTIN_MODULES: tuple[str, ...] = (
    "uniagent.builtin.agents",
    "uniagent.builtin.deployments",
    "uniagent.builtin.parsers",
    "uniagent.builtin.rewards",
)
HOOK_NAMES: tuple[str, ...] = tuple(
    name for name in dir(hookspecs) if name.startswith(f"{PROJECT}_")
)

Status = Literal["loaded", "failed", "blocked"]


def normalize_name(name: str) -> str:
    """PEP 503 normalisation, so ``UniAgent_Tools.SWE`` matches ``uniagent-tools-swe``."""
    return "-".join(name.replace("_", "-").replace(".", "-").lower().split("-"))


def _env_list(var: str) -> list[str] | None:
    raw = os.environ.get(var)
    if raw is None:
        return None
    return [normalize_name(part) for part in raw.split(",") if part.strip()]


@dataclass
class PluginInfo:
    """What was found for one plugin and what became of it."""

    distribution: str
    version: str | None
    module: str
    status: Status
    builtin: bool = False
    error: str | None = None
    hooks: list[str] = field(default_factory=list)
    plugin: Any = field(default=None, repr=False)
    #: What each hook yielded (validated records), by kind; empty for a failed plugin.
    records: dict[str, list[Any]] = field(default_factory=dict, repr=False)

    @property
    def key(self) -> str:
        """The plugin's name in the hook manager (built-ins: one per module)."""
        return PluginManager._key(self.distribution, self.module, self.builtin)

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready summary (without the plugin object)."""
        return {
            "name": self.distribution,
            "version": self.version,
            "module": self.module,
            "status": self.status,
            "builtin": self.builtin,
            "error": self.error,
            "hooks": list(self.hooks),
        }


class PluginManager:
    """A pluggy manager for the ``uniagent`` hooks plus the load report."""

    def __init__(self, search_path: list[str] | None = None) -> None:
        #: Where to look for installed distributions (default: ``sys.path``).
        self.search_path = search_path
        self.hook_manager = pluggy.PluginManager(PROJECT)
        self.hook_manager.add_hookspecs(hookspecs)
        self.plugins: dict[str, PluginInfo] = {}
        self._loaded = False
        #: Whether :meth:`load` looked at the entry points (a manager built by hand does not).
        self._entry_points_loaded = False
        self._lock = threading.RLock()

    # -- registration -------------------------------------------------------
    def register(
        self,
        plugin: ModuleType | object,
        distribution: str,
        *,
        version: str | None = None,
        builtin: bool = False,
        module: str | None = None,
    ) -> PluginInfo:
        """Register a plugin object directly; a broken one is recorded as failed."""
        key = self._key(distribution, module or _module_name(plugin), builtin)
        info = PluginInfo(
            distribution=distribution,
            version=version,
            module=module or _module_name(plugin),
            status="loaded",
            builtin=builtin,
            plugin=plugin,
        )
        try:
            _check_hook_names(plugin)
            self.hook_manager.register(plugin, name=key)
        except Exception as exc:
            info.status, info.error = "failed", _error_text(exc)
            if _strict():
                raise PluginLoadError(
                    f"plugin {distribution!r} failed to load: {info.error}"
                ) from exc
        else:
            info.hooks = sorted(
                impl_name
                for impl_name in HOOK_NAMES
                if any(
                    i.plugin_name == key
                    for i in getattr(self.hook_manager.hook, impl_name).get_hookimpls()
                )
            )
            self._collect(info)
        self.plugins[key] = info
        return info

    def _collect(self, info: PluginInfo) -> None:
        """Call each of the plugin's hooks through pluggy and validate what they yield.

        A hook that raises, yields something that is not its record type, or
        yields a record that does not validate fails this plugin only: it is
        unregistered, reported with the reason, and contributes nothing.
        """
        from uniagent.specs import RECORD_TYPES

        records: dict[str, list[Any]] = {}
        for hook_name in info.hooks:
            kind = hook_name.removeprefix(f"{PROJECT}_")
            expected = RECORD_TYPES[kind]  # type: ignore[index]
            try:
                results = self._call_one(hook_name, info.key)
                found = [r for result in results for r in (result or ())]
                wrong = next((r for r in found if not isinstance(r, expected)), None)
                if wrong is not None:
                    raise PluginLoadError(
                        f"hook {hook_name} must yield {expected.__name__} records, "
                        f"not {type(wrong).__name__} ({wrong!r:.80})"
                    )
            except Exception as exc:
                reason = exc if isinstance(exc, PluginLoadError) else None
                info.status = "failed"
                raised = f"hook {hook_name} raised {_error_text(exc)}"
                info.error = str(reason) if reason else raised
                info.records = {}
                log.warning("plugin %s: %s", info.distribution, info.error)
                self.hook_manager.unregister(name=info.key)
                if _strict():
                    raise PluginLoadError(f"plugin {info.distribution!r}: {info.error}") from exc
                return
            records[kind] = found
        info.records = records

    def load(self, *, builtins: bool = True, entry_points: bool = True) -> PluginManager:
        """Register the built-ins and every selected entry point, once."""
        with self._lock:
            if self._loaded:
                return self
            if builtins:
                for module_name in BUILTIN_MODULES:
                    self._register_module(
                        module_name, BUILTIN_DISTRIBUTION, _core_version(), builtin=True
                    )
            if entry_points:
                self._load_entry_points()
            self.hook_manager.check_pending()
            self._loaded = True
            return self

    def _load_entry_points(self) -> None:
        selected = _env_list("UNIAGENT_LOAD_PLUGINS")
        disabled = set(_env_list("UNIAGENT_DISABLE_PLUGINS") or [])
        self._entry_points_loaded = True
        seen: set[tuple[str, str]] = set()
        names: dict[str, str] = {}  # every installed plugin's distribution, by its normal name
        for ep, dist_name, version in _iter_entry_points(self.search_path):
            norm = normalize_name(dist_name)
            names.setdefault(norm, dist_name)
            if (norm, ep.value) in seen:  # the same entry point seen twice (editable installs)
                continue
            seen.add((norm, ep.value))
            if selected is not None and norm not in selected:
                continue
            if norm in disabled:
                key = self._key(dist_name, ep.value, False)
                self.plugins[key] = PluginInfo(
                    distribution=dist_name,
                    version=version,
                    module=ep.value,
                    status="blocked",
                    error="blocked by UNIAGENT_DISABLE_PLUGINS",
                )
                continue
            if normalize_name(ep.name) != norm:
                log.warning(
                    "plugin %s: entry point %r should be named after its distribution (%r)",
                    dist_name,
                    ep.name,
                    dist_name,
                )
            self._register_entry_point(ep, dist_name, version)
        unmatched = [name for name in selected or () if name not in names]
        if unmatched:
            self._unmatched_selection(unmatched, sorted(names.values(), key=normalize_name))

    @staticmethod
    def _unmatched_selection(unmatched: list[str], installed: list[str]) -> None:
        """``UNIAGENT_LOAD_PLUGINS`` names distributions that are not installed plugins: a
        warning naming them and the installed ones (fatal when strict), not silence."""
        message = (
            f"UNIAGENT_LOAD_PLUGINS names {', '.join(unmatched)}: not installed (no "
            f"`{ENTRY_POINT_GROUP}` entry point); installed plugins: "
            f"{', '.join(installed) or 'none'}"
        )
        close = [
            match
            for name in unmatched
            for match in difflib.get_close_matches(name, [normalize_name(i) for i in installed], 1)
        ]
        if close:
            message += f"; did you mean {', '.join(dict.fromkeys(close))}?"
        if _strict():
            raise PluginLoadError(message)
        log.warning("%s", message)

    def installed_version(self, distribution: str) -> str | None:
        """The version of ``distribution`` installed where this manager looks, or None."""
        norm = normalize_name(distribution)
        path = self.search_path
        for dist in metadata.distributions(path=path) if path else metadata.distributions():
            if normalize_name(dist.metadata["Name"] or "") == norm:
                return dist.version
        return None

    def absence(self, distribution: str) -> str:
        """Why ``distribution``'s records are not here, as a clause: not installed (and the
        command that installs it), failed, blocked, or not selected."""
        norm = normalize_name(distribution)
        info = next(
            (i for i in self.plugins.values() if normalize_name(i.distribution) == norm), None
        )
        if info is not None and info.status == "failed":
            return f"which failed to load ({info.error}); `uniagent plugins` shows it"
        if info is not None and info.status == "blocked":
            return "which is installed but blocked by UNIAGENT_DISABLE_PLUGINS"
        if info is not None:
            return (
                f"which is loaded (version {info.version}) but does not provide it: "
                f"pip install -U {distribution}"
            )
        if self.installed_version(distribution) is None:
            return f"which is not installed: pip install {distribution}"
        if self._entry_points_loaded:
            return "which is installed but not loaded: UNIAGENT_LOAD_PLUGINS does not name it"
        return "which is installed but not registered with this plugin manager"

    def _register_entry_point(
        self, ep: metadata.EntryPoint, dist_name: str, version: str | None
    ) -> None:
        try:
            plugin = ep.load()
        except BaseException as exc:
            if isinstance(exc, KeyboardInterrupt):
                raise
            self._record_failure(dist_name, version, ep.value, exc)
            return
        self.register(plugin, dist_name, version=version, module=ep.value)

    def _register_module(
        self, module_name: str, dist_name: str, version: str | None, *, builtin: bool
    ) -> None:
        try:
            module = importlib.import_module(module_name)
        except Exception as exc:
            self._record_failure(dist_name, version, module_name, exc, builtin=builtin)
            return
        self.register(module, dist_name, version=version, builtin=builtin, module=module_name)

    def _record_failure(
        self,
        dist_name: str,
        version: str | None,
        module: str,
        exc: BaseException,
        *,
        builtin: bool = False,
    ) -> None:
        error = _error_text(exc)
        log.warning("plugin %s (%s) failed to load: %s", dist_name, module, error)
        self.plugins[self._key(dist_name, module, builtin)] = PluginInfo(
            distribution=dist_name,
            version=version,
            module=module,
            status="failed",
            builtin=builtin,
            error=error,
        )
        if _strict():
            raise PluginLoadError(
                f"plugin {dist_name!r} ({module}) failed to load: {error}\n"
                f"{''.join(traceback.format_exception(exc))}"
            ) from exc

    @staticmethod
    def _key(distribution: str, module: str, builtin: bool) -> str:
        return f"{distribution}:{module}" if builtin else distribution

    def _call_one(self, hook_name: str, key: str) -> list[Any]:
        """One plugin's implementation of ``hook_name``, called through pluggy's machinery.

        pluggy passes each implementation the hook arguments it names, so a hook
        can gain arguments without breaking plugins written before; calling only
        this plugin's implementation keeps one plugin's failure from hiding the
        others' records. (``subset_hook_caller`` would do it too, but needs
        hashable plugin objects.)
        """
        caller = getattr(self.hook_manager.hook, hook_name)
        impls = [i for i in caller.get_hookimpls() if i.plugin_name == key]
        results = self.hook_manager._hookexec(hook_name, impls, {}, False)
        return list(results) if isinstance(results, list) else [results]

    # -- queries --------------------------------------------------------------
    def contributions(self, kind: str) -> Iterable[tuple[PluginInfo, list[Any]]]:
        """(plugin info, its validated records of ``kind``) in registration order."""
        for info in self.plugins.values():
            if info.status == "loaded" and kind in info.records:
                yield info, info.records[kind]

    def report(self, *, include_builtins: bool = False) -> list[PluginInfo]:
        """Load records, external plugins first then (optionally) the built-ins."""
        infos = [i for i in self.plugins.values() if include_builtins or not i.builtin]
        return sorted(infos, key=lambda i: (i.builtin, normalize_name(i.distribution), i.module))


def _iter_entry_points(
    search_path: list[str] | None,
) -> Iterable[tuple[metadata.EntryPoint, str, str | None]]:
    dists = metadata.distributions(path=search_path) if search_path else metadata.distributions()
    for dist in dists:
        # Entry points first: most distributions have none of ours, and reading one's
        # metadata (an email-format parse) cost ~1 ms each, most of the plugin scan.
        ours = [ep for ep in dist.entry_points if ep.group == ENTRY_POINT_GROUP]
        if not ours:
            continue
        dist_name = dist.metadata["Name"]
        if not dist_name:
            continue
        for ep in ours:
            yield ep, dist_name, dist.version


def _check_hook_names(plugin: object) -> None:
    """Reject attributes that look like hooks but match none (``check_pending`` per plugin)."""
    for attr in dir(plugin):
        if not attr.startswith(f"{PROJECT}_") or attr in HOOK_NAMES:
            continue
        if callable(getattr(plugin, attr, None)):
            close = difflib.get_close_matches(attr, HOOK_NAMES, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise PluginLoadError(
                f"unknown hook {attr!r}{hint}; the hooks are: {', '.join(HOOK_NAMES)}"
            )


def _module_name(plugin: object) -> str:
    return getattr(plugin, "__name__", None) or type(plugin).__qualname__


def _error_text(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


def _strict() -> bool:
    return os.environ.get("UNIAGENT_STRICT_PLUGINS", "").strip().lower() in {"1", "true", "yes"}


def _core_version() -> str | None:
    try:
        return metadata.version("uniagent")
    except metadata.PackageNotFoundError:
        return None


_default: PluginManager | None = None
_default_lock = threading.Lock()


def load_plugins() -> PluginManager:
    """The process-wide plugin manager, loaded once (idempotent)."""
    global _default
    with _default_lock:
        if _default is None:
            _default = PluginManager()
        return _default.load()


def reset_plugins() -> None:
    """Forget the process-wide manager (tests, or after installing a plugin at run time).

    The registry notices: it is rebuilt over the next manager that loads.
    """
    global _default
    with _default_lock:
        _default = None
