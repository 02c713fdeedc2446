"""``UniAgentLoop``: verl 0.9.1's ``AgentLoopBase`` running one uniagent episode per sample.

verl builds one loop object per sample (``hydra.utils.instantiate`` of the agent-loop YAML
entry, whose extra keys arrive as constructor kwargs) and awaits :meth:`UniAgentLoop.run`.
An episode: sandbox start → tools → interaction with ``VerlServerModel`` (one request id
per episode) → reward in the still-open sandbox → close, via
:func:`uniagent.episode.run_episode`, under a per-worker semaphore. Any failure becomes a
masked placeholder output, never an exception, so one bad episode never breaks a batch.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import threading
import weakref
from collections.abc import Mapping
from typing import Any, ClassVar

from verl.experimental.agent_loop.agent_loop import (
    AgentLoopBase,
    AgentLoopMetrics,
    AgentLoopOutput,
)

from uniagent.config import AgentConfig
from uniagent.episode import EpisodeResult, first_messages, run_episode
from uniagent.interaction.exit import ExitReason
from uniagent.models import VerlServerModel
from uniagent.plugins import load_plugins
from uniagent.services import ServiceStartError, check_task_services, ensure_services
from uniagent.verl.output import LoopFields, as_kwargs, episode_fields, placeholder_fields
from uniagent.verl.settings import (
    LoopSettings,
    base_config_dict,
    plain,
    row_messages,
    row_overrides,
    row_task,
)

log = logging.getLogger(__name__)

#: verl's sampling keys win over the agent config's ``sampling`` (e.g. greedy validation).
_VERL_SAMPLING_KEYS = frozenset({"temperature", "top_p", "top_k", "repetition_penalty", "logprobs"})


class UniAgentLoop(AgentLoopBase):
    """Runs a uniagent episode (sandbox, tools, ReAct loop, reward) for one verl sample."""

    _configs: ClassVar[dict[str, AgentConfig]] = {}
    _last_global_steps: ClassVar[int | None] = None
    _configs_lock: ClassVar[threading.Lock] = threading.Lock()
    _semaphores: ClassVar[
        weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[int, asyncio.Semaphore]]
    ] = weakref.WeakKeyDictionary()

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        """Take verl's arguments; the agent-loop YAML entry's other keys configure the agent."""
        base = {
            k: kwargs.pop(k)
            for k in ("trainer_config", "server_manager", "tokenizer", "processor",
                      "dataset_cls", "data_config", "hf_model_type")
            if k in kwargs
        }
        kwargs.pop("tools", None)  # verl's own tool list: uniagent's tools come from plugins
        self.loop_name = str(kwargs.pop("name", "uniagent"))
        super().__init__(*args, **base)
        load_plugins()
        self.settings = LoopSettings.from_trainer_config(self.config)
        self.agent_config = self._base_config(kwargs)

    def _base_config(self, loop_kwargs: Mapping[str, Any]) -> AgentConfig:
        """The validated base config, read once per process for identical YAML entries
        (verl builds a loop object per sample; the agent YAML is not re-read each time)."""
        key = json.dumps(
            [self.loop_name, plain(dict(loop_kwargs)), self.settings.config_defaults(),
             self.settings.agent_loop_config_path, os.getcwd()],
            sort_keys=True, default=str,
        )
        with self._configs_lock:
            config = self._configs.get(key)
            if config is None:
                data = base_config_dict(self.settings, loop_kwargs)
                config = AgentConfig.from_dict(data, source=f"agent loop {self.loop_name!r}")
                self._configs[key] = config
        return config

    # -- concurrency -------------------------------------------------------------------
    @property
    def per_worker_concurrency(self) -> int:
        """``concurrency // num_workers`` (at least 1): episodes at once in this worker."""
        return max(1, self.agent_config.concurrency // self.settings.num_workers)

    def semaphore(self) -> asyncio.Semaphore:
        """The worker-wide semaphore, created lazily on the running event loop."""
        loop = asyncio.get_running_loop()
        limit = self.per_worker_concurrency
        by_limit = self._semaphores.setdefault(loop, {})
        if limit not in by_limit:
            by_limit[limit] = asyncio.Semaphore(limit)
        return by_limit[limit]

    # -- one sample ---------------------------------------------------------------------
    async def run(self, sampling_params: dict[str, Any], **kwargs: Any) -> AgentLoopOutput:
        """Run the episode of one dataset row; failures give a masked placeholder output."""
        want_logprobs = bool(sampling_params.get("logprobs", self.settings.calculate_log_probs))
        messages: list[dict[str, Any]] | None = None
        server = ServerLog(self.server_manager)
        try:
            config = self.agent_config.with_overrides(row_overrides(kwargs), source="tools_kwargs")
            check_task_services(self.agent_config, config, "tools_kwargs")
            task = row_task(kwargs)
            messages = row_messages(kwargs) or first_messages(config, task)
            try:
                await ensure_services(self.agent_config)  # once per worker process
            except ServiceStartError as exc:  # infrastructure: masked, never a policy failure
                log.error("%s", exc)
                fields = self._placeholder(
                    messages, want_logprobs, exit_reason=ExitReason.ENV_ERROR, error=str(exc)
                )
                self._stamp(fields, server, kwargs)
                return _output(fields)
            model = VerlServerModel(
                server,
                self.tokenizer,
                self._sampling(config, sampling_params),
                max_model_len=self.settings.context_length,
                response_length=self.settings.response_length,
                chat_template_kwargs=self.settings.chat_template_kwargs,
            )
            async with self.semaphore():
                result = await run_episode(config, task, model, messages=messages, logger=log)
            if result.cache is None:  # failed before the first turn (e.g. the sandbox)
                fields = self._placeholder(
                    messages, want_logprobs, exit_reason=result.exit_reason,
                    error=result.error, result=result,
                )
            else:
                fields = episode_fields(
                    result,
                    prompt_length=self.settings.prompt_length,
                    response_length=self.settings.response_length,
                    want_logprobs=want_logprobs,
                    reward_configured=config.reward is not None,
                    end_token_id=self._end_token_id(),
                    num_prompt_messages=len(messages),
                )
        except Exception as exc:  # one bad episode must not break the batch
            log.exception("uniagent episode failed; returning a masked placeholder")
            fields = self._placeholder(
                messages, want_logprobs, error=f"{type(exc).__name__}: {exc}"
            )
        self._stamp(fields, server, kwargs)
        return _output(fields)

    def _stamp(self, fields: LoopFields, server: ServerLog, kwargs: Mapping[str, Any]) -> None:
        """Weight versions and preemptions, as verl's own tool loop reports them.

        verl's trainers read ``min_global_steps`` / ``max_global_steps`` as integers (the
        weight versions the episode was generated with); an episode without a generation
        gets the latest version this worker saw, else the row's ``global_steps``, else 0.
        """
        if server.max_steps is not None:
            UniAgentLoop._last_global_steps = server.max_steps
        fallback = UniAgentLoop._last_global_steps
        if fallback is None:
            fallback = _as_int(kwargs.get("global_steps"), 0)
        low = server.min_steps if server.min_steps is not None else fallback
        high = server.max_steps if server.max_steps is not None else fallback
        fields.extra_fields["min_global_steps"] = low
        fields.extra_fields["max_global_steps"] = high
        fields.metrics["num_preempted"] = (
            server.num_preempted if server.num_preempted is not None else -1
        )

    def _sampling(self, config: AgentConfig, sampling_params: Mapping[str, Any]) -> dict[str, Any]:
        extra = {k: v for k, v in config.sampling.items() if k not in _VERL_SAMPLING_KEYS}
        return {**plain(extra), **dict(sampling_params)}

    def _end_token_id(self) -> int:
        for candidate in (
            getattr(self.tokenizer, "eos_token_id", None),
            getattr(self.tokenizer, "pad_token_id", None),
        ):
            if isinstance(candidate, int):
                return candidate
        return 0

    def _placeholder(
        self,
        messages: list[dict[str, Any]] | None,
        want_logprobs: bool,
        *,
        exit_reason: ExitReason = ExitReason.UNKNOWN_ERROR,
        error: str | None = None,
        result: EpisodeResult | None = None,
    ) -> LoopFields:
        """A masked stand-in whose prompt is the row's prompt (without tool schemas)."""
        prompt_ids: list[int] = []
        tokenizer: Any = self.tokenizer
        if messages:
            try:
                prompt_ids = list(
                    tokenizer.apply_chat_template(
                        messages,
                        add_generation_prompt=True,
                        tokenize=True,
                        return_dict=False,
                        **self.settings.chat_template_kwargs,
                    )
                )
            except Exception:  # the placeholder must not fail
                prompt_ids = []
        return placeholder_fields(
            prompt_ids=prompt_ids or [self._end_token_id()],
            prompt_length=self.settings.prompt_length,
            want_logprobs=want_logprobs,
            reward_configured=self.agent_config.reward is not None,
            end_token_id=self._end_token_id(),
            exit_reason=exit_reason,
            error=error,
            result=result,
        )


def _output(fields: LoopFields) -> AgentLoopOutput:
    kwargs = dict(as_kwargs(fields))
    metrics = kwargs.pop("metrics")
    return AgentLoopOutput(metrics=AgentLoopMetrics(**metrics), **kwargs)


def episode_to_output(
    result: EpisodeResult,
    *,
    prompt_length: int,
    response_length: int,
    want_logprobs: bool,
    reward_configured: bool,
    end_token_id: int,
) -> AgentLoopOutput:
    """An ``AgentLoopOutput`` for an episode run elsewhere (e.g. a custom verl loop)."""
    return _output(
        episode_fields(
            result,
            prompt_length=prompt_length,
            response_length=response_length,
            want_logprobs=want_logprobs,
            reward_configured=reward_configured,
            end_token_id=end_token_id,
        )
    )


class ServerLog:
    """Wraps verl's server client to note what each generation reports (versions, preemptions)."""

    def __init__(self, server: Any) -> None:
        self.server = server
        self.min_steps: int | None = None
        self.max_steps: int | None = None
        self.num_preempted: int | None = None

    async def generate(self, request_id: str, **kwargs: Any) -> Any:
        """verl's ``generate``, passed through."""
        out = await self.server.generate(request_id, **kwargs)
        extra = getattr(out, "extra_fields", None) or {}
        low = _as_int(extra.get("min_global_steps", extra.get("global_steps")), None)
        high = _as_int(extra.get("max_global_steps", extra.get("global_steps")), None)
        if self.min_steps is None and low is not None:
            self.min_steps = low
        if high is not None:
            self.max_steps = high
        preempted = getattr(out, "num_preempted", None)
        if preempted is not None:
            self.num_preempted = (self.num_preempted or 0) + int(preempted)
        return out


def _as_int(value: Any, default: int | None) -> int | None:
    try:
        return default if value is None else int(value)
    except (TypeError, ValueError):
        return default
