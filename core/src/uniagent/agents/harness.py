"""One harness run in an episode's sandbox: a gateway session, the command, the tree.

The harness runs in the agent's own shell session (same sandbox, same user, same limits as
the built-in loop's commands), with the session's base URL and key. How it ended maps to
an exit reason: its own exit (0, or not) and its time limit are the policy's; the gateway's
token backend failing under it is infrastructure (``model_error``, masked). A task's time
limit (``interaction.time_limit``, a Harbor task's ``[agent] timeout_sec``) counts the
harness's own time only: its run's time less the time the gateway waited for the model.

In a ``local`` container the install folder is mounted read-only at the same path and the
gateway is also served on the container network's address of this machine (to that
network only); :func:`check_sandbox` says what the image lacks (a pip harness's Python, a
node script's node, a native executable's loader) before the harness starts.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import shlex
import time
import urllib.parse
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from uniagent.agent_run import AgentRun, EpisodeContext
from uniagent.agents.gateways import gateway_for, open_session
from uniagent.agents.install import (
    bin_folder,
    ensure_installed,
    python_home,
    sandbox_probe,
    sandbox_problems,
)
from uniagent.env.agent_env import AgentEnv
from uniagent.env.aio import wait_for
from uniagent.env.errors import (
    ActionTimeoutError,
    EnvStartError,
    ShellKilledError,
    TerminalNotAliveError,
)
from uniagent.errors import ConfigError
from uniagent.exit import ExitReason
from uniagent.interaction.metrics import EpisodeMetrics
from uniagent.interaction.prompts import instruction_of
from uniagent.resolver import ResolvedAgent
from uniagent.rollout import Rollout
from uniagent.specs import AgentLaunch

#: Characters of the harness's output (and of each of its logs) kept in the episode log.
LOG_TAIL = 20_000
#: Seconds a killed harness's command gets to return before its action times out.
KILL_GRACE = 60.0


@dataclass
class HarnessRun:
    """What one harness run produced."""

    exit_reason: ExitReason
    tree: dict[str, Any] | None = None
    session: dict[str, Any] = field(default_factory=dict)
    cache: Rollout | None = None
    submission: str | None = None
    error: str | None = None
    inexact_turns: int = 0
    turns: int = 0
    #: Seconds the gateway waited for the model (overlapping requests counted once).
    model_seconds: float = 0.0


class HarnessAgent:
    """:class:`~uniagent.agent_run.EpisodeAgent` of a harness (an agent record with an
    ``install``, ``wire`` and ``launch``): the harness installed once on this machine and
    mounted read-only into the episode's sandbox, checked there, then run through a gateway
    session. A model the gateway cannot serve, or a task missing a field of the
    instruction's template, fails when it is made, before any sandbox starts."""

    def __init__(self, context: EpisodeContext) -> None:
        self.context = context
        agent = context.agent
        self.instruction = instruction_of(agent, context.task, context.messages)
        gateway_for(context.model, agent.parser)  # a model it cannot serve
        self.folder: Path | None = None

    async def new_env(self) -> AgentEnv:
        """A sandbox of the agent's backend that sees the harness's install folder."""
        agent = self.context.agent
        self.folder = await asyncio.to_thread(prepare, agent)
        return AgentEnv(agent.deployment.factory(with_install(agent, self.folder)), agent.env)

    async def setup(self, env: AgentEnv) -> None:
        """What the image lacks to run the harness, said before it runs; the tools."""
        agent = self.context.agent
        assert self.folder is not None, "setup() before new_env()"
        await check_sandbox(agent, env, self.folder)
        await env.install_tools(list(agent.tools))

    async def run(self, env: AgentEnv, metrics: EpisodeMetrics) -> AgentRun:
        context = self.context
        assert self.folder is not None, "run() before new_env()"
        began = time.perf_counter()
        run = await run_harness(
            context.agent, env, self.instruction, context.model, self.folder, context.logger
        )
        # The model's time is the gateway's; the rest of the run is the harness's own.
        metrics.model_seconds = run.model_seconds
        metrics.env_seconds = max(0.0, time.perf_counter() - began - run.model_seconds)
        metrics.turns, metrics.inexact_turns = run.turns, run.inexact_turns
        return AgentRun(
            exit_reason=run.exit_reason,
            cache=run.cache,
            submission=run.submission,
            error=run.error,
            tree=run.tree,
        )


def prepare(agent: ResolvedAgent) -> Path:
    """Install the harness (cached) and return the folder the sandbox must see."""
    assert agent.agent.install is not None
    return ensure_installed(agent.agent.install)


def with_install(agent: ResolvedAgent, folder: Path) -> Any:
    """The agent's deployment config with the harness's folder visible read-only at the
    same path: a bubblewrap ``ro_binds`` entry, or a container's ``-v DIR:DIR:ro``."""
    config = agent.deployment_config
    kind = getattr(config, "type", None)
    if kind == "local":
        volume = f"{folder}:{folder}:ro"
        args = list(config.run_args)  # type: ignore[attr-defined]
        return config.model_copy(update={"run_args": [*args, "-v", volume]})
    if kind != "host":
        raise ConfigError(f"agent {agent.agent.name!r}: no way to mount its install in {kind!r}")
    binds = list(getattr(config, "ro_binds", []))
    home = python_home(folder)  # a pip harness's interpreter, when not the system's
    for path in (folder, *([home] if home is not None else [])):
        if str(path) not in binds:
            binds.append(str(path))
    return config.model_copy(update={"ro_binds": binds})


async def check_sandbox(agent: ResolvedAgent, env: AgentEnv, folder: Path) -> None:
    """An :class:`EnvStartError` naming what the sandbox lacks to run the harness (its
    command at the mounted folder, a pip harness's Python, a node script's node, a native
    executable's loader; a container network to serve the gateway on), asked as the agent,
    before the harness starts."""
    install = agent.agent.install
    assert install is not None
    await gateway_address(agent)  # a container network the gateway cannot be served on
    obs = await env.run_action(sandbox_probe(install, folder), timeout=60)
    problems = sandbox_problems(install, folder, obs.output)
    if problems:
        raise EnvStartError(
            f"agent {agent.agent.name!r} cannot run in this sandbox: " + "; ".join(problems)
        )


class _Unreachable(Exception):
    """The sandbox cannot open a connection to the gateway's address."""


async def _reach_gateway(env: AgentEnv, base_url: str) -> None:
    """Open a TCP connection to the gateway from inside the sandbox (bash's ``/dev/tcp``),
    as the agent, before the harness starts: a container that cannot reach it (a rootless
    engine's user-mode network, a firewall) is infrastructure, never the policy's failure."""
    url = urllib.parse.urlsplit(base_url)
    host, port = url.hostname or "", url.port or 80
    probe = f"(exec 3<>/dev/tcp/{host}/{port}) 2>&1 && echo uniagent-gateway-reached"
    try:
        obs = await env.run_action(f"bash -c {shlex.quote(probe)}", timeout=30)
    except ActionTimeoutError:
        obs = None
    if obs is None or "uniagent-gateway-reached" not in obs.output:
        said = "" if obs is None else f": {obs.output.strip()[-300:]}"
        raise _Unreachable(
            f"the sandbox cannot reach the gateway at {host}:{port} (the container network's "
            f"address on this machine){said}"
        )


async def gateway_address(agent: ResolvedAgent) -> tuple[str, str] | None:
    """Where a container reaches the gateway: ``(address, network)``; ``None`` for a
    sandbox on this machine's network (the gateway's 127.0.0.1)."""
    config = agent.deployment_config
    if getattr(config, "type", None) != "local":
        return None
    from uniagent.env.local import host_address

    address, network = await host_address(config)  # type: ignore[arg-type]
    return None if address == "127.0.0.1" else (address, network)


async def run_harness(
    agent: ResolvedAgent,
    env: AgentEnv,
    instruction: str,
    model: Any,
    folder: Path,
    logger: logging.Logger,
) -> HarnessRun:
    """Run the harness once in ``env``, through a new gateway session; never raises for the
    harness's own failure (an exit reason), only for the gateway's set-up."""
    spec, settings = agent.agent, agent.agent_settings
    assert spec.launch is not None and spec.install is not None
    listen = await gateway_address(agent)
    running, session = open_session(model, agent.parser, listen)
    home = f"/tmp/uniagent-agent-{uuid.uuid4().hex[:12]}"
    launch = AgentLaunch(
        base_url=running.base_url(session),
        api_key=session.key,
        instruction=instruction,
        workdir=env.workdir or ".",
        home=home,
        bin=str(bin_folder(spec.install, folder)),
    )
    command = spec.launch(launch, settings)
    limit = agent.config.interaction.time_limit
    reason: ExitReason
    submission = error = None
    try:
        if listen is not None:  # before the first model call: the policy has not acted yet
            await _reach_gateway(env, launch.base_url)
        await env.run_action(f"mkdir -p {shlex.quote(home)}", timeout=60)
        for path, text in command.files.items():
            where = path if path.startswith("/") else f"{home}/{path}"
            await env.run_action(f"mkdir -p {shlex.quote(str(Path(where).parent))}", timeout=60)
            await env.write_file(where, text)
        exports = {"HOME": home, **command.env}
        line = " ".join(f"{k}={shlex.quote(v)}" for k, v in exports.items())
        logger.info("agent %s: %s", spec.name, command.command[:500])
        # A subshell: the harness's variables and directory never stay in the agent's session.
        action = f"(export {line}; {command.command})"
        obs, ended_by = await _run_within(env, action, command.timeout, limit, session, logger)
        if obs is not None:
            logger.info("agent %s exited %s; its output:\n%s", spec.name, obs.exit_code,
                        obs.output[-LOG_TAIL:])  # fmt: skip
        if ended_by is None:
            outcome = spec.outcome(obs.exit_code, obs.output, settings)
            reason, submission = ExitReason(outcome.exit_reason), outcome.submission
        else:
            reason, error = ExitReason.TIMEOUT_ERROR, ended_by
            logger.info("agent %s: %s", spec.name, error)
    except _Unreachable as exc:  # infrastructure: the container's network
        reason, error = ExitReason.ENV_ERROR, str(exc)
        logger.error("agent %s: %s", spec.name, error)
    except ActionTimeoutError as exc:
        reason, error = ExitReason.TIMEOUT_ERROR, f"the harness ran past its {command.timeout:g} s"
        logger.info("agent %s: %s (%s)", spec.name, error, exc)
    except ShellKilledError as exc:
        reason, error = ExitReason.AGENT_KILLED_SHELL, str(exc)
    except TerminalNotAliveError as exc:
        reason, error = ExitReason.TERMINAL_NOT_ALIVE, str(exc)
    finally:
        closed = running.gateway.close(session.id)
        running.gateway.forget(session.id)
    await _log_files(env, spec.logs, home, logger)
    with contextlib.suppress(Exception):  # without isolation, /tmp is this machine's
        await env.execute(["rm", "-rf", home], env=None, timeout=60)
    failures = list(session.backend_errors)
    if failures:  # the model behind the gateway failed: not the policy's doing
        reason = ExitReason.MODEL_ERROR
        error = f"the token backend failed under the harness: {failures[0]}"
    elif session.limit_errors and reason not in (
        ExitReason.AGENT_KILLED_SHELL,
        ExitReason.FINISHED,  # it compacted its history after the refusal and went on
        ExitReason.ENV_ERROR,
    ):
        # its history outgrew the model's context: the policy's end, whatever the harness
        # made of the refusal (most give up and exit non-zero)
        reason = ExitReason.TOKEN_LIMIT
        error = f"the harness's prompt outgrew the model's context: {session.limit_errors[0]}"
    tree = closed["tree"]
    turns = tree["turns"]
    return HarnessRun(
        exit_reason=reason,
        tree=tree,
        session=closed["session"],
        cache=main_branch(session, tree),
        submission=submission,
        error=error,
        inexact_turns=sum(1 for t in turns if t.get("exact") is False),
        turns=len(turns),
        model_seconds=session.model_seconds,
    )


async def _run_within(
    env: AgentEnv,
    action: str,
    timeout: float,
    limit: float | None,
    session: Any,
    logger: logging.Logger,
) -> tuple[Any, str | None]:
    """Run ``action`` with a limit on the harness's own time: the run's time less the time
    it waited for the model (``session.waited()``, the gateway's). Past ``limit`` (or
    ``timeout`` of wall time, its own setting), or once the token backend failed under it
    (the episode is infrastructure then, whatever the harness does next: its own retries
    would only wait on a model that is gone), the agent's session and every process in it
    are ended, as before grading. The observation (``None`` when it was ended), and why it
    was ended (``None``: it ended by itself)."""
    began = time.perf_counter()
    run = asyncio.ensure_future(env.run_action(action, timeout=timeout + KILL_GRACE))
    loop = asyncio.get_running_loop()
    failed = asyncio.Event()
    stop_listening = session.on_backend_failure(
        lambda _reason: loop.call_soon_threadsafe(failed.set)
    )
    why = None
    try:
        while not run.done():
            now = time.perf_counter() - began
            own = now - session.waited()
            if session.backend_errors:
                why = f"the token backend failed under the harness: {session.backend_errors[0]}"
            elif now >= timeout:
                why = f"the harness ran past its {timeout:g} s"
            elif limit is not None and own >= limit:
                why = (
                    f"the harness ran past the task's time limit ({limit:g} s of its own "
                    f"time; {session.waited():.1f} s waiting for the model not counted)"
                )
            if why is not None:
                break
            # At least this long before either limit can be reached (model time only
            # adds), or until the backend fails.
            left = timeout - now if limit is None else min(timeout - now, limit - own)
            failure = asyncio.ensure_future(failed.wait())
            await asyncio.wait({run, failure}, timeout=max(left, 0.05),
                               return_when=asyncio.FIRST_COMPLETED)  # fmt: skip
            failure.cancel()
    finally:
        stop_listening()
    if why is None:
        return await run, None
    logger.info("%s: ending the agent's session and its processes", why)
    try:
        await env.stop_agent()
    except Exception as exc:  # the action's own time-out still ends it
        logger.warning("could not end the agent's processes: %s", exc)
    try:
        await wait_for(run, KILL_GRACE)
    except Exception as exc:  # its shell was closed under it: expected
        logger.info("the ended harness's command: %s: %s", type(exc).__name__, exc)
    return None, why


async def _log_files(
    env: AgentEnv, logs: tuple[str, ...], home: str, logger: logging.Logger
) -> None:
    for path in logs:
        where = path if path.startswith("/") else f"{home}/{path}"
        try:
            text = await env.read_file(where)
        except Exception as exc:  # the harness may not have written it
            logger.info("agent log %s: not read (%s)", where, exc)
            continue
        logger.info("agent log %s:\n%s", where, text[-LOG_TAIL:])


def main_branch(session: Any, tree: dict[str, Any]) -> Rollout | None:
    """The tree's last-served branch as a token rollout (what readers of a linear episode
    read); ``None`` before the first turn. Its messages are the branch's last request and
    the reply; its ids, mask and log-probs are the branch's, exactly."""
    from uniagent.rollout.cache import FORMAT, FORMAT_VERSION
    from uniagent.rollout.exactness import ids_checksum
    from uniagent.rollout.template import decode

    live = session.tree
    if not live.turns:
        return None
    last = live.turns[-1]
    end = live.end_of(last)
    ids, mask, logprobs = live.context(end)
    turns = [t for node in end.path() for t in node.turns]
    first = turns[0]
    marks: list[list[int]] = []
    crc, prev = 0, 0
    for turn in turns:
        here = turn.prompt_len + turn.generated
        crc = ids_checksum(ids, prev, here, crc)
        marks.append([here, crc])
        prev = here
    reply = decode(session.tokenizer, ids[last.prompt_len :])
    eot = session.analysis.eot_id
    reply = reply.removesuffix(session.tokenizer.decode([eot])) if ids[-1] == eot else reply
    messages = [*last.messages, {"role": "assistant", "content": reply}]
    p = first.prompt_len
    snapshot = {
        "format": FORMAT,
        "version": FORMAT_VERSION,
        "mode": "tokens",
        "tokenizer": str(getattr(session.tokenizer, "name_or_path", "")) or None,
        "eot_id": eot,
        "tools": last.tools,
        "chat_template_kwargs": dict(session.kwargs),
        "messages": messages,
        "num_prompt_messages": len(first.messages),
        "num_turns": len(turns),
        "prompt_ids": ids[:p],
        "response_ids": ids[p:],
        "response_mask": mask[p:],
        "response_logprobs": logprobs[p:],
        "has_logprobs": True,
        "turn_marks": marks,
        "state": {
            "last": "generated",
            "open_turn": ids[-1] != eot,
            "segment_start": len(ids),
            "segment_msg_start": len(messages),
            "turn_start": last.prompt_len,
        },
    }
    return Rollout.from_dict(snapshot, session.tokenizer)
