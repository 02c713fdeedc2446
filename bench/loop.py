"""Framework overhead per turn: uniagent's AgentInteraction vs verl 0.9.1's ToolAgentLoop.

Run: ``python bench/loop.py`` (options: ``--turns 10 50 100 --repeats 7 --host --profile``).
verl is only timed when it is importable (e.g. ``.venv-verl/bin/python bench/loop.py``).

What is measured: the wall time of one whole episode of T model turns divided by T, with
a model that answers instantly and an environment that answers instantly, so that what
remains is the framework: prompt rendering, appending model tokens, decoding and parsing
the tool call, building the tool message, tokenizing it into the context, bookkeeping.

The conversation is the same on both sides: the real Qwen3 tokenizer and chat template,
a system + user prompt with two tool schemas (``execute_bash``, ``submit``), T assistant
turns (~30 words of prose and one hermes ``<tool_call>``; turn k runs ``cat out_k.txt``,
the last turn calls ``submit``) and T-1 tool results, either one short line ("short") or
~300 tokens of grep-like output ("300 tok"). The assistant texts are tokenized once up
front; both model stubs hand out those ids (and log-probs) without any work.

- uniagent: ``AgentInteraction(model, env, tools, hermes parser)`` driven like
  ``core/tests/test_loop.py``; the model is a ``ScriptedTokenModel`` subclass returning
  the pre-tokenized ids; the env is a fake with AgentEnv's ``run_action(command, timeout)
  -> Observation`` that looks the output up in a dict (the bench measures the framework,
  not bash; ``--host`` adds a column with a real host ``AgentEnv`` running ``cat``).
  Timed: ``model.start_cache(prompt, tools)`` + ``interaction.run(cache)``; the
  "loop only" column is ``interaction.run`` alone.
- verl: ``ToolAgentLoop`` instantiated the way ``AgentLoopWorker._run_agent_loop`` does
  (``hydra.utils.instantiate`` of the registry entry with the trainer config, tokenizer,
  ``hf_model_type="qwen3"`` and the tools ``load_all_tools`` reads from a tool-config
  YAML); the tools are ``BaseTool`` subclasses answering from the same dict; the server
  manager's ``generate`` returns the pre-tokenized ids as a ``TokenOutput``. Timed:
  ``await loop.run(sampling_params, raw_prompt=..., ...)`` (it renders the prompt too).
  ``max_assistant_turns=T`` ends it after the T-th generation, so it parses one call
  fewer than uniagent, which runs the final ``submit``.

Both sides must produce the same ids: the final context (prompt + response ids) and the
response masks are compared after every run, and the header says whether they matched.

Reading the table: ms/turn is the median over ``--repeats`` episodes (one untimed
warm-up episode per row first; the two frameworks alternate so machine noise hits both).
"verl/uniagent" > 1 means uniagent is faster; "verl/loop" compares with uniagent's loop
alone. A flat ms/turn across T means the cost per turn does not grow with the history.
"start_cache" (uniagent's prompt render) and "verl init" (building the ToolAgentLoop,
outside verl's timed region) are per episode, in ms. The goal for uniagent: < 1 ms/turn,
flat in T, and at least 2x below ToolAgentLoop.

On a machine that other processes load, wall times swing by 2-5x; ``--clock cpu`` times
CPU time of this process (all threads, so verl's executor threads count) and is much
steadier. ``--profile`` prints a cProfile of uniagent at the largest T, 300-token outputs.
"""

from __future__ import annotations

import os
import sys

# bench/tokenize.py shadows the stdlib module `tokenize` (imported by linecache, inspect,
# transformers) while this script's folder is on the import path: drop it first.
_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != _HERE]

import argparse  # noqa: E402
import asyncio  # noqa: E402
import contextlib  # noqa: E402
import cProfile  # noqa: E402
import gc  # noqa: E402
import io  # noqa: E402
import platform  # noqa: E402
import pstats  # noqa: E402
import random  # noqa: E402
import statistics  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from dataclasses import dataclass  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

try:
    import uniagent  # noqa: F401
except ImportError:  # running from a checkout without an install
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "core" / "src"))

from pydantic import BaseModel, Field  # noqa: E402

from uniagent import open_env  # noqa: E402
from uniagent.config import InteractionConfig  # noqa: E402
from uniagent.env.agent_env import Observation  # noqa: E402
from uniagent.exit import ExitReason  # noqa: E402
from uniagent.interaction.loop import AgentInteraction  # noqa: E402
from uniagent.models.base import Generation  # noqa: E402
from uniagent.parsers import HermesParser  # noqa: E402
from uniagent.rollout import CHECK_ENV, Rollout  # noqa: E402
from uniagent.specs import ToolSpec  # noqa: E402
from uniagent.testing.scripted import ScriptedTokenModel, hermes_call, logprob_for  # noqa: E402
from uniagent.testing.tokenizers import load_qwen3_tokenizer  # noqa: E402

CLOCKS = {
    "wall": ("wall time (perf_counter)", time.perf_counter),
    "cpu": ("CPU time of this process, all threads (process_time)", time.process_time),
}
clock = time.perf_counter  # set from --clock

# ----------------------------------------------------------------------------- the tools


class CommandArgs(BaseModel):
    command: str = Field(description="the bash command to run")


class NoArgs(BaseModel):
    pass


SHELL = ToolSpec(
    name="execute_bash",
    description="Run a bash command in the sandbox and return its output.",
    arguments=CommandArgs,
    render=lambda a: a["command"],
)
SUBMIT = ToolSpec(
    name="submit",
    description="Finish the task and submit the work.",
    arguments=NoArgs,
    render=lambda a: "echo submitted",
    ends_episode=True,
)
TOOLS = [SHELL, SUBMIT]
SUBMIT_COMMAND = "echo submitted"

# Written out in the key order verl's OpenAIFunctionToolSchema dumps (the chat template
# renders them with `tojson`, so the order is part of the prompt text), so that both
# frameworks render the very same prompt.
SCHEMAS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": SHELL.name,
            "description": SHELL.description,
            "parameters": {
                "type": "object",
                "properties": {
                    "command": {"type": "string", "description": "the bash command to run"}
                },
                "required": ["command"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": SUBMIT.name,
            "description": SUBMIT.description,
            "parameters": {"type": "object", "properties": {}, "required": []},
        },
    },
]

# ----------------------------------------------------------------------------- the conversation

_VOCAB = """the file function return value error test module import class self path line
config data result output input check update fix patch repo commit branch index
token model server request response cache build install run debug trace"""
WORDS = _VOCAB.split()


def words(rng: random.Random, n: int) -> str:
    """Pseudo-random prose, roughly one token per word."""
    return " ".join(rng.choice(WORDS) for _ in range(n))


def long_output(rng: random.Random, tok: Any, tokens: int) -> str:
    """grep-like command output of about ``tokens`` tokens."""
    lines: list[str] = []
    count = 0
    while count < tokens:
        path = f"src/{rng.choice(WORDS)}/{rng.choice(WORDS)}.py:{rng.randint(1, 999)}: "
        lines.append(path + words(rng, 8))
        count += len(tok.encode(lines[-1] + "\n", add_special_tokens=False))
    return "\n".join(lines)


@dataclass
class Conversation:
    """One scripted episode, identical for both frameworks."""

    prompt: list[dict[str, Any]]
    texts: list[str]  # assistant texts, one per turn
    ids: list[list[int]]  # their ids + <|im_end|>: what the "server" returns
    logprobs: list[list[float]]
    outputs: dict[str, str]  # command -> tool output
    files: dict[str, str]  # file name -> content (for --host: `cat` prints the output)

    @property
    def turns(self) -> int:
        return len(self.texts)


def make_conversation(tok: Any, turns: int, size: str, seed: int = 0) -> Conversation:
    """T assistant turns with hermes calls; T-1 tool outputs ("short" or "long")."""
    rng = random.Random(seed)
    eot = tok.convert_tokens_to_ids("<|im_end|>")
    prompt = [
        {"role": "system", "content": "You are a software engineer working in a sandbox."},
        {"role": "user", "content": "Fix the failing test. " + words(rng, 60)},
    ]
    texts, ids, logprobs = [], [], []
    outputs: dict[str, str] = {SUBMIT_COMMAND: "submitted\n"}
    files: dict[str, str] = {}
    position = 0
    for k in range(turns):
        thought = words(rng, 30).capitalize() + "."
        if k == turns - 1:
            text = hermes_call(SUBMIT.name, {}, thought=thought)
        else:
            name = f"out_{k:03d}.txt"
            text = hermes_call(SHELL.name, {"command": f"cat {name}"}, thought=thought)
            if size == "short":
                output = f"src/{rng.choice(WORDS)}.py:{rng.randint(1, 999)}: {words(rng, 4)}\n"
            else:
                output = long_output(rng, tok, 300) + "\n"
            outputs[f"cat {name}"] = output
            files[name] = output
        turn_ids = tok.encode(text, add_special_tokens=False) + [eot]
        texts.append(text)
        ids.append(turn_ids)
        logprobs.append([logprob_for(position + i) for i in range(len(turn_ids))])
        position += len(turn_ids)
    return Conversation(prompt, texts, ids, logprobs, outputs, files)


# ----------------------------------------------------------------------------- uniagent side


class PretokenizedModel(ScriptedTokenModel):
    """The scripted model, minus its per-turn ``tokenizer.encode``: hands out ready ids."""

    def __init__(self, tokenizer: Any, conversation: Conversation) -> None:
        super().__init__(tokenizer, conversation.texts)
        self.conversation = conversation
        self.turn = 0

    async def _generate(self, prompt_ids: list[int], max_tokens: int | None) -> Generation:
        k = self.turn
        self.turn += 1
        conv = self.conversation
        return Generation(token_ids=conv.ids[k], logprobs=conv.logprobs[k])


class MemoryEnv:
    """AgentEnv's ``run_action`` interface, answered instantly from a dict (no bash)."""

    def __init__(self, outputs: dict[str, str]) -> None:
        self.outputs = outputs

    async def run_action(self, command: str, timeout: float | None = None) -> Observation:
        return Observation(output=self.outputs.get(command, ""), exit_code=0)


@dataclass
class UniagentRun:
    total: float  # seconds: start_cache + run
    loop: float  # seconds: run only
    cache: Rollout


async def run_uniagent(tok: Any, conv: Conversation, env: Any) -> UniagentRun:
    model = PretokenizedModel(tok, conv)
    config = InteractionConfig(max_turns=conv.turns, action_timeout=30, timeout_budget=60)
    interaction = AgentInteraction(model, env, TOOLS, HermesParser(), config)
    t0 = clock()
    cache = model.start_cache(conv.prompt, SCHEMAS)
    t1 = clock()
    result = await interaction.run(cache)
    t2 = clock()
    if result.exit_reason is not ExitReason.FINISHED or result.metrics.turns != conv.turns:
        raise SystemExit(
            f"uniagent ended with {result.exit_reason} after {result.metrics.turns} turns "
            f"(expected finished after {conv.turns}): {result.error}"
        )
    return UniagentRun(total=t2 - t0, loop=t2 - t1, cache=cache)


# ----------------------------------------------------------------------------- verl side

_CANNED: dict[str, str] = {}  # what the verl tools answer (set per conversation)


def _verl_tool_base() -> type:
    try:
        from verl.tools.base_tool import BaseTool
    except ImportError:
        return object
    return BaseTool


class CannedTool(_verl_tool_base()):  # type: ignore[misc]
    """A verl ``BaseTool`` answering instantly from the same dict as :class:`MemoryEnv`."""

    async def execute(
        self, instance_id: str, parameters: dict[str, Any], **kwargs: Any
    ) -> tuple[Any, float, dict[str, Any]]:
        from verl.tools.schemas import ToolResponse

        if self.name == SUBMIT.name:
            return ToolResponse(text=_CANNED[SUBMIT_COMMAND]), 0.0, {}
        return ToolResponse(text=_CANNED.get(parameters.get("command", ""), "")), 0.0, {}


class StubServer:
    """verl's server manager, duck-typed: ``generate`` returns the next pre-tokenized turn."""

    def __init__(self) -> None:
        self.conversation: Conversation | None = None
        self.turn = 0

    def reset(self, conversation: Conversation) -> None:
        self.conversation = conversation
        self.turn = 0

    async def generate(self, request_id: str, *, prompt_ids: list[int], **kwargs: Any) -> Any:
        from verl.workers.rollout.replica import TokenOutput

        assert self.conversation is not None
        k = self.turn
        self.turn += 1
        conv = self.conversation
        # model_construct: no validation, so the stub costs ~0 like uniagent's.
        return TokenOutput.model_construct(
            token_ids=conv.ids[k], log_probs=conv.logprobs[k], extra_fields={}
        )


class VerlSide:
    """verl's ToolAgentLoop set up like AgentLoopWorker does, against the stub server."""

    def __init__(self, tok: Any, workdir: Path) -> None:
        import verl
        from omegaconf import OmegaConf
        from verl.tools.tool_registry import load_all_tools

        self.version = verl.__version__
        config = OmegaConf.load(
            Path(verl.__file__).parent / "trainer" / "config" / "_generated_ppo_trainer.yaml"
        )
        tool_yaml = workdir / "tools.yaml"
        tool_yaml.write_text(
            OmegaConf.to_yaml(
                {
                    "tools": [
                        {
                            "class_name": f"{__name__}.CannedTool",
                            "config": {"type": "native"},
                            "tool_schema": schema,
                        }
                        for schema in SCHEMAS
                    ]
                }
            )
        )
        rollout = config.actor_rollout_ref.rollout
        rollout.name = "vllm"
        rollout.prompt_length = 1 << 20
        rollout.response_length = 1 << 24
        rollout.calculate_log_probs = True
        rollout.multi_turn.enable = True
        rollout.multi_turn.format = "hermes"
        rollout.multi_turn.max_parallel_calls = 1
        rollout.multi_turn.max_tool_response_length = 1 << 20  # never truncate: same text
        rollout.multi_turn.tool_config_path = str(tool_yaml)
        self.config = config
        self.tok = tok
        with contextlib.redirect_stdout(io.StringIO()):  # BaseTool prints its schema
            self.tools = load_all_tools(tool_config_path=str(tool_yaml), function_tool_path=None)
        self.server = StubServer()
        from verl.utils.dataset.rl_dataset import get_dataset_class

        with contextlib.redirect_stdout(io.StringIO()):  # it prints the class it picked
            self.dataset_cls = get_dataset_class(config.data)  # once per worker, as verl does

    def make_loop(self, turns: int) -> Any:
        """A fresh ToolAgentLoop, as ``AgentLoopWorker._run_agent_loop`` builds one."""
        import hydra
        import verl.experimental.agent_loop.tool_agent_loop  # noqa: F401  (registers it)
        from verl.experimental.agent_loop.agent_loop import (
            DictConfigWrap,
            ToolListWrap,
            _agent_loop_registry,
        )

        self.config.actor_rollout_ref.rollout.multi_turn.max_assistant_turns = turns
        return hydra.utils.instantiate(
            config=_agent_loop_registry["tool_agent"],
            trainer_config=DictConfigWrap(config=self.config),
            server_manager=self.server,
            tokenizer=self.tok,
            processor=None,
            hf_model_type="qwen3",
            dataset_cls=self.dataset_cls,
            data_config=DictConfigWrap(self.config.data),
            tools=ToolListWrap(self.tools),
        )

    async def run(self, loop: Any, conv: Conversation) -> tuple[float, Any]:
        _CANNED.clear()
        _CANNED.update(conv.outputs)
        self.server.reset(conv)
        sampling_params = {"temperature": 1.0, "top_p": 1.0, "top_k": -1, "logprobs": True}
        t0 = clock()
        output = await loop.run(
            sampling_params,
            raw_prompt=[dict(m) for m in conv.prompt],
            tools_kwargs={},
            extra_info={},
            index=0,
        )
        elapsed = clock() - t0
        if self.server.turn != conv.turns:
            raise SystemExit(f"verl made {self.server.turn} generations, expected {conv.turns}")
        return elapsed, output


def load_verl(tok: Any, workdir: Path) -> tuple[VerlSide | None, str]:
    try:
        return VerlSide(tok, workdir), ""
    except ImportError as exc:
        return None, f"verl is not installed here ({exc}); only uniagent was timed"


# ----------------------------------------------------------------------------- host env


async def start_host_env(conv: Conversation) -> Any:

    env = open_env({"type": "host"})
    await env.start()
    for name, content in conv.files.items():
        await env.write_file(name, content)
    return env


# ----------------------------------------------------------------------------- driver


@dataclass
class Row:
    turns: int
    size: str
    tool_tokens: float
    assistant_tokens: float
    uniagent: float  # ms per turn (start_cache + run)
    loop_only: float
    start_cache: float  # ms per episode
    verl: float | None
    verl_init: float | None  # ms per episode: building the ToolAgentLoop (not timed above)
    host: float | None
    same_ids: bool | None


def ms_per_turn(samples: list[float], turns: int) -> float:
    return statistics.median(samples) / turns * 1e3


def same_as_verl(cache: Rollout, output: Any) -> bool:
    ids = list(output.prompt_ids) + list(output.response_ids)
    return ids == cache.context_ids and list(output.response_mask) == cache.response_mask


async def bench_row(
    tok: Any, turns: int, size: str, repeats: int, verl: VerlSide | None, host: bool
) -> Row:
    conv = make_conversation(tok, turns, size)
    env = MemoryEnv(conv.outputs)
    ours: list[float] = []
    loop_only: list[float] = []
    prompt: list[float] = []
    theirs: list[float] = []
    init: list[float] = []
    same: bool | None = None
    for rep in range(repeats + 1):  # rep 0: warm-up
        gc.collect()
        run = await run_uniagent(tok, conv, env)
        if rep:
            ours.append(run.total)
            loop_only.append(run.loop)
            prompt.append(run.total - run.loop)
        if verl is not None:
            gc.collect()
            t0 = clock()
            loop = verl.make_loop(turns)
            if rep:
                init.append(clock() - t0)
            gc.collect()
            elapsed, output = await verl.run(loop, conv)
            if rep:
                theirs.append(elapsed)
            same = same_as_verl(run.cache, output) if same is None else same
    host_samples: list[float] = []
    if host:
        host_env = await start_host_env(conv)
        try:
            for rep in range(repeats + 1):
                gc.collect()
                run = await run_uniagent(tok, conv, host_env)
                if rep:
                    host_samples.append(run.total)
        finally:
            await host_env.close()
    tool_tokens = statistics.median(
        len(tok.encode(out, add_special_tokens=False))
        for cmd, out in conv.outputs.items()
        if cmd != SUBMIT_COMMAND
    )
    return Row(
        turns=turns,
        size=size,
        tool_tokens=tool_tokens,
        assistant_tokens=statistics.median(len(ids) for ids in conv.ids),
        uniagent=ms_per_turn(ours, turns),
        loop_only=ms_per_turn(loop_only, turns),
        start_cache=ms_per_turn(prompt, 1),
        verl=ms_per_turn(theirs, turns) if theirs else None,
        verl_init=ms_per_turn(init, 1) if init else None,
        host=ms_per_turn(host_samples, turns) if host_samples else None,
        same_ids=same,
    )


async def profile_uniagent(tok: Any, turns: int, repeats: int, top: int) -> None:
    conv = make_conversation(tok, turns, "long")
    env = MemoryEnv(conv.outputs)
    await run_uniagent(tok, conv, env)  # warm-up
    profiler = cProfile.Profile()
    for _ in range(repeats):
        profiler.enable()
        await run_uniagent(tok, conv, env)
        profiler.disable()
    out = io.StringIO()
    stats = pstats.Stats(profiler, stream=out)
    stats.sort_stats("tottime").print_stats(top)
    stats.sort_stats("cumulative").print_stats(top)
    print(f"\ncProfile of uniagent, T={turns}, 300-token outputs, {repeats} episodes:")
    print(out.getvalue())


def print_table(rows: list[Row], verl_note: str, host: bool) -> None:
    head = (
        f"{'turns':>5}  {'tool output':<14} {'uniagent':>9} {'loop only':>10} "
        f"{'verl':>9} {'verl/uniagent':>14} {'verl/loop':>10}"
    )
    if host:
        head += f" {'uniagent+bash':>14}"
    print(head + f"  | {'start_cache':>11} {'verl init':>10}")
    print(f"{'(ms per turn)':>{len(head)}}  | {'(ms per episode)':>22}")
    for r in rows:
        label = f"{r.size} ({r.tool_tokens:.0f} tok)"
        verl = f"{r.verl:9.3f}" if r.verl is not None else f"{'-':>9}"
        ratio = f"{r.verl / r.uniagent:13.1f}x" if r.verl is not None else f"{'-':>14}"
        ratio += f" {r.verl / r.loop_only:9.1f}x" if r.verl is not None else f" {'-':>10}"
        line = f"{r.turns:>5}  {label:<14} {r.uniagent:9.3f} {r.loop_only:10.3f} {verl} {ratio}"
        if host:
            line += f" {r.host:14.3f}" if r.host is not None else f" {'-':>14}"
        init = f"{r.verl_init:10.1f}" if r.verl_init is not None else f"{'-':>10}"
        print(line + f"  | {r.start_cache:11.1f} {init}")
    if verl_note:
        print(verl_note)


async def main_async(args: argparse.Namespace) -> None:
    os.environ.pop(CHECK_ENV, None)  # the debug exactness check re-renders every turn
    tok = load_qwen3_tokenizer()
    with tempfile.TemporaryDirectory(prefix="uniagent-bench-loop-") as tmp:
        verl, verl_note = load_verl(tok, Path(tmp)) if not args.no_verl else (None, "")
        if args.no_verl:
            verl_note = "(verl not timed: --no-verl)"
        rows = []
        for turns in args.turns:
            for size in ("short", "long"):
                rows.append(await bench_row(tok, turns, size, args.repeats, verl, args.host))

    import transformers

    versions = f"python {platform.python_version()}, transformers {transformers.__version__}"
    if verl is not None:
        versions += f", verl {verl.version}"
    print(
        f"Framework overhead per turn; {versions}; {os.cpu_count()} CPUs.\n"
        "Instant scripted model (pre-tokenized ids) and an instant in-memory env (a fake with\n"
        "AgentEnv's run_action: no bash, framework overhead only); real Qwen3 tokenizer and\n"
        f"chat template; assistant turns ~{rows[0].assistant_tokens:.0f} tokens with one "
        f"hermes tool call.\nMedian of {args.repeats} episodes per row after a warm-up; "
        f"clock: {CLOCKS[args.clock][0]}.\n"
        "uniagent = start_cache + AgentInteraction.run; loop only = AgentInteraction.run;\n"
        "verl = ToolAgentLoop.run (verl builds its prompt inside run); verl/loop = verl over\n"
        "loop only. start_cache and verl init (building the ToolAgentLoop) are per episode."
    )
    if verl is not None:
        same = all(r.same_ids for r in rows)
        print(
            "Final ids and masks identical between uniagent and verl: "
            + (
                "yes, every row"
                if same
                else "NO (see rows: "
                + ", ".join(f"T={r.turns} {r.size}" for r in rows if not r.same_ids)
                + ")"
            )
        )
    if args.host:
        print("uniagent+bash: the same loop against a real host AgentEnv (bash runs `cat`).")
    print()
    print_table(rows, verl_note, args.host)
    if args.profile:
        await profile_uniagent(tok, max(args.turns), args.repeats, args.profile_top)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, nargs="+", default=[10, 50, 100])
    parser.add_argument("--repeats", type=int, default=7, help="timed episodes per row")
    parser.add_argument(
        "--clock",
        choices=sorted(CLOCKS),
        default="wall",
        help="wall: perf_counter; cpu: process_time (all threads of this process; steadier "
        "when other processes load the machine)",
    )
    parser.add_argument("--host", action="store_true", help="also run a real host AgentEnv")
    parser.add_argument("--no-verl", action="store_true", help="time uniagent only")
    parser.add_argument("--profile", action="store_true", help="cProfile uniagent's loop")
    parser.add_argument("--profile-top", type=int, default=25, help="functions to list")
    args = parser.parse_args()
    global clock
    clock = CLOCKS[args.clock][1]
    asyncio.run(main_async(args))


if __name__ == "__main__":
    main()
