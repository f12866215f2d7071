#!/usr/bin/env bash
# Training on a Slurm cluster, one srun task per GPU, any task (classification, segmentation, detection).
#
#   tools/slurm_train.sh PARTITION JOB_NAME CONFIG GPUS [tools/train.py options]
#   tools/slurm_train.sh PARTITION JOB_NAME CONFIG 16      # two nodes of 8 GPUs
#
# Environment: GPUS_PER_NODE (GPUS, at most 8), CPUS_PER_TASK (5), SRUN_ARGS (extra srun arguments),
# MASTER_PORT (29500).
set -euo pipefail
if [ $# -lt 4 ]; then
    echo "usage: $0 PARTITION JOB_NAME CONFIG GPUS [tools/train.py options]" >&2
    exit 2
fi
PARTITION=$1
JOB_NAME=$2
CONFIG=$3
GPUS=$4
shift 4
GPUS_PER_NODE=${GPUS_PER_NODE:-$((GPUS < 8 ? GPUS : 8))}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
# shellcheck disable=SC2086  # SRUN_ARGS is a list of arguments
PYTHONPATH="$ROOT:${PYTHONPATH:-}" exec srun -p "$PARTITION" --job-name="$JOB_NAME" \
    --gres=gpu:"$GPUS_PER_NODE" --ntasks="$GPUS" --ntasks-per-node="$GPUS_PER_NODE" \
    --cpus-per-task="${CPUS_PER_TASK:-5}" --kill-on-bad-exit=1 ${SRUN_ARGS:-} \
    python -u "$ROOT/tools/train.py" "$CONFIG" --launcher slurm "$@"
