# Shared settings of the two training scripts (sourced, not run). Override any of them
# from the environment, e.g. `MODEL=/models/Qwen3-8B N_GPUS=8 bash train_grpo.sh`.
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
MODEL=${MODEL:-Qwen/Qwen3-4B}
DATA_DIR=${DATA_DIR:-$HOME/data/uniagent-swe-tiny}
TRAIN_FILE=${TRAIN_FILE:-$DATA_DIR/train.parquet}
VAL_FILE=${VAL_FILE:-$TRAIN_FILE}
AGENT_LOOP_YAML=${AGENT_LOOP_YAML:-$HERE/agent_loop.yaml}
AGENT_CONFIG=${AGENT_CONFIG:-$HERE/agent.yaml}
PROMPT_LENGTH=${PROMPT_LENGTH:-4096}      # system prompt + tool schemas + task
RESPONSE_LENGTH=${RESPONSE_LENGTH:-16384} # the whole episode: model and tool tokens
N_SAMPLES=${N_SAMPLES:-8}                 # GRPO group size (samples per prompt)
AGENT_WORKERS=${AGENT_WORKERS:-8}         # agent-loop workers; each runs concurrency // workers
N_GPUS=${N_GPUS:-8}
NNODES=${NNODES:-1}
PROJECT=${PROJECT:-uniagent}
# GRPO whose group statistics ignore masked samples (infrastructure failures): registered
# with verl by uniagent's `verl.plugins` entry point. `grpo` is verl's plain GRPO.
ADV_ESTIMATOR=${ADV_ESTIMATOR:-uniagent_grpo}

# The data step: tasks (JSONL/Parquet) -> verl's Parquet columns. Done once.
prepare_data() {
    if [ -f "$TRAIN_FILE" ]; then
        return
    fi
    mkdir -p "$DATA_DIR"
    if [ ! -f "$DATA_DIR/tasks.jsonl" ]; then
        python3 "$HERE/../swe_tiny/make_tasks.py" "$DATA_DIR"
    fi
    uniagent data prepare "$DATA_DIR/tasks.jsonl" --config "$AGENT_CONFIG" \
        --agent-name uniagent --data-source swe_tiny --out "$TRAIN_FILE"
}
