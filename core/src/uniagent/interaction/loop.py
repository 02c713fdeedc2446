"""The ReAct loop: model → tool call → sandbox command → observation, until an exit.

The loop does not know whether it is training or evaluating: the model backend
decides what the rollout cache holds (token ids and log-probs, or messages).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from uniagent.config import InteractionConfig
from uniagent.env.errors import (
    ActionSyntaxError,
    ActionTimeoutError,
    CommandEncodingError,
    SessionProtocolError,
    ShellKilledError,
    TerminalNotAliveError,
)
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
from uniagent.rollout import RolloutCache
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
    cache: RolloutCache | None = None
    metrics: EpisodeMetrics = field(default_factory=EpisodeMetrics)
    submission: str | None = None
    error: str | None = None

    @property
    def messages(self) -> list[dict[str, Any]]:
        """The conversation, as chat messages (empty before the first turn)."""
        return self.cache.messages if self.cache is not None else []


@dataclass
class _Turn:
    """What one model turn led to: messages for the model, or the end of the episode."""

    messages: list[dict[str, Any]] = field(default_factory=list)
    exit_reason: ExitReason | None = None
    submission: str | None = None


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
        self.log = logger or log
        self.timeout_left = config.timeout_budget
        self.consecutive_format_errors = 0

    async def run(
        self, cache: RolloutCache, metrics: EpisodeMetrics | None = None
    ) -> InteractionResult:
        """Loop until a finishing tool, a limit or an unrecoverable error."""
        metrics = metrics or EpisodeMetrics()
        for _ in range(self.config.max_turns):
            metrics.turns += 1
            self.observer.turn(metrics.turns)
            started = time.perf_counter()
            try:
                response = await self.model.generate(
                    cache, stop=self.parser.stop_sequences, call_format=self.parser
                )
            except ContextLimitError as exc:
                self.log.info("context full: %s", exc)
                return InteractionResult(ExitReason.TOKEN_LIMIT, cache, metrics)
            except ModelError as exc:
                self.log.error("model failed: %s", exc)
                return InteractionResult(ExitReason.MODEL_ERROR, cache, metrics, error=str(exc))
            finally:
                metrics.model_seconds += time.perf_counter() - started
            if response.prompt_exact is False:
                metrics.inexact_turns += 1

            turn = await self._act(response, metrics, cache)
            if turn.exit_reason is not None:
                return InteractionResult(
                    turn.exit_reason, cache, metrics, submission=turn.submission
                )
            cache.append_messages(turn.messages)
        return InteractionResult(ExitReason.MAX_STEP_LIMIT, cache, metrics)

    def parse(self, response: ModelTurn) -> ParseResult:
        """This turn's validated calls (see :func:`parse_turn`)."""
        return parse_turn(
            response, self.parser, self.tools, max_calls=self.config.max_tool_calls_per_turn
        )

    async def _act(
        self, response: ModelTurn, metrics: EpisodeMetrics, cache: RolloutCache
    ) -> _Turn:
        """Parse the model's calls and run them; errors the model can fix become messages."""
        answer = self._answerer(response, cache)
        try:
            calls = self.parse(response).tool_calls
        except ToolCallFormatError as exc:
            metrics.format_errors += 1
            self.consecutive_format_errors += 1
            limit = self.config.max_format_errors
            if limit is not None and self.consecutive_format_errors >= limit:
                return _Turn(exit_reason=ExitReason.FORMAT_ERROR)
            # A chat API rejects the next request unless every structured call gets a reply.
            ids = [c.get("id") for c in response.raw_tool_calls or ()] or [None]
            return _Turn(messages=[answer(str(exc), None, i) for i in ids])
        self.consecutive_format_errors = 0

        turn = _Turn()
        for call in calls:
            metrics.tool_calls[call.name] += 1
            spec = self.tools_by_name[call.name]
            self.observer.tool(call.name)
            started = time.perf_counter()
            try:
                observation = await self.env.run_action(
                    spec.to_command(call.arguments), timeout=self.config.action_timeout
                )
                text = _observation_text(observation.output, observation.exit_code)
            except ActionSyntaxError as exc:
                metrics.syntax_errors += 1
                text = f"Your command was not run: bash reports a syntax error.\n{exc}"
            except CommandEncodingError as exc:
                metrics.syntax_errors += 1
                text = f"Your command was not run: {exc}"
            except SessionProtocolError as exc:
                # The command tampered with the shell's control channel (its own doing): the
                # session was resynchronised; the model sees its output and what went wrong.
                text = f"{exc.partial_output.rstrip()}\n[the shell reports: {exc}]".lstrip("\n")
            except ActionTimeoutError as exc:
                metrics.timeouts += 1
                self.timeout_left -= self.config.action_timeout
                if self.timeout_left <= 0:
                    return _Turn(exit_reason=ExitReason.TIMEOUT_ERROR)
                text = (
                    f"{getattr(exc, 'partial_output', '') or ''}\n"
                    f"The command timed out after {self.config.action_timeout:g} s and was "
                    "interrupted; the shell is still usable. Run long jobs with a smaller input, "
                    "or in the background with output to a file."
                ).lstrip("\n")
            except ShellKilledError as exc:
                self.log.warning("the agent's command ended its shell: %s", exc)
                return _Turn(exit_reason=ExitReason.AGENT_KILLED_SHELL)
            except TerminalNotAliveError as exc:
                self.log.warning("terminal died: %s", exc)
                return _Turn(exit_reason=ExitReason.TERMINAL_NOT_ALIVE)
            finally:
                metrics.env_seconds += time.perf_counter() - started
            if spec.ends_episode:
                return _Turn(exit_reason=ExitReason.FINISHED, submission=text)
            turn.messages.append(answer(text, call.name, call.id))
        return turn

    def _answerer(self, response: ModelTurn, cache: RolloutCache) -> _Answer:
        """How this turn's tool results are sent back.

        Structured calls get ``role: tool`` answers with their ids. Calls written
        as text get what the rollout takes as their answer
        (:meth:`~uniagent.rollout.RolloutCache.answer_text_call`), given the
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


def _observation_text(output: str, exit_code: int | None) -> str:
    if exit_code not in (0, None):
        return f"{output}\n[exit code {exit_code}]" if output else f"[exit code {exit_code}]"
    return output
