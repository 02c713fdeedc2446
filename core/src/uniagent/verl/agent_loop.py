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
from uniagent.episode import EpisodeResult, first_messages, run_episode, worker_slots
from uniagent.errors import ConfigError
from uniagent.exit import ExitReason
from uniagent.interaction.metrics import EpisodeMetrics
from uniagent.models import VerlServerModel
from uniagent.plugins import load_plugins
from uniagent.registry import get_registry
from uniagent.resolver import ResolvedAgent, resolve
from uniagent.services import ServiceStartError, ensure_services
from uniagent.verl.advantage import ESTIMATOR_NAME, TREE_ESTIMATOR_NAME
from uniagent.verl.branches import TreeSettings, branch_samples, worker_takes_lists
from uniagent.verl.dumps import DumpSettings, EpisodeDump
from uniagent.verl.output import (
    EXTRA_FIELD_KEYS,
    UNIAGENT_KEY,
    LoopFields,
    as_kwargs,
    branch_fields,
    episode_fields,
    extras_record,
    placeholder_fields,
)
from uniagent.verl.settings import (
    LoopSettings,
    _select,
    base_config_dict,
    plain,
    row_messages,
    row_overrides,
    row_task,
    row_task_id,
)
from uniagent.verl.tree_advantage import leaf_advantages, tree_token_scores

log = logging.getLogger(__name__)

#: verl's sampling keys win over the agent config's ``sampling`` (e.g. greedy validation).
_VERL_SAMPLING_KEYS = frozenset({"temperature", "top_p", "top_k", "repetition_penalty", "logprobs"})
#: Server extra fields verl's own loops sum over an episode's generations (speculative decoding).
_SUMMED_SERVER_KEYS = ("spec_num_draft_tokens", "spec_num_accepted_tokens", "spec_num_verify_steps")


class UniAgentLoop(AgentLoopBase):
    """Runs a uniagent episode (sandbox, tools, ReAct loop, reward) for one verl sample."""

    _agents: ClassVar[dict[str, ResolvedAgent]] = {}
    _last_global_steps: ClassVar[int | None] = None
    #: Extra-field keys the server's replies carried in this process: a placeholder without
    #: a generation gets them as None, so its chunk has the keys verl's own loops' chunks have.
    _server_keys: ClassVar[set[str]] = set()
    _configs_lock: ClassVar[threading.Lock] = threading.Lock()
    _semaphores: ClassVar[
        weakref.WeakKeyDictionary[
            asyncio.AbstractEventLoop, dict[tuple[str, int], asyncio.Semaphore]
        ]
    ] = weakref.WeakKeyDictionary()

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        """Take verl's arguments; the agent-loop YAML entry's other keys configure the agent."""
        base = {
            k: kwargs.pop(k)
            for k in (
                "trainer_config",
                "server_manager",
                "tokenizer",
                "processor",
                "dataset_cls",
                "data_config",
                "hf_model_type",
            )
            if k in kwargs
        }
        kwargs.pop("tools", None)  # verl's own tool list: uniagent's tools come from plugins
        self.loop_name = str(kwargs.pop("name", "uniagent"))
        super().__init__(*args, **base)
        load_plugins()
        self.settings = LoopSettings.from_trainer_config(self.config)
        self.dumps = DumpSettings.pop_from(kwargs, source=f"agent loop {self.loop_name!r}")
        self.tree = TreeSettings.pop_from(kwargs, source=f"agent loop {self.loop_name!r}")
        self.agent = self._base_agent(kwargs)
        self.agent_config = self.agent.config
        self._check_tree_settings()

    def _check_tree_settings(self) -> None:
        """Tree rollouts (``interaction.branching``) and ``tree_advantage`` against the
        trainer's advantage estimator: a combination that would train wrongly is refused."""
        source = f"agent loop {self.loop_name!r}"
        branching = self.agent_config.interaction.branching
        tree_rollouts = branching is not None and branching.enabled
        estimator = str(_select(self.config, "algorithm.adv_estimator", "") or "")
        reward = self.agent_config.reward
        if self.tree.tree_advantage == "tree":
            if not tree_rollouts:
                raise ConfigError(
                    f"{source}: tree_advantage: tree needs tree rollouts (interaction.branching)"
                )
            if estimator != TREE_ESTIMATOR_NAME:
                raise ConfigError(
                    f"{source}: tree_advantage: tree needs algorithm.adv_estimator="
                    f"{TREE_ESTIMATOR_NAME}, not {estimator!r}"
                )
            if reward is None:
                raise ConfigError(f"{source}: tree_advantage: tree needs a reward")
            if reward.credit != "outcome":
                raise ConfigError(
                    f"{source}: tree_advantage: tree gives each token its segment's advantage; "
                    f"reward.credit must be 'outcome', not {reward.credit!r}"
                )
        elif estimator == TREE_ESTIMATOR_NAME:
            raise ConfigError(
                f"{source}: algorithm.adv_estimator={TREE_ESTIMATOR_NAME} reads token scores as "
                "advantages: it needs tree_advantage: tree (here 'plain')"
            )
        use_v1 = bool(_select(self.config, "trainer.use_v1", False))
        if tree_rollouts and self.tree.branches == "all" and estimator == "grpo" and use_v1:
            # verl's v1 trainer: grpo's advantage of a run's last output goes to all of them
            raise ConfigError(
                f"{source}: tree rollouts under verl's v1 trainer need algorithm.adv_estimator="
                f"{ESTIMATOR_NAME} (its grpo gives every leaf the last leaf's advantage)"
            )

    def _base_agent(self, loop_kwargs: Mapping[str, Any]) -> ResolvedAgent:
        """The resolved base agent, once per worker process for identical YAML entries
        (verl builds a loop object per sample; the agent YAML is neither re-read nor
        re-resolved each time: a row's ``tools_kwargs`` go through ``for_task``)."""
        key = json.dumps(
            [
                self.loop_name,
                plain(dict(loop_kwargs)),
                self.settings.config_defaults(),
                self.settings.agent_loop_config_path,
                os.getcwd(),
            ],
            sort_keys=True,
            default=str,
        )
        registry = get_registry()
        with self._configs_lock:
            agent = self._agents.get(key)
            if agent is None or agent.registry is not registry:  # plugins reloaded: again
                data = base_config_dict(self.settings, loop_kwargs)
                source = f"agent loop {self.loop_name!r}"
                config = AgentConfig.from_dict(data, source=source)
                agent = resolve(config, registry, source=source)
                self._agents[key] = agent
        return agent

    # -- concurrency -------------------------------------------------------------------
    @property
    def per_worker_concurrency(self) -> int:
        """``concurrency // num_workers`` (at least 1): agents at once in this worker."""
        return self._slots[0]

    @property
    def per_worker_sandboxes(self) -> int:
        """Sandboxes open at once in this worker: its agents', and with ``warm`` some more
        (set up ahead, or being graded): :func:`uniagent.episode.worker_slots`."""
        return self._slots[1]

    @property
    def _slots(self) -> tuple[int, int]:
        config = self.agent_config
        return worker_slots(config.concurrency, config.warm, self.settings.num_workers)

    def semaphore(self, kind: str = "sandboxes") -> asyncio.Semaphore:
        """A worker-wide semaphore, created lazily on the running event loop: of its open
        ``sandboxes``, or of its running ``agents``."""
        loop = asyncio.get_running_loop()
        limit = self.per_worker_sandboxes if kind == "sandboxes" else self.per_worker_concurrency
        by_limit = self._semaphores.setdefault(loop, {})
        if (kind, limit) not in by_limit:
            by_limit[kind, limit] = asyncio.Semaphore(limit)
        return by_limit[kind, limit]

    # -- one sample ---------------------------------------------------------------------
    async def run(  # type: ignore[override, unused-ignore]  # a list: verl's v1 worker
        self, sampling_params: dict[str, Any], **kwargs: Any
    ) -> AgentLoopOutput | list[AgentLoopOutput]:
        """Run the episode of one dataset row; failures give a masked placeholder output.

        A trained harness episode whose tree has several branches gives one output per
        branch, the last-served branch last (:mod:`uniagent.verl.branches`), where the
        worker takes several (``branches: all``, the default); elsewhere its last branch."""
        want_logprobs = bool(sampling_params.get("logprobs", self.settings.calculate_log_probs))
        messages: list[dict[str, Any]] | None = None
        result: EpisodeResult | None = None
        config: AgentConfig | None = None
        server = ServerLog(self.server_manager)
        dump = self._start_dump(kwargs)
        try:
            agent = self.agent.for_task(row_overrides(kwargs), source="tools_kwargs")
            config = agent.config
            task = row_task(kwargs)
            messages = row_messages(kwargs) or first_messages(agent, task)
            try:
                await ensure_services(self.agent)  # once per worker process
            except ServiceStartError as exc:  # infrastructure: masked, never a policy failure
                log.error("%s", exc)
                if dump is not None:
                    dump.logger.error("%s", exc)
                fields = self._placeholder(
                    messages, want_logprobs, exit_reason=ExitReason.ENV_ERROR, error=str(exc)
                )
            else:
                model = VerlServerModel(
                    server,
                    self.tokenizer,
                    self._sampling(config, sampling_params),
                    max_model_len=self.settings.context_length,
                    response_length=self.settings.response_length,
                    chat_template_kwargs=self.settings.chat_template_kwargs,
                )
                # With `warm`, more sandboxes than agents: an episode sets up (and baselines) its
                # sandbox, waits for an agent slot, and is graded after giving it back.
                ahead = self.per_worker_sandboxes > self.per_worker_concurrency
                async with self.semaphore("sandboxes"):
                    result = await run_episode(
                        agent,
                        task,
                        model,
                        messages=messages,
                        logger=dump.logger if dump is not None else log,
                        gate=self.semaphore("agents") if ahead else None,
                    )
                fields = self._fields(result, config, messages, want_logprobs)
        except Exception as exc:  # one bad episode must not break the batch
            log.exception("uniagent episode failed; returning a masked placeholder")
            error = f"{type(exc).__name__}: {exc}"
            if dump is not None:
                dump.logger.error("episode failed: %s", error, exc_info=True)
            fields = self._placeholder(messages, want_logprobs, error=error)
        if result is not None and result.leaves and config is not None:
            several = self._leaves(result, config, messages or [], want_logprobs, kwargs)
        else:
            several = self._branches(result, fields, want_logprobs, kwargs)
        for each in several:
            self._stamp(each, server, kwargs)
        if dump is not None:
            # v1 rows carry the trainer's step; on the classic path the weight version the
            # server reported (for an episode without a generation: the latest this worker
            # saw) is the best there is
            step = _as_int(kwargs.get("global_steps"), None)
            if step is None:
                step = server.max_steps if server.max_steps is not None else self._last_global_steps
            await self._write_dump(dump, result, fields, messages, kwargs, step)
        if len(several) > 1:
            return [_output(each) for each in several]
        return _output(fields)

    def _branches(
        self,
        result: EpisodeResult | None,
        fields: LoopFields,
        want_logprobs: bool,
        row: Mapping[str, Any],
    ) -> list[LoopFields]:
        """The episode's samples: one per branch of a trained harness episode's tree where
        the worker takes several (``[fields]`` otherwise: the last-served branch)."""
        record = extras_record(fields.extra_fields.get("extras")) or {}
        tree = result.tree if result is not None else None
        if tree is None or record.get("traj_masked") or int(tree.get("branches", 1)) < 2:
            return [fields]
        if self.tree.branches == "last" or not worker_takes_lists(row):
            log.warning(
                "episode of %d branches: only its last-served branch is a sample (%s)",
                tree["branches"],
                "branches: last"
                if self.tree.branches == "last"
                else "verl's classic AgentLoopWorker takes one output per row",
            )
            return [fields]
        assert result is not None
        try:
            samples = branch_samples(
                tree, shared_weight=self.tree.shared_weight, limit=self.tree.max_branches
            )
            if int(tree["branches"]) > len(samples):
                log.warning(
                    "episode of %d branches: its last %d are samples (max_branches)",
                    tree["branches"],
                    len(samples),
                )
        except Exception:  # a tree that does not load: the last branch, never a broken batch
            log.exception("could not read the episode's tree: its last-served branch only")
            return [fields]
        return [
            branch_fields(
                result,
                sample,
                branch=i,
                branches=len(samples),
                prompt_length=self.settings.prompt_length,
                response_length=self.settings.response_length,
                want_logprobs=want_logprobs,
                reward_configured=fields.reward_score is not None,
                end_token_id=self._end_token_id(),
            )
            for i, sample in enumerate(samples)
        ]

    def _leaves(
        self,
        result: EpisodeResult,
        config: AgentConfig,
        messages: list[dict[str, Any]],
        want_logprobs: bool,
        row: Mapping[str, Any],
    ) -> list[LoopFields]:
        """A tree rollout's samples: one per leaf (the root's own branch first), each with
        its own reward, masking and exactness, where the worker takes several outputs of one
        ``run``; else the root's branch only. Under ``tree_advantage: tree`` each trained
        token scores its segment's advantage, from every leaf of the tree
        (:mod:`uniagent.verl.tree_advantage`)."""
        assert result.leaves is not None
        leaves = list(result.leaves)
        samples = [self._fields(leaf, config, messages, want_logprobs) for leaf in leaves]
        if self.tree.tree_advantage == "tree":
            _tree_scores(leaves, samples)
        for i, sample in enumerate(samples):
            record = sample.extra_fields["extras"][UNIAGENT_KEY]
            record["branch"], record["branches"] = i, len(samples)
        if len(samples) < 2:
            return samples
        if self.tree.branches == "last" or not worker_takes_lists(row):
            log.warning(
                "tree rollout of %d leaves: only the root's own branch is a sample (%s)",
                len(samples),
                "branches: last"
                if self.tree.branches == "last"
                else "verl's classic AgentLoopWorker takes one output per row",
            )
            record = samples[0].extra_fields["extras"][UNIAGENT_KEY]
            record["branches"] = 1
            return samples[:1]
        if len(samples) > self.tree.max_branches:
            log.warning(
                "tree rollout of %d leaves: its first %d are samples (max_branches)",
                len(samples),
                self.tree.max_branches,
            )
            samples = samples[: self.tree.max_branches]
            for sample in samples:
                sample.extra_fields["extras"][UNIAGENT_KEY]["branches"] = len(samples)
        return samples

    def _fields(
        self,
        result: EpisodeResult,
        config: AgentConfig,
        messages: list[dict[str, Any]],
        want_logprobs: bool,
    ) -> LoopFields:
        """The output fields of a finished episode (a placeholder if it never began)."""
        if result.cache is None:  # failed before the first turn (e.g. the sandbox)
            return self._placeholder(
                messages,
                want_logprobs,
                exit_reason=result.exit_reason,
                error=result.error,
                result=result,
            )
        return episode_fields(
            result,
            prompt_length=self.settings.prompt_length,
            response_length=self.settings.response_length,
            want_logprobs=want_logprobs,
            reward_configured=config.reward is not None,
            end_token_id=self._end_token_id(),
            num_prompt_messages=len(messages),
            credit=config.reward.credit if config.reward is not None else "outcome",
            gamma=config.reward.gamma if config.reward is not None else 1.0,
        )

    def _stamp(self, fields: LoopFields, server: ServerLog, kwargs: Mapping[str, Any]) -> None:
        """What verl's own loops report besides the trajectory, so every chunk has their keys.

        - weight versions: verl's trainers read ``min_global_steps`` / ``max_global_steps`` as
          integers (the versions the episode was generated with); an episode without a
          generation gets the latest version this worker saw, else the row's
          ``global_steps``, else 0;
        - the server's own extra fields (e.g. ``global_steps``, ``num_cached_tokens``), merged
          over the episode's generations as verl's tool loop does;
        - ``reward_extra_info``: verl's reward loop gives it to every row it scores
          (``{"acc": score}`` for a reward function returning a number); rows scored by the
          agent carry the same, or a batch mixing both loses its reward keys.
        """
        if server.max_steps is not None:
            UniAgentLoop._last_global_steps = server.max_steps
        fallback = UniAgentLoop._last_global_steps
        if fallback is None:
            fallback = _as_int(kwargs.get("global_steps"), 0)
        low = server.min_steps if server.min_steps is not None else fallback
        high = server.max_steps if server.max_steps is not None else fallback
        extra = fields.extra_fields
        UniAgentLoop._server_keys.update(server.extra_fields)
        for key in sorted(UniAgentLoop._server_keys):
            if key not in EXTRA_FIELD_KEYS:
                extra[key] = server.extra_fields.get(key)
        extra["min_global_steps"] = low
        extra["max_global_steps"] = high
        if fields.reward_score is not None:
            extra["reward_extra_info"] = {"acc": fields.reward_score}
        fields.metrics["num_preempted"] = (
            server.num_preempted if server.num_preempted is not None else -1
        )

    # -- episode dumps --------------------------------------------------------------------
    def _start_dump(self, kwargs: Mapping[str, Any]) -> EpisodeDump | None:
        if self.dumps is None:
            return None
        try:
            task_id = row_task_id(kwargs)
        except Exception:  # a malformed row is still dumped, under its index
            task_id = str(plain(kwargs.get("index", "?")))
        group = str(plain(kwargs.get("uid") or f"{task_id}/{plain(kwargs.get('index'))}"))
        return self.dumps.start(task_id, group)

    async def _write_dump(
        self,
        dump: EpisodeDump,
        result: EpisodeResult | None,
        fields: LoopFields,
        messages: list[dict[str, Any]] | None,
        kwargs: Mapping[str, Any],
        step: int | None,
    ) -> None:
        """Write a sampled episode's files; a failure to write never fails the sample."""
        record = extras_record(fields.extra_fields.get("extras")) or {}
        if result is None:  # the adapter failed: dump what is known, nothing silently lost
            result = EpisodeResult(
                exit_reason=ExitReason(record.get("exit_reason", ExitReason.UNKNOWN_ERROR.value)),
                traj_masked=True,
                metrics=EpisodeMetrics(),
                error=record.get("error"),
            )
        verl_record = {
            "global_step": step,
            "uid": plain(kwargs.get("uid")),
            "session_id": plain(kwargs.get("session_id")),
            "index": plain(kwargs.get("index")),
            "data_source": plain(kwargs.get("data_source")),
            "traj_masked": record.get("traj_masked"),
            "truncated": record.get("truncated"),
            "reward_score": fields.reward_score,
            "num_turns": fields.num_turns,
            "prompt_tokens": len(fields.prompt_ids),
            "response_tokens": len(fields.response_ids),
            "trained_tokens": int(sum(fields.response_mask)),
            "min_global_steps": fields.extra_fields.get("min_global_steps"),
            "max_global_steps": fields.extra_fields.get("max_global_steps"),
        }
        if not result.messages and messages:
            verl_record["prompt_messages"] = messages
        try:
            await dump.write(result, verl_record, step)
        except Exception:
            log.exception("could not write the episode dump under %s", dump.settings.directory)

    def _sampling(self, config: AgentConfig, sampling_params: Mapping[str, Any]) -> dict[str, Any]:
        # The config's sampling.extra_body holds server sampling params as they are: flat here.
        ours = {k: v for k, v in config.sampling.items() if k != "extra_body"}
        ours.update(config.sampling.extra_body)
        extra = {k: v for k, v in ours.items() if k not in _VERL_SAMPLING_KEYS}
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


class UniAgentLoopOutput(AgentLoopOutput):
    """verl's ``AgentLoopOutput`` whose per-sample tensors (``as_dict``, what the v1
    trainer's TransferQueue worker stores) carry the row's per-turn credit in ``rm_scores``.

    The classic trainers batch the outputs in the worker instead; there
    ``UniAgentLoopManager`` places the same scores
    (:func:`uniagent.verl.metrics.place_token_scores`).
    """

    def as_dict(self) -> dict[str, Any]:
        """verl's ``as_dict``, then the row's ``token_scores`` added to ``rm_scores``."""
        out: dict[str, Any] = super().as_dict()
        record = extras_record((self.extra_fields or {}).get("extras")) or {}
        rm_scores = out.get("rm_scores")
        if rm_scores is not None:
            for position, score in record.get("token_scores") or []:
                rm_scores[int(position)] += float(score)
        return out


def _tree_scores(leaves: list[EpisodeResult], samples: list[LoopFields]) -> None:
    """Put the tree's per-segment advantages in each leaf sample's ``token_scores``
    (replacing what ``reward.credit`` would add: the checks allow only ``outcome``)."""
    runs: list[Any] = []
    for leaf in leaves:
        cache = leaf.cache
        if cache is None or cache.mode != "tokens" or not cache.prompt_ids:
            runs.append(None)
            continue
        prompt = list(cache.prompt_ids)
        runs.append(([*prompt, *cache.response_ids], [0] * len(prompt) + list(cache.response_mask)))
    records = [sample.extra_fields["extras"][UNIAGENT_KEY] for sample in samples]
    rewards = [sample.reward_score for sample in samples]
    kept = [not record["traj_masked"] for record in records]
    advantages = leaf_advantages(runs, rewards, kept)
    for run, leaf, sample, record, own in zip(
        runs, leaves, samples, records, advantages, strict=True
    ):
        if sample.reward_score is None:
            continue
        n = len(sample.response_ids)
        start = len(leaf.cache.prompt_ids) if run is not None and leaf.cache is not None else 0
        response = list(own[start : start + n]) if run is not None else []
        response += [0.0] * (n - len(response))
        additions, balanced = tree_token_scores(response, sample.response_mask, sample.reward_score)
        record["token_scores"] = additions
        if not balanced:
            log.warning(
                "a leaf's response has no untrained token: its row sums to its advantages, "
                "not its reward %s",
                sample.reward_score,
            )


def _output(fields: LoopFields) -> AgentLoopOutput:
    kwargs = dict(as_kwargs(fields))
    metrics = kwargs.pop("metrics")
    return UniAgentLoopOutput(metrics=AgentLoopMetrics(**metrics), **kwargs)


class ServerLog:
    """Wraps verl's server client to note what each generation reports (versions, preemptions)."""

    def __init__(self, server: Any) -> None:
        self.server = server
        self.min_steps: int | None = None
        self.max_steps: int | None = None
        self.num_preempted: int | None = None
        #: The server's extra fields over the episode: the first reply's, later replies'
        #: speculative-decoding counts added (what verl's tool loop reports).
        self.extra_fields: dict[str, Any] = {}

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
        if not self.extra_fields:
            self.extra_fields = dict(extra)
        else:
            for key in _SUMMED_SERVER_KEYS:
                if key in extra and key in self.extra_fields:
                    self.extra_fields[key] = (_as_int(self.extra_fields[key], 0) or 0) + (
                        _as_int(extra[key], 0) or 0
                    )
        return out


def _as_int(value: Any, default: int | None) -> int | None:
    try:
        return default if value is None else int(value)
    except (TypeError, ValueError):
        return default
