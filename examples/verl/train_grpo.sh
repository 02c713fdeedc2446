#!/usr/bin/env bash
# GRPO with verl's synchronous trainer and UniAgentLoop (one rollout, then one update).
# verl's v1 trainer (trainer.use_v1=True, main_ppo's default) moves samples through
# TransferQueue; uniagent's replay buffer adds the agent/... metrics to every step's.
#
#   pip install 'uniagent[verl]' uniagent-tools-swe 'verl[vllm]==0.9.1'   # training machines
#   bash examples/verl/train_grpo.sh [more hydra overrides]
#
# Every flag below exists in verl 0.9.1's config (checked by core/tests/verl).
set -euo pipefail
source "$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/common.sh"
prepare_data

python3 -m verl.trainer.main_ppo \
    algorithm.adv_estimator="$ADV_ESTIMATOR" \
    algorithm.use_kl_in_reward=False \
    data.train_files="$TRAIN_FILE" \
    data.val_files="$VAL_FILE" \
    data.train_batch_size=16 \
    data.max_prompt_length="$PROMPT_LENGTH" \
    data.max_response_length="$RESPONSE_LENGTH" \
    data.filter_overlong_prompts=True \
    data.truncation=error \
    data.return_raw_chat=True \
    +data.apply_chat_template_kwargs.enable_thinking=False \
    actor_rollout_ref.model.path="$MODEL" \
    actor_rollout_ref.model.use_remove_padding=True \
    actor_rollout_ref.actor.optim.lr=1e-6 \
    actor_rollout_ref.actor.ppo_mini_batch_size=8 \
    actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=1 \
    actor_rollout_ref.actor.use_dynamic_bsz=True \
    actor_rollout_ref.actor.use_kl_loss=False \
    actor_rollout_ref.actor.entropy_coeff=0 \
    actor_rollout_ref.rollout.name=vllm \
    actor_rollout_ref.rollout.mode=async \
    actor_rollout_ref.rollout.n="$N_SAMPLES" \
    actor_rollout_ref.rollout.temperature=1.0 \
    actor_rollout_ref.rollout.tensor_model_parallel_size=1 \
    actor_rollout_ref.rollout.gpu_memory_utilization=0.6 \
    actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=1 \
    actor_rollout_ref.rollout.calculate_log_probs=True \
    actor_rollout_ref.rollout.multi_turn.enable=True \
    actor_rollout_ref.rollout.agent.num_workers="$AGENT_WORKERS" \
    actor_rollout_ref.rollout.agent.default_agent_loop=uniagent \
    actor_rollout_ref.rollout.agent.agent_loop_config_path="$AGENT_LOOP_YAML" \
    actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=1 \
    trainer.use_v1=True \
    trainer.v1.sampler.custom_sampler.path=pkg://uniagent.verl.replay_buffer \
    trainer.v1.sampler.custom_sampler.name=UniAgentReplayBuffer \
    trainer.logger='["console"]' \
    trainer.project_name="$PROJECT" \
    trainer.experiment_name=swe-tiny-grpo \
    trainer.nnodes="$NNODES" \
    trainer.n_gpus_per_node="$N_GPUS" \
    trainer.val_before_train=True \
    trainer.test_freq=10 \
    trainer.save_freq=20 \
    trainer.total_epochs=20 \
    "$@"
