"""Per-turn cost of Rollout.append_messages vs a full chat-template re-render.

Run: ``python bench/tokenize.py`` (add ``--turns 10,50,100,200 --repeats 5``).

Builds one long tool-calling conversation with the real Qwen3 tokenizer (~150-token
assistant turns, ~300-token tool outputs) and times, at the given turn numbers:

- ``append_messages``: Rollout's incremental tokenization of one tool result;
- ``re-render``: ``apply_chat_template(all messages, tokenize=True)``, what a naive loop does;
- ``verl``: verl 0.9.1's Continuous Token builder (``merge_context_tokens`` +
  ``align_response_metadata``, i.e. ``AgentLoopBase.ct_merge_context_msg``), when verl
  is importable.

Each figure is the median over a window of turns around the turn number and over the
repeats. Prints a table in ms and the ratios. Figures, not assertions.
"""

from __future__ import annotations

import os
import sys

if __name__ == "tokenize":
    # A sibling script in bench/ put this folder on sys.path and something imported the
    # stdlib module `tokenize` (inspect, linecache and transformers do): load the real
    # module and let the import system hand that one out instead of this file.
    import importlib.util
    import sysconfig

    _spec = importlib.util.spec_from_file_location(
        "tokenize", os.path.join(sysconfig.get_paths()["stdlib"], "tokenize.py")
    )
    assert _spec is not None and _spec.loader is not None
    _real = importlib.util.module_from_spec(_spec)
    sys.modules["tokenize"] = _real
    _spec.loader.exec_module(_real)
else:
    # Run as a script: drop this folder from the import path so that `import tokenize`
    # finds the stdlib module, not this file.
    _HERE = os.path.dirname(os.path.abspath(__file__))
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != _HERE]

import argparse
import random
import statistics
import time
from pathlib import Path
from typing import Any

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "execute_bash",
            "description": "Run a bash command in the sandbox and return its output.",
            "parameters": {
                "type": "object",
                "properties": {"command": {"type": "string", "description": "the command"}},
                "required": ["command"],
            },
        },
    }
]
_VOCAB = """the file function return value error test module import class self path line
config data result output input check update fix patch repo commit branch index
token model server request response cache build install run debug trace"""
WORDS = _VOCAB.split()


def words(rng: random.Random, n: int) -> str:
    """Pseudo-random prose, roughly one token per word."""
    return " ".join(rng.choice(WORDS) for _ in range(n))


def tool_output(rng: random.Random, tokens: int) -> str:
    """Something like command output: paths, numbers and words, ~``tokens`` tokens."""
    lines = []
    while sum(len(line.split()) * 2 for line in lines) < tokens:
        lines.append(f"src/{rng.choice(WORDS)}/{rng.choice(WORDS)}.py:{rng.randint(1, 999)}: ")
        lines[-1] += words(rng, 8)
    return "\n".join(lines)


def assistant(rng: random.Random, turn: int) -> dict[str, Any]:
    return {
        "role": "assistant",
        "content": f"<think>\n{words(rng, 90)}\n</think>\n\n{words(rng, 25)}",
        "tool_calls": [
            {
                "type": "function",
                "function": {
                    "name": "execute_bash",
                    "arguments": {"command": f"grep -rn {rng.choice(WORDS)} src/ | head -{turn}"},
                },
            }
        ],
    }


def generated_ids(tok: Any, message: dict[str, Any]) -> list[int]:
    """What a model emits for ``message``: the template's text for that turn, tokenized."""
    call = message["tool_calls"][0]["function"]
    args = '{"command": "' + call["arguments"]["command"] + '"}'
    text = (
        message["content"]
        + '\n<tool_call>\n{"name": "'
        + call["name"]
        + '", "arguments": '
        + args
        + "}\n</tool_call><|im_end|>"
    )
    return tok.encode(text, add_special_tokens=False)


def median_ms(samples: list[float]) -> float:
    return statistics.median(samples) * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", default="10,50,100,200")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--window", type=int, default=5, help="turns timed around each point")
    args = parser.parse_args()
    try:
        import uniagent  # noqa: F401
    except ImportError:  # running from a checkout without an install
        sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "core" / "src"))
    # Imported here, not at the top: this file must stay importable as a stand-in for
    # the stdlib `tokenize` without pulling in uniagent (see above).
    from uniagent.rollout import Rollout
    from uniagent.testing.tokenizers import load_qwen3_tokenizer

    points = sorted({int(x) for x in args.turns.split(",")})
    max_turn = max(points) + args.window
    window = {
        t: set(range(max(1, t - args.window // 2), t - args.window // 2 + args.window))
        for t in points
    }

    tok = load_qwen3_tokenizer()
    try:
        from verl.utils.tokenizer.continuous_token_wiring import create_continuous_token_builder

        verl_builder = create_continuous_token_builder(tok, model_family="qwen3")
    except ImportError:
        verl_builder = None

    ours: dict[int, list[float]] = {t: [] for t in points}
    verl: dict[int, list[float]] = {t: [] for t in points}
    full: dict[int, list[float]] = {t: [] for t in points}
    sizes: dict[str, list[int]] = {"assistant": [], "tool": []}
    for rep in range(args.repeats):
        rng = random.Random(rep)
        messages: list[dict[str, Any]] = [
            {"role": "system", "content": "You are a software engineer working in a sandbox."},
            {"role": "user", "content": "Fix the failing test. " + words(rng, 60)},
        ]
        cache = Rollout.start(tok, messages, TOOLS)
        v_ids = list(cache.prompt_ids)
        v_mask: list[int] = []
        v_lp: list[float] = []
        for turn in range(1, max_turn + 1):
            msg = assistant(rng, turn)
            ids = generated_ids(tok, msg)
            lps = [-0.1] * len(ids)
            cache.append_generation(ids, lps, message=msg)
            previous = [*messages, msg]
            tool = {"role": "tool", "content": tool_output(rng, 300)}
            messages = [*previous, tool]
            if rep == 0 and turn < 30:
                sizes["assistant"].append(len(ids))
                sizes["tool"].append(len(tok.encode(tool["content"], add_special_tokens=False)))
            point = next((t for t in points if turn in window[t]), None)

            t0 = time.perf_counter()
            cache.append_messages([tool])
            t1 = time.perf_counter()
            if point is not None:
                ours[point].append(t1 - t0)

            if verl_builder is not None:
                v_ids += ids
                v_mask += [1] * len(ids)
                v_lp += lps
                t0 = time.perf_counter()
                merged = verl_builder.merge_context_tokens(previous, messages, v_ids, tools=TOOLS)
                v_mask, v_lp = verl_builder.align_response_metadata(merged, v_mask, v_lp)
                t1 = time.perf_counter()
                v_ids = merged.token_ids
                if point is not None:
                    verl[point].append(t1 - t0)

            if point is not None and (rep == 0 or turn == point):
                t0 = time.perf_counter()
                tok.apply_chat_template(
                    messages,
                    tools=TOOLS,
                    add_generation_prompt=True,
                    tokenize=True,
                    return_dict=False,
                )
                full[point].append(time.perf_counter() - t0)
        report = cache.check_exactness()
        if not report.ok:
            raise SystemExit("the benchmarked conversation is not exact:\n" + report.summary())
        if verl_builder is not None and v_ids != cache.context_ids:
            print("note: verl's ids differ from ours on this conversation", file=sys.stderr)

    print(
        f"Qwen3 tokenizer; assistant turns ~{statistics.median(sizes['assistant']):.0f} tokens, "
        f"tool outputs ~{statistics.median(sizes['tool']):.0f} tokens; medians over "
        f"{args.window} turns x {args.repeats} repeats; final context "
        f"{cache.context_length} tokens; exactness ok"
    )
    head = f"{'turn':>5} {'context':>8} {'append_messages':>16} {'re-render':>10} {'ratio':>7}"
    if verl_builder is not None:
        head += f" {'verl 0.9.1':>11} {'verl/ours':>9}"
    print(head)
    lengths = cache.turn_context_lengths
    for t in points:
        a, f = median_ms(ours[t]), median_ms(full[t])
        row = f"{t:>5} {lengths[t - 1]:>8} {a:>13.3f} ms {f:>7.2f} ms {f / a:>6.0f}x"
        if verl_builder is not None:
            v = median_ms(verl[t])
            row += f" {v:>8.3f} ms {v / a:>8.1f}x"
        print(row)
    if verl_builder is None:
        print("(verl not importable: its builder was not timed)")


if __name__ == "__main__":
    main()
