"""Checks before the first sandbox starts: can the model endpoint be used at all, can
the reward grade every task?

An endpoint that is down or refuses the API key would fail every episode, each
after its sandbox has started; one request first (``GET /models``) tells at
once. A server without that route (404, 405), or a key that may chat but not list
models (403), passes: the episodes will tell. A task row without a field the reward
declares it needs (``RewardSpec.task_fields``) would run its whole episode and then
fail grading as infrastructure, again at every retry: it is refused first.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from typing import Any

from uniagent.env.aio import wait_for
from uniagent.errors import ConfigError, UniAgentError

PROBE_TIMEOUT = 30.0


class EndpointError(UniAgentError):
    """The model endpoint cannot be used (infrastructure: the run stops, status 1)."""


async def check_model(model: Any, *, timeout: float = PROBE_TIMEOUT) -> None:
    """Raise if ``model`` is an OpenAI-compatible endpoint that is down or refuses the key.

    :class:`EndpointError` when the server cannot be reached or fails;
    :class:`ConfigError` when it refuses the credentials (401).
    """
    from uniagent.models.openai_chat import OpenAIChatModel
    from uniagent.models.pool import ModelPool
    from uniagent.models.served import ServedTokenModel

    if isinstance(model, ModelPool):  # every server answers at the start
        for server in model.servers:
            await check_model(server.model, timeout=timeout)
        return
    if isinstance(model, ServedTokenModel):  # a harness's served model: the same endpoint
        model = model.chat
    if not isinstance(model, OpenAIChatModel):
        return
    from uniagent.models import http

    where = model.where  # no credentials in the message
    try:
        await wait_for(model.list_models(), timeout)
    except http.AuthenticationError as exc:
        raise ConfigError(
            f"the model endpoint {where} refused the API key ({exc.status_code}: "
            f"{_message(exc)}); set OPENAI_API_KEY, or name the variable that holds the key "
            "with --api-key-env"
        ) from None
    except http.APIStatusError as exc:
        # No model list on this server, or a key without the permission to list models
        # (a restricted key may still chat: 403): not a reason to stop, the episodes tell.
        if exc.status_code in (403, 404, 405, 501):
            return
        raise EndpointError(
            f"the model endpoint {where} fails ({exc.status_code}: {_message(exc)}); "
            "no episode was started"
        ) from None
    except (http.APIConnectionError, asyncio.TimeoutError) as exc:
        timed_out = isinstance(exc, asyncio.TimeoutError)
        cause = f"no answer within {timeout:g} s" if timed_out else _message(exc)
        raise EndpointError(
            f"cannot reach the model endpoint {where} ({cause}); is the server running? "
            "No episode was started"
        ) from None


def _message(exc: BaseException) -> str:
    body = getattr(exc, "body", None)
    if isinstance(body, dict) and body.get("message"):
        text = str(body["message"])
    else:
        cause = exc.__cause__ or exc.__context__
        text = f"{exc}" + (f": {cause}" if cause is not None and str(cause) not in str(exc) else "")
    text = " ".join(text.split())
    return text if len(text) <= 200 else text[:197] + "..."


def grading_warnings(agent: Any) -> list[str]:
    """What ``uniagent run`` says once before grading where the sandbox is no boundary: a
    reward graded under ``isolation: none`` as root (the agent can leave the sandbox's
    cgroup and change anything the grader reads)."""
    import os

    reward = getattr(agent, "reward", None)
    deployment = getattr(agent, "deployment_config", None)
    if reward is None or not reward.spec.uses_sandbox:
        return []
    if (
        getattr(deployment, "type", None) != "host"
        or getattr(deployment, "isolation", "") != ("none")
        or os.geteuid() != 0
    ):
        return []
    return [
        "the reward is graded under isolation: none as root: that is no boundary (the agent "
        "can leave the sandbox's cgroup and rewrite what the grader reads while it grades); "
        "use isolation: bwrap or a container for training (see docs/rewards.md)"
    ]


#: Task ids a message names before it says how many more there are.
NAMED = 10


def check_task_fields(agent: Any, tasks: Iterable[Any]) -> None:
    """Raise :class:`ConfigError` naming the tasks whose rows lack a field the reward needs
    (absent, null or empty); a task's own reward overrides (``config_overrides``) count."""
    lacking: dict[tuple[str, str], list[str]] = {}
    for task in tasks:
        reward = agent.reward
        try:
            overrides = task.overrides()
            if "reward" in overrides:  # only then can the task's reward differ from the config's
                source = f"task {task.id}: config_overrides"
                reward = agent.for_task(overrides, source=source).reward
        except ConfigError:
            continue  # overrides that do not resolve: the task's own error, when it runs
        if reward is None or reward.spec.task_fields is None:
            continue
        for name in reward.spec.task_fields(reward.settings):
            if task.row.get(name) in (None, ""):
                lacking.setdefault((reward.spec.name, name), []).append(task.id)
    if not lacking:
        return
    lines = []
    for (reward_name, name), ids in lacking.items():
        more = f" and {len(ids) - NAMED} more" if len(ids) > NAMED else ""
        lines.append(
            f"the reward {reward_name!r} grades with each task's {name!r} field, which "
            f"{len(ids)} task(s) lack: {', '.join(ids[:NAMED])}{more}"
        )
    raise ConfigError(
        "; ".join(lines) + ". Give those rows the field, or change reward.settings "
        "(docs/rewards.md); no episode was started"
    )
