"""The ``uniagent`` command."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from typing import Any

from uniagent import __version__
from uniagent.errors import UniAgentError
from uniagent.specs import KINDS


def plugins_report(*, include_builtins: bool = False) -> dict[str, Any]:
    """What ``uniagent plugins --json`` prints: every plugin, its hooks and contributions."""
    from uniagent.plugins import load_plugins
    from uniagent.registry import get_registry

    manager = load_plugins()
    registry = get_registry()
    contributions = registry.contributions()
    conflicts: list[str] = []
    details: dict[str, dict[str, Any]] = {}
    for kind in KINDS:
        try:
            records = registry.get(kind)
        except UniAgentError as exc:
            conflicts.append(str(exc))
            continue
        for record in records.values():
            if kind == "tools":
                details[f"tools:{record.name}"] = {
                    "schema": record.openai_schema(),
                    "ends_episode": record.ends_episode,
                }
    plugins = []
    for info in manager.report(include_builtins=include_builtins):
        entry = info.to_json()
        key = manager._key(info.distribution, info.module, info.builtin)
        provided = contributions.get(key, {k: [] for k in KINDS})
        entry["contributes"] = provided
        entry["tools"] = [
            {"name": name, **details[f"tools:{name}"]}
            for name in provided.get("tools", [])
            if f"tools:{name}" in details
        ]
        plugins.append(entry)
    return {"uniagent": __version__, "plugins": plugins, "errors": conflicts}


def _print_plugins(report: dict[str, Any]) -> None:
    if not report["plugins"]:
        print("No plugins installed. (`uniagent plugins --all` also lists the built-ins.)")
    for plugin in report["plugins"]:
        origin = " (built-in)" if plugin["builtin"] else ""
        print(f"{plugin['name']} {plugin['version'] or ''}{origin}  [{plugin['status']}]")
        print(f"  module: {plugin['module']}")
        if plugin["error"]:
            print(f"  error: {plugin['error']}")
        if plugin["hooks"]:
            print(f"  hooks: {', '.join(plugin['hooks'])}")
        for kind, names in plugin["contributes"].items():
            if names:
                print(f"  {kind.replace('_', ' ')}: {', '.join(names)}")
    for error in report["errors"]:
        print(f"error: {error}", file=sys.stderr)


def cmd_plugins(args: argparse.Namespace) -> int:
    """List installed plugins and what they contribute."""
    report = plugins_report(include_builtins=args.all)
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        _print_plugins(report)
    return 1 if report["errors"] else 0


def build_parser() -> argparse.ArgumentParser:
    """The argument parser with every sub-command."""
    parser = argparse.ArgumentParser(
        prog="uniagent",
        description="Build, run and train tool-using LLM agents.",
    )
    parser.add_argument("--version", action="version", version=f"uniagent {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    plugins = sub.add_parser("plugins", help="list installed plugins and what they provide")
    plugins.add_argument("--json", action="store_true", help="print JSON")
    plugins.add_argument("--all", action="store_true", help="include the built-in plugins")
    plugins.set_defaults(func=cmd_plugins)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``uniagent`` console script."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except UniAgentError as exc:
        print(f"uniagent: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("uniagent: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
