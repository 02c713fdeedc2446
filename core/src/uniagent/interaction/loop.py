"""The ReAct loop: model → tool call → sandbox command → observation, until an exit.

The loop does not know whether it is training or evaluating: the model backend
decides what the rollout holds (token ids and log-probs, or messages).
"""

from __future__ import annotations

import copy
import json
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Self

from uniagent.config import InteractionConfig
from uniagent.env.errors import ActionError, ActionTimeoutError
from uniagent.exit import ExitReason
from uniagent.interaction.metrics import EpisodeMetrics
from uniagent.models.base import ChatModel, ContextLimitError, ModelError, ModelTurn
from uniagent.observer import NULL_OBSERVER, EpisodeObserver
from uniagent.parsers import (
    ParseResult,
    StructuredCalls,
    ToolCallFormatError,
    ToolCallParser,
    tool_calls_from_openai,
)
from uniagent.rollout import Rollout
from uniagent.rollout.cache import tool_message
from uniagent.specs import ToolSpec

log = logging.getLogger(__name__)

#: Builds the message answering one tool call: (content, tool name, call id) -> message.
_Answer = Callable[[str, str | None, str | None], dict[str, Any]]


@dataclass
class InteractionResult:
    """How the loop ended and what it produced.

    ``cache`` is ``None`` only for an episode that ended before its first turn (its
    sandbox did not start): :class:`uniagent.episode.EpisodeResult` extends this.
    """

    exit_reason: ExitReason
    cache: Rollout | None = None
    metrics: EpisodeMetrics = field(default_factory=EpisodeMetrics)
    submission: str | None = None
    error: str | None = None
    #: What the record of the conversation adds to some messages (by index), never sent
    #: to the model: calls parsed from an assistant message's text (see :data:`PARSED_CALLS`).
    notes: dict[int, dict[str, Any]] = field(default_factory=dict)
    #: Per-turn scores by model turn index from 0: the tools' (``ToolSpec.score``), then
    #: the reward's added (``RewardResult.turn_scores``).
    turn_scores: dict[int, float] = field(default_factory=dict)

    @property
    def messages(self) -> list[dict[str, Any]]:
        """The conversation, as chat messages (empty before the first turn)."""
        return self.cache.messages if self.cache is not None else []


#: The key of an assistant message (in ``messages.json``) holding the calls a parser read
#: from its text: ``[{"name": ..., "arguments": {...}}]``; ``PARSED_CONTENT`` holds the
#: text outside them. Calls made through a chat API are in ``tool_calls`` already.
PARSED_CALLS = "parsed_tool_calls"
PARSED_CONTENT = "parsed_content"
#: The key of a user message that carries a text-mode call's output: the tool's name.
TOOL_OUTPUT_OF = "tool_output_of"
_LOGGED_ARGS = 300  # characters of a call's arguments in the episode log


@dataclass
class _Turn:
    """What one model turn led to: messages for the model, or the end of the episode."""

    messages: list[dict[str, Any]] = field(default_factory=list)
    exit_reason: ExitReason | None = None
    submission: str | None = None
    #: What went wrong, when the turn ended the episode on an infrastructure failure.
    error: str | None = None
    #: Notes on the turn's assistant message (calls parsed from its text), if any.
    note: dict[str, Any] | None = None
    #: Notes on :attr:`messages`, one per message (None: nothing to note).
    notes: list[dict[str, Any] | None] = field(default_factory=list)


class AgentInteraction:
    """Runs one episode's ReAct loop against an open sandbox."""

    def __init__(
        self,
        model: ChatModel,
        env: Any,
        tools: Sequence[ToolSpec],
        parser: ToolCallParser,
        config: InteractionConfig,
        *,
        logger: logging.Logger | None = None,
        observer: EpisodeObserver | None = None,
    ) -> None:
        self.model = model
        self.observer = observer or NULL_OBSERVER
        self.env = env
        self.tools = list(tools)
        self.tools_by_name = {t.name: t for t in self.tools}
        self.parser = parser
        self.config = config
        self.log: logging.Logger | logging.LoggerAdapter[Any] = logger or log
        self.timeout_left = config.timeout_budget
        #: Seconds of command time left under ``time_limit`` (None: no limit).
        self.time_left = config.time_limit
        self.consecutive_format_errors = 0
        self.notes: dict[int, dict[str, Any]] = {}
        self.turn_scores: dict[int, float] = {}
        self._turn = 0
        #: A tree rollout's (:class:`uniagent.interaction.tree.TreeRollout`): asked before
        #: each turn whether it may split there, and after the turn's generation whether it
        #: does (None: one branch).
        self.brancher: Any = None

    def clone(self, env: Any, logger: logging.Logger | logging.LoggerAdapter[Any]) -> Self:
        """This loop's state (budgets, counters, notes, scores) on another sandbox: a
        branch of a tree rollout continues from here with it."""
        twin = copy.copy(self)
        twin.env, twin.log = env, logger
        twin.notes = copy.deepcopy(self.notes)
        twin.turn_scores = dict(self.turn_scores)
        return twin

    async def run(self, cache: Rollout, metrics: EpisodeMetrics | None = None) -> InteractionResult:
        """Loop until a finishing tool, a limit or an unrecoverable error."""
        metrics = metrics or EpisodeMetrics()
        while metrics.turns < self.config.max_turns:
            point = None if self.brancher is None else self.brancher.before(self, cache, metrics)
            metrics.turns += 1
            self._turn = metrics.turns
            self.observer.turn(metrics.turns)
            started = time.perf_counter()
            try:
                response = await self.model.generate(
                    cache, stop=self.parser.stop_sequences, call_format=self.parser
                )
            except ContextLimitError as exc:
                self.log.info("context full: %s", exc)
                return self._result(ExitReason.TOKEN_LIMIT, cache, metrics)
            except ModelError as exc:
                self.log.error("model failed: %s", exc)
                return self._result(ExitReason.MODEL_ERROR, cache, metrics, error=str(exc))
            finally:
                elapsed = time.perf_counter() - started
                metrics.model_seconds += elapsed
                self.log.info("turn %d: model %.2f s", metrics.turns, elapsed)
            if response.prompt_exact is False:
                metrics.inexact_turns += 1
            if point is not None:  # other branches start here (not an error of this one)
                await self.brancher.split(point, cache)

            turn = await self._act(response, metrics, cache)
            if turn.note is not None and cache.messages:
                self.notes[len(cache.messages) - 1] = turn.note  # this turn's assistant message
            if turn.exit_reason is not None:
                return self._result(
                    turn.exit_reason, cache, metrics, submission=turn.submission, error=turn.error
                )
            first = len(cache.messages)
            cache.append_messages(turn.messages)
            for index, note in enumerate(turn.notes, start=first):
                if note is not None:
                    self.notes[index] = note
        return self._result(ExitReason.MAX_STEP_LIMIT, cache, metrics)

    def _result(
        self, reason: ExitReason, cache: Rollout, metrics: EpisodeMetrics, **more: Any
    ) -> InteractionResult:
        return InteractionResult(
            reason,
            cache,
            metrics,
            notes=dict(self.notes),
            turn_scores=dict(self.turn_scores),
            **more,
        )

    def _spend_timeout(self, timeout: float) -> ExitReason | None:
        """A command timed out after ``timeout`` s: ``timeout_error`` when that was the
        task's time limit, or when the episode's timeout budget is spent."""
        if timeout < self.config.action_timeout:  # the time limit, not the command's
            self.time_left = 0.0
            self.log.info("the time limit (%g s of commands) is spent", self.config.time_limit)
            return ExitReason.TIMEOUT_ERROR
        self.timeout_left -= timeout
        return ExitReason.TIMEOUT_ERROR if self.timeout_left <= 0 else None

    def _score(self, spec: ToolSpec, arguments: Any, output: str, code: int | None) -> None:
        """Add the tool's score of this observation (``ToolSpec.score``) to this turn's."""
        if spec.score is None:
            return
        try:
            value = spec.score(arguments, output, code)
        except Exception as exc:  # the output is the agent's: a crash here scores nothing
            self.log.warning("turn %d: %s's score failed: %s", self._turn, spec.name, exc)
            return
        if value is not None:
            turn = self._turn - 1
            self.turn_scores[turn] = self.turn_scores.get(turn, 0.0) + float(value)

    def parse(self, response: ModelTurn) -> ParseResult:
        """This turn's validated calls (see :func:`parse_turn`)."""
        return parse_turn(
            response, self.parser, self.tools, max_calls=self.config.max_tool_calls_per_turn
        )

    async def _act(self, response: ModelTurn, metrics: EpisodeMetrics, cache: Rollout) -> _Turn:
        """Parse the model's calls and run them; errors the model can fix become messages."""
        answer = self._answerer(response, cache)
        try:
            parsed = self.parse(response)
        except ToolCallFormatError as exc:
            metrics.format_errors += 1
            self.consecutive_format_errors += 1
            self.log.info(
                "turn %d: format error (%s): %s", self._turn, exc.kind, _first_line(str(exc))
            )
            limit = self.config.max_format_errors
            if limit is not None and self.consecutive_format_errors >= limit:
                return _Turn(exit_reason=ExitReason.FORMAT_ERROR)
            # A chat API rejects the next request unless every structured call gets a reply.
            ids = [c.get("id") for c in response.raw_tool_calls or ()] or [None]
            return _Turn(messages=[answer(str(exc), None, i) for i in ids])
        self.consecutive_format_errors = 0
        calls = parsed.tool_calls

        turn = _Turn()
        from_text = not response.raw_tool_calls
        if from_text and calls:
            turn.note = {
                PARSED_CALLS: [{"name": c.name, "arguments": c.arguments} for c in calls],
                PARSED_CONTENT: parsed.content,
            }
        for call in calls:
            metrics.tool_calls[call.name] += 1
            spec = self.tools_by_name[call.name]
            self.observer.tool(call.name)
            started = time.perf_counter()
            outcome = "failed"
            timeout = self.config.action_timeout
            if self.time_left is not None:  # the task's time limit ends it sooner
                timeout = min(timeout, max(self.time_left, 0.01))
            try:
                observation = await self.env.run_action(
                    spec.to_command(call.arguments), timeout=timeout
                )
                text = _observation_text(observation.output, observation.exit_code)
                code = observation.exit_code
                outcome = "done" if code is None else f"exit {code}"
                self._score(spec, call.arguments, observation.output, code)
            except ActionError as exc:  # what the model sees, or the end of the episode
                outcome = exc.outcome
                if exc.counted_as is not None:
                    setattr(metrics, exc.counted_as, getattr(metrics, exc.counted_as) + 1)
                if exc.ends_with is not None:
                    self.log.warning("%s (%s): %s", outcome, exc.ends_with.value, exc)
                    return _Turn(exit_reason=exc.ends_with)
                if isinstance(exc, ActionTimeoutError):
                    outcome = f"timed out after {timeout:g} s"
                    spent = self._spend_timeout(timeout)
                    if spent is not None:
                        return _Turn(exit_reason=spent)
                text = exc.observation()
            finally:
                elapsed = time.perf_counter() - started
                metrics.env_seconds += elapsed
                if self.time_left is not None:
                    self.time_left -= elapsed
                self.log.info(
                    "turn %d: %s -> %s, %.2f s",
                    self._turn,
                    _describe(call.name, call.arguments),
                    outcome,
                    elapsed,
                )
            if spec.ends_episode:
                return _Turn(exit_reason=ExitReason.FINISHED, submission=text, note=turn.note)
            if self.time_left is not None and self.time_left <= 0:
                self.log.info("the time limit (%g s of commands) is spent", self.config.time_limit)
                return _Turn(exit_reason=ExitReason.TIMEOUT_ERROR)
            message = answer(text, call.name, call.id)
            turn.messages.append(message)
            # A text call's output that goes back as a user message: the record names the tool.
            carried = from_text and message.get("role") == "user"
            turn.notes.append({TOOL_OUTPUT_OF: call.name} if carried else None)
        return turn

    def _answerer(self, response: ModelTurn, cache: Rollout) -> _Answer:
        """How this turn's tool results are sent back.

        Structured calls get ``role: tool`` answers with their ids. Calls written
        as text get what the rollout takes as their answer
        (:meth:`~uniagent.rollout.Rollout.answer_text_call`), given the
        parser's response format.
        """
        if response.raw_tool_calls:
            return tool_message
        wrap = self.parser.format_tool_response

        def text_answer(content: str, name: str | None, call_id: str | None) -> dict[str, Any]:
            return cache.answer_text_call(content, name, call_id, wrap)

        return text_answer


STRUCTURED = StructuredCalls()


def parse_turn(
    turn: ModelTurn,
    parser: ToolCallParser,
    tools: Sequence[ToolSpec],
    *,
    max_calls: int | None = None,
) -> ParseResult:
    """A turn's validated calls: the API's structured ones if any, else parsed from its text.

    The one place tool calls are parsed. Raises :class:`ToolCallFormatError`,
    whose message (shaped after the format the model used) goes back to it.
    """
    if turn.raw_tool_calls:
        calls = tool_calls_from_openai(
            turn.raw_tool_calls, tools, parser=STRUCTURED, max_calls=max_calls, content=turn.text
        )
        return ParseResult(content=turn.text, tool_calls=calls)
    return parser.parse(turn.text, tools, max_calls=max_calls)


def _describe(name: str, arguments: dict[str, Any]) -> str:
    """A call as the episode log shows it: ``name $ command``, or its arguments as JSON."""
    if set(arguments) == {"command"} and isinstance(arguments["command"], str):
        text = "$ " + arguments["command"].replace("\n", "\\n")
    else:
        text = json.dumps(arguments, ensure_ascii=False, default=str)
    if len(text) > _LOGGED_ARGS:
        text = text[: _LOGGED_ARGS - 3] + "..."
    return f"{name} {text}"


def _first_line(text: str) -> str:
    line = (text.strip().splitlines() or [""])[0]
    return line if len(line) <= _LOGGED_ARGS else line[: _LOGGED_ARGS - 3] + "..."


def _observation_text(output: str, exit_code: int | None) -> str:
    if exit_code not in (0, None):
        return f"{output}\n[exit code {exit_code}]" if output else f"[exit code {exit_code}]"
    return output
