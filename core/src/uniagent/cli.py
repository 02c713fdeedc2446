"""The ``uniagent`` command."""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
from collections.abc import Callable, Sequence
from typing import Any, NoReturn

from uniagent import __version__
from uniagent.errors import ConfigError, UniAgentError
from uniagent.gateway.cli import add_gateway_parser
from uniagent.specs import KINDS


def plugins_report(*, include_builtins: bool = False, config: str | None = None) -> dict[str, Any]:
    """What ``uniagent plugins --json`` prints: every plugin, its hooks and contributions;
    with ``config`` (a config file), also its MCP servers' tools (``mcp.servers``)."""
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
            elif kind == "agents":
                details[f"agents:{record.name}"] = record.describe()
            elif kind == "deployments":
                details[f"deployments:{record.name}"] = {
                    "can_fork": record.can_fork,
                    **({"needs": record.missing()} if record.missing() else {}),
                }
    plugins = []
    for info in manager.report(include_builtins=include_builtins):
        entry = info.to_json()
        key = info.key
        provided = contributions.get(key, {k: [] for k in KINDS})
        entry["contributes"] = provided
        entry["tools"] = [
            {"name": name, **details[f"tools:{name}"]}
            for name in provided.get("tools", [])
            if f"tools:{name}" in details
        ]
        entry["agents"] = [
            {"name": name, **details[f"agents:{name}"]}
            for name in provided.get("agents", [])
            if f"agents:{name}" in details
        ]
        entry["deployments"] = [
            {"name": name, "can_fork": details[f"deployments:{name}"]["can_fork"]}
            for name in provided.get("deployments", [])
            if f"deployments:{name}" in details
        ]
        # Contributed but not usable here until a package is installed (an extra, say).
        entry["needs"] = {
            name: details[f"deployments:{name}"]["needs"]
            for name in provided.get("deployments", [])
            if "needs" in details.get(f"deployments:{name}", {})
        }
        plugins.append(entry)
    mcp: dict[str, Any] = {
        "supported": True,
        "config": "tools: [{mcp: {name, command | url, ...}}]",
        # The helper runs inside the sandbox, with the `python` each server names.
        "sdk_installed_here": importlib.util.find_spec("mcp") is not None,
    }
    if config is not None:
        mcp["servers"] = mcp_servers_report(config, conflicts)
    return {"uniagent": __version__, "plugins": plugins, "errors": conflicts, "mcp": mcp}


def mcp_servers_report(path: str, errors: list[str]) -> list[dict[str, Any]]:
    """The MCP servers of the config at ``path`` with their tools, listed as an episode lists
    them: in one sandbox of the config's deployment (without a task's overrides), started
    and closed here (process-wide servers too). A server that does not list its tools has
    an ``error`` (also in ``errors``) and no tools."""
    import asyncio

    from uniagent.config import AgentConfig
    from uniagent.env.errors import EnvError
    from uniagent.mcp.tools import list_mcp_tools
    from uniagent.resolver import resolve

    agent = resolve(AgentConfig.from_yaml(path), source=path)
    servers: list[dict[str, Any]] = [
        {"name": s.name, "transport": s.transport, "tools": [], "error": None}
        for s in agent.mcp_servers
    ]

    async def list_all() -> None:
        env = agent.new_env()
        try:
            await env.start()
            for server, entry in zip(agent.mcp_servers, servers, strict=True):
                try:
                    tools = await list_mcp_tools(env, [server], timeout=agent.env.setup_timeout)
                except EnvError as exc:
                    entry["error"] = str(exc)
                    errors.append(str(exc))
                    continue
                entry["tools"] = [
                    {
                        "name": t.name,
                        "server": t.server,
                        "schema": t.openai_schema(),
                        "ends_episode": t.ends_episode,
                    }
                    for t in tools
                ]
        finally:
            await env.close()
            if any(server.scope == "process" for server in agent.mcp_servers):
                from uniagent.mcp.process import close_mcp_servers

                await close_mcp_servers()

    if servers:
        try:
            asyncio.run(list_all())
        except EnvError as exc:  # the sandbox itself did not start
            errors.append(f"{path}: the sandbox for listing MCP tools did not start: {exc}")
    return servers


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
        for packages in sorted({tuple(p) for p in plugin["needs"].values()}):
            names = [n for n, p in plugin["needs"].items() if tuple(p) == packages]
            install = " ".join(f"'{p}'" for p in packages)
            print(
                f"  {', '.join(names)}: not usable without {', '.join(packages)} "
                f"(pip install {install})"
            )
    for server in report["mcp"].get("servers", []):
        names = ", ".join(t["name"] for t in server["tools"]) or "none"
        print(f"MCP server {server['name']} ({server['transport']}): tools: {names}")
    for error in report["errors"]:
        print(f"error: {error}", file=sys.stderr)


def cmd_plugins(args: argparse.Namespace) -> int:
    """List installed plugins and what they contribute."""
    report = plugins_report(include_builtins=args.all, config=args.config)
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        _print_plugins(report)
    return 1 if report["errors"] else 0


def model_info(specs: str | list[str], api_key_env: str | None) -> dict[str, Any]:
    """What the manifest records of the model: its spec without credentials (the first
    server's, and every server's under ``servers`` when there are several), the key's source."""
    from uniagent.run.manifest import public_model_spec

    specs = [specs] if isinstance(specs, str) else specs
    info: dict[str, Any] = {"spec": public_model_spec(specs[0])}
    if len(specs) > 1:
        info["servers"] = [public_model_spec(spec) for spec in specs]
    if specs[0].startswith("openai:"):
        info["api_key_env"] = api_key_env or "OPENAI_API_KEY"
    return info


def check_api_key_env(spec: str, api_key_env: str | None) -> None:
    """``--api-key-env`` names the key of an ``openai:`` model; refuse it for any other."""
    from uniagent.errors import ConfigError

    if api_key_env is not None and not spec.startswith("openai:"):
        raise ConfigError("--api-key-env applies only to openai: models")


def cmd_run(args: argparse.Namespace) -> int:
    """Run (and score) an agent over a task set; SIGINT and SIGTERM are guarded throughout."""
    from uniagent.run.shutdown import SignalGuard

    # One guard for every phase (loading, set-up, episodes, teardown, the summary): a
    # signal anywhere closes what the run opened, then exits 130 / 143 with one line.
    with SignalGuard():
        return _run(args)


def _run(args: argparse.Namespace) -> int:
    import functools
    from pathlib import Path

    from uniagent.agents.gateways import check_harness_spec
    from uniagent.config import AgentConfig
    from uniagent.models import check_spec, from_spec
    from uniagent.models.spec import pool_from_specs, read_model_specs
    from uniagent.resolver import resolve
    from uniagent.run.layout import RESULTS, SUMMARY
    from uniagent.run.options import RunOptions
    from uniagent.run.progress import Progress
    from uniagent.run.runner import exit_status, run_sync
    from uniagent.run.summary import format_summary

    config = AgentConfig.from_yaml(args.config)
    config = with_agent(config, args.agent, args.config)
    # Resolved once, here, and handed down: any typo exits 2 before a sandbox starts.
    agent = resolve(config, source=args.config)
    # The model spec as text (options, paths, fit with the parser): exit 2 before anything.
    specs = read_model_specs(args.model)  # one, or several servers of one model
    for spec in specs:
        if agent.agent.is_harness:  # served by the gateway: no guided decoding
            check_harness_spec(spec, agent.agent.name)
        check_spec(spec, agent.new_parser(), sampling=config.sampling)
        check_api_key_env(spec, args.api_key_env)
    tasks, bad_rows, exclusion = load_run_tasks(args, config)
    run_options = RunOptions(
        concurrency=args.concurrency,
        warm=args.warm,
        n=args.n,
        limit=args.limit,
        retries=args.retries,
        retry_delay=args.retry_delay,
        breaker=args.breaker,
        keep_failures=args.keep_failures,
        force_resume=args.force_resume,
        model_info=model_info(specs, args.api_key_env),
        tasks_path=Path(args.data),
        config_path=str(args.config),
        ray_address=args.ray,
        ray_workers=args.workers,
        exclude=exclusion,
    )
    options: dict[str, Any] = {"sampling_params": dict(config.sampling)}
    if args.api_key_env:
        options["api_key_env"] = args.api_key_env
    if agent.agent.is_harness:  # behind the gateway: an openai: server continues token ids
        options["token_backend"] = True
    factory: Callable[[], Any]
    if len(specs) == 1:
        factory = functools.partial(from_spec, specs[0], **options)
    else:  # each episode placed on one server (uniagent.models.pool)
        factory = functools.partial(pool_from_specs, specs, **options)
    out = Path(args.out)
    progress = Progress.for_stream(verbose=args.verbose)
    summary = run_sync(agent, tasks, bad_rows, factory, out, run_options, progress=progress)
    print(format_summary(summary))
    print(f"results: {out / RESULTS}; summary: {out / SUMMARY}")
    status = exit_status(summary)
    if summary.get("stopped"):
        print(f"uniagent: {summary['stopped']}", file=sys.stderr)
    sys.stdout.flush()  # inside the guard: a signal while the output blocks is handled
    return status


def with_agent(config: Any, agent: str | None, source: str) -> Any:
    """``config`` with ``--agent NAME`` as its agent: the config's own settings kept when it
    names the same agent, else none (they belong to another agent)."""
    if agent is None or agent == config.agent.name:
        return config
    from uniagent.config import AgentConfig

    data = config.model_dump(mode="python")
    data["agent"] = {"name": agent}
    return AgentConfig.from_dict(data, source=f"{source} with --agent {agent}")


def load_run_tasks(args: argparse.Namespace, config: Any) -> tuple[list[Any], list[Any], Any]:
    """The tasks of ``--data`` (a task file or Harbor task folders) less ``--exclude``, the
    bad rows, and what ``--exclude`` took out (None without it; its unknown ids said)."""
    from uniagent.harbor.folders import exclude_tasks, load_task_set
    from uniagent.harbor.images import ImageBuilder

    deployment = dict(config.env.deployment)
    build = ImageBuilder(deployment.get("engine", "auto"), from_image=args.from_image)
    tasks, bad = load_task_set(args.data, deployment, build=build)
    if not args.exclude:
        return tasks, bad, None
    return exclude_tasks(args.exclude, tasks, bad)


def add_task_options(parser: Any) -> None:
    """``--exclude`` and ``--from-image``: options of ``uniagent run`` and ``uniagent verify``."""
    parser.add_argument(
        "--exclude",
        metavar="FILE",
        default=None,
        help="skip the task ids listed in FILE, one a line (what uniagent verify writes); "
        "the summary records them, and warns of ids that match no task",
    )
    parser.add_argument(
        "--from-image",
        metavar="IMAGE",
        default=None,
        help="Harbor tasks on the local backend: build each environment/Dockerfile FROM this "
        "image instead of its own (machines without a registry)",
    )


def cmd_verify(args: argparse.Namespace) -> int:
    """Run each task's oracle and no-op baseline; report broken and flaky tasks."""
    import asyncio
    from pathlib import Path

    from uniagent.config import AgentConfig
    from uniagent.resolver import resolve
    from uniagent.run.progress import Progress
    from uniagent.verify.check import EXCLUDED, verify_tasks
    from uniagent.verify.report import RECORDS, SUMMARY, format_verdicts, write_report

    config = AgentConfig.from_yaml(args.config)
    agent = resolve(config, source=args.config)
    if config.reward is None:
        raise ConfigError(f"{args.config}: uniagent verify needs a reward (reward: {{name: ...}})")
    tasks, bad_rows, exclusion = load_run_tasks(args, config)
    for bad in bad_rows:
        print(f"uniagent: task {bad.line} skipped: {bad.reason}", file=sys.stderr)
    if exclusion is not None and exclusion.warning():
        print(f"uniagent: warning: {exclusion.warning()}", file=sys.stderr)
    if args.limit is not None:
        tasks = tasks[: args.limit]
    progress = Progress.for_stream(verbose=False)
    verdicts = asyncio.run(
        verify_tasks(
            agent,
            tasks,
            k=args.k,
            concurrency=args.concurrency or config.concurrency,
            progress=progress,
        )
    )
    exclude = write_report(
        verdicts,
        Path(args.out),
        Path(args.write_exclude) if args.write_exclude else None,
        skipped=bad_rows,
        exclusion=exclusion,
    )
    print(format_verdicts(verdicts, skipped=bad_rows, exclusion=exclusion))
    print(
        f"records: {Path(args.out) / RECORDS}; summary: {Path(args.out) / SUMMARY}; "
        f"exclude list: {exclude}"
    )
    if bad_rows:
        return 2
    return 1 if any(v.status in EXCLUDED for v in verdicts) else 0


def add_verify_parser(sub: Any) -> None:
    """The ``uniagent verify`` sub-command."""
    verify = sub.add_parser(
        "verify",
        help="check a task set: each task's oracle must score 1, doing nothing 0",
        description="Run each task's oracle (a Harbor task's solution/solve.sh, a SWE-bench "
        "row's gold patch) and a no-op baseline through the config's sandbox and reward, k "
        "times each. Tasks whose oracle fails, whose baseline passes, or whose scores change "
        "between runs (flaky) are reported and written to an exclude list for "
        "`uniagent run --exclude`. See docs/tasks.md.",
        epilog="exit status: 0 every task is sound (or has no oracle); 1 some are broken or "
        "flaky; 2 bad input (config, task set, task folders skipped, task rows without a "
        "field the reward needs).",
    )
    verify.add_argument("config", help="agent config YAML (its env and reward)")
    verify.add_argument(
        "--data", required=True, help="tasks: .jsonl, .parquet, or Harbor task folder(s)"
    )
    verify.add_argument("--out", required=True, help="output directory (verify.jsonl)")
    verify.add_argument(
        "-k", type=positive, default=1, help="runs of each oracle and baseline (flaky: k > 1)"
    )
    verify.add_argument(
        "--concurrency", type=positive, default=None, help="tasks at once (default: config)"
    )
    verify.add_argument("--limit", type=positive, default=None, help="only the first M tasks")
    verify.add_argument(
        "--write-exclude",
        metavar="FILE",
        default=None,
        help="where the exclude list goes (default: OUT/exclude.txt)",
    )
    add_task_options(verify)
    verify.set_defaults(func=cmd_verify)


def cmd_view(args: argparse.Namespace) -> int:
    """Serve the read-only web viewer over run folders."""
    from pathlib import Path

    from uniagent.view import serve

    serve(
        [Path(p) for p in args.run_dirs],
        host=args.host,
        port=args.port,
        tokenizer=args.tokenizer,
        poll_interval=args.poll,
    )
    return 0


def add_view_parser(sub: Any) -> None:
    """The ``uniagent view`` sub-command."""
    view = sub.add_parser(
        "view",
        help="browse run folders in a local web app (live while a run goes on)",
        description="Serve a read-only web app over run folders written by `uniagent run` "
        "(or any folder of episode folders): the runs table, a summary, every episode's "
        "conversation, tokens and log, and an A/B comparison of two runs. "
        "Needs pip install 'uniagent[view]'.",
    )
    view.add_argument(
        "run_dirs",
        nargs="+",
        metavar="RUN_DIR",
        help="run folder(s); a folder holding run folders shows each of them",
    )
    view.add_argument(
        "--port", type=int, default=None, help="port (default 8765, or the next free one; 0: any)"
    )
    view.add_argument(
        "--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1: this machine)"
    )
    view.add_argument(
        "--tokenizer",
        default=None,
        metavar="PATH",
        help="tokenizer folder for the token view (default: the one the rollout names, "
        "if it loads from local files)",
    )
    view.add_argument(
        "--poll", type=float, default=0.5, help="seconds between checks for new results"
    )
    view.set_defaults(func=cmd_view)


def cmd_data_prepare(args: argparse.Namespace) -> int:
    """Turn a task set into the Parquet file verl trains on."""
    from uniagent.config import AgentConfig
    from uniagent.data import prepare

    config = AgentConfig.from_yaml(args.config) if args.config else None
    report = prepare(
        args.tasks,
        args.out,
        config=config,
        agent_name=args.agent_name,
        data_source=args.data_source,
        limit=args.limit,
    )
    for bad in report.bad_rows:
        print(f"uniagent: task {bad.line} skipped: {bad.reason}", file=sys.stderr)
    skipped = f"; skipped {len(report.bad_rows)} task rows" if report.bad_rows else ""
    print(f"wrote {report.rows} rows to {report.out}{skipped}")
    # As `uniagent run` and `uniagent verify`: a task set with unusable rows is bad input.
    return 2 if report.bad_rows else 0


def cmd_clean(args: argparse.Namespace) -> int:
    """Remove what killed runs left behind: each backend's sandboxes of dead owners."""
    from uniagent.env.host import HostDeploymentConfig
    from uniagent.registry import get_registry

    removed: list[str] = []
    for name, spec in get_registry().deployments().items():
        if spec.cleanup is None or (args.no_containers and name != "host"):
            continue
        config = HostDeploymentConfig(base_dir=args.base_dir) if name == "host" else None
        removed += spec.cleanup(config, [])
    for item in removed:
        print(f"removed {item}")
    if not removed:
        print("nothing to clean: no sandbox of a dead run found")
    return 0


def add_data_parser(sub: Any) -> None:
    """The ``uniagent data prepare`` sub-command."""
    data = sub.add_parser("data", help="prepare task sets for training")
    data_sub = data.add_subparsers(dest="data_command", metavar="ACTION", required=True)
    prepare = data_sub.add_parser(
        "prepare",
        help="write a task set as the Parquet file verl reads",
        description="Turn tasks (.jsonl or .parquet) into verl's Parquet columns: prompt "
        "(system + first user message from the agent config's templates), agent_name, "
        "data_source, reward_model, extra_info (index, task_id, tools_kwargs, task) and index.",
        epilog="exit status: 0 every task was written; 2 bad input (config, task set), or "
        "task rows or Harbor task folders skipped (named on stderr; the others are written), "
        "as for uniagent run and uniagent verify.",
    )
    prepare.add_argument("tasks", help="tasks: .jsonl, .parquet, or Harbor task folder(s)")
    prepare.add_argument("--out", required=True, help="output file (.parquet)")
    prepare.add_argument("--config", default=None, help="agent config YAML (prompt templates)")
    prepare.add_argument(
        "--agent-name", default="uniagent", help="agent-loop YAML entry name (default: uniagent)"
    )
    prepare.add_argument(
        "--data-source", default=None, help="data_source column (default: the task file's stem)"
    )
    prepare.add_argument("--limit", type=positive, default=None, help="only the first M tasks")
    prepare.set_defaults(func=cmd_data_prepare)


class Parser(argparse.ArgumentParser):
    """argparse with one-line errors (the usage block is in ``--help``)."""

    def error(self, message: str) -> NoReturn:
        """Print ``PROG: error: MESSAGE`` and exit 2."""
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def _number(kind: type, low: float, what: str) -> Any:
    def parse(text: str) -> Any:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"must be {what}, got {text}")
        return value

    parse.__name__ = kind.__name__
    return parse


positive = _number(int, 1, "at least 1")
non_negative = _number(int, 0, "0 or more")
non_negative_float = _number(float, 0.0, "0 or more")


def build_parser() -> argparse.ArgumentParser:
    """The argument parser with every sub-command."""
    parser = Parser(
        prog="uniagent",
        description="Build, run and train tool-using LLM agents.",
    )
    parser.add_argument("--version", action="version", version=f"uniagent {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=Parser)

    plugins = sub.add_parser("plugins", help="list installed plugins and what they provide")
    plugins.add_argument("--json", action="store_true", help="print JSON")
    plugins.add_argument("--all", action="store_true", help="include the built-in plugins")
    plugins.add_argument(
        "--config",
        metavar="CONFIG",
        default=None,
        help="also list the MCP servers' tools of this config (their names, servers and "
        "schemas), in one sandbox of its deployment",
    )
    plugins.set_defaults(func=cmd_plugins)

    run = sub.add_parser(
        "run",
        help="run an agent over a task set (resumable)",
        description="Run an agent over a task set. Re-running the same command resumes: "
        "(task, sample) pairs that ended with a policy outcome are skipped; infrastructure "
        "failures are run again.",
        epilog="exit status: 0 every episode ended with a policy outcome; 1 infrastructure "
        "failures remain, or the run stopped (model endpoint down, circuit breaker); 2 bad "
        "input (config, task file, option values, an output folder in use or holding another "
        "run, task rows without a field the reward needs), or task rows skipped;"
        " 130 / 143 interrupted by SIGINT / SIGTERM (sandboxes "
        "closed; run again to resume). See docs/running.md. "
        "A vLLM server returns tool calls only when started with --enable-auto-tool-choice "
        "--tool-call-parser P, P the format of the config's tool_parser (hermes for Qwen3, "
        "qwen3_coder for Qwen3-Coder), e.g. vllm serve Qwen/Qwen3-8B --enable-auto-tool-choice "
        "--tool-call-parser hermes.",
    )
    run.add_argument("config", help="agent config YAML")
    run.add_argument(
        "--data", required=True, help="tasks: .jsonl, .parquet, or Harbor task folder(s)"
    )
    add_task_options(run)
    run.add_argument(
        "--model",
        required=True,
        action="append",
        metavar="SPEC",
        help="hf:PATH (in-process transformers: a model folder, hub id ORG/NAME or .gguf file; "
        "hf:smollm2 is the bundled SmolLM2-135M test model; add ?guided=tool_call to make "
        "every turn a valid tool call, &thought=N for the longest thought before it) or "
        "openai:BASE_URL#MODEL (any OpenAI-compatible server, e.g. "
        "openai:http://127.0.0.1:8000/v1#Qwen/Qwen3-8B; add ?tokenizer=PATH_OR_ID to record "
        "token ids and log-probs from vLLM; a harness agent sends it token ids). Several "
        "--model openai: servers of one model (or @FILE, one spec a line): each episode is "
        "placed on one, least-loaded first; one that fails is taken out until it answers again",
    )
    run.add_argument("--out", required=True, help="output directory (results, episodes, summary)")
    run.add_argument(
        "--concurrency", type=positive, default=None, help="episodes at once (default: config)"
    )
    run.add_argument(
        "--warm",
        type=non_negative,
        default=None,
        metavar="N",
        help="sandboxes prepared ahead: N more episodes set up (and baseline) their sandboxes "
        "while the others run, then wait for a slot (default: config, 0)",
    )
    run.add_argument("--n", type=positive, default=1, help="samples per task (pass@k when > 1)")
    run.add_argument("--limit", type=positive, default=None, help="only the first M tasks")
    run.add_argument(
        "--retries",
        type=non_negative,
        default=2,
        help="tries again of an episode that failed for infrastructure reasons (default 2)",
    )
    run.add_argument(
        "--retry-delay",
        type=non_negative_float,
        default=10.0,
        metavar="SECONDS",
        help="wait before the first retry, doubled for each further one (default 10)",
    )
    run.add_argument(
        "--breaker",
        type=non_negative,
        default=None,
        metavar="N",
        help="stop when the first N attempts all fail the same infrastructure way "
        "(default: the concurrency, within 3..10; 0: never)",
    )
    run.add_argument(
        "--keep-failures",
        action="store_true",
        help="on resume, keep recorded infrastructure failures instead of running them again",
    )
    run.add_argument(
        "--force-resume",
        action="store_true",
        help="resume although the config, model or task file differ from the folder's manifest",
    )
    run.add_argument(
        "--agent",
        metavar="NAME",
        default=None,
        help="the agent, in place of the config's agent.name: react (the built-in loop) or a "
        "harness (mini-swe-agent, claude-code, codex, openhands with uniagent-agents-cli; "
        "`uniagent plugins` lists them); the config's agent.settings are dropped when it "
        "names another agent",
    )
    run.add_argument(
        "--api-key-env",
        metavar="NAME",
        default=None,
        help="openai: models: the environment variable holding the API key "
        "(default OPENAI_API_KEY)",
    )
    run.add_argument(
        "-v", "--verbose", action="store_true", help="stream every episode's log lines"
    )
    run.add_argument(
        "--ray", metavar="ADDRESS", default=None, help="run on Ray: an address or auto"
    )
    run.add_argument(
        "--workers",
        type=positive,
        default=None,
        help="with --ray: worker actors (default: cluster CPUs)",
    )
    run.set_defaults(func=cmd_run)
    add_verify_parser(sub)

    clean = sub.add_parser(
        "clean",
        help="remove sandboxes (host directories, cgroups, containers) of killed runs",
        description="Find sandboxes whose owning process is gone (a run killed with "
        "SIGKILL, a crashed machine session) and remove them: host sandboxes' processes are "
        "killed, their tmpfs unmounted, their directories and cgroups removed; `local` "
        "containers (labelled uniagent.owner by the process that started them, on this host) "
        "are removed with docker or podman. Sandboxes of running processes are never "
        "touched. `uniagent run` does this at start too.",
    )
    clean.add_argument(
        "--base-dir", default=None, help="the host deployment's base_dir (default: the temp dir)"
    )
    clean.add_argument(
        "--no-containers", action="store_true", help="leave containers alone (host only)"
    )
    clean.set_defaults(func=cmd_clean)

    add_data_parser(sub)
    add_view_parser(sub)
    add_gateway_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``uniagent`` console script."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    from uniagent.run.preflight import EndpointError
    from uniagent.run.shutdown import Interrupted

    try:
        return int(args.func(args) or 0)
    except Interrupted as exc:
        print(f"uniagent: {exc}", file=sys.stderr)
        return exc.exit_status
    except EndpointError as exc:  # infrastructure, not the user's input
        print(f"uniagent: error: {exc}", file=sys.stderr)
        return 1
    except UniAgentError as exc:
        print(f"uniagent: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("uniagent: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # e.g. `uniagent plugins --json | head`
        sys.stderr.close()
        return 0
    except OSError as exc:  # the machine's failure (a full disk, a lost mount), one line
        print(f"uniagent: error: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
