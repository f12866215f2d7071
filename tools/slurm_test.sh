#!/usr/bin/env bash
# Evaluation on a Slurm cluster, one srun task per GPU, any task (classification, segmentation, detection);
# the signature and environment of mmdetection's and mmsegmentation's slurm_test.sh.
#
#   tools/slurm_test.sh PARTITION JOB_NAME CONFIG CHECKPOINT [tools/test.py options]
#   GPUS=16 tools/slurm_test.sh PARTITION eval-t CONFIG CHECKPOINT --tta      # two nodes of 8 GPUs
#
# Environment: GPUS (8, the total), GPUS_PER_NODE (GPUS, at most 8), CPUS_PER_TASK (5), SRUN_ARGS (extra srun
# arguments), PYTHON (python3).
set -euo pipefail
if [ $# -lt 4 ]; then
    echo "usage: [GPUS=8] $0 PARTITION JOB_NAME CONFIG CHECKPOINT [tools/test.py options]" >&2
    exit 2
fi
PARTITION=$1
JOB_NAME=$2
CONFIG=$3
CHECKPOINT=$4
shift 4
GPUS=${GPUS:-8}
GPUS_PER_NODE=${GPUS_PER_NODE:-$((GPUS < 8 ? GPUS : 8))}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
# shellcheck disable=SC2086  # SRUN_ARGS is a list of arguments
PYTHONPATH="$ROOT:${PYTHONPATH:-}" exec srun -p "$PARTITION" --job-name="$JOB_NAME" \
    --gres=gpu:"$GPUS_PER_NODE" --ntasks="$GPUS" --ntasks-per-node="$GPUS_PER_NODE" \
    --cpus-per-task="${CPUS_PER_TASK:-5}" --kill-on-bad-exit=1 ${SRUN_ARGS:-} \
    "${PYTHON:-python3}" -u "$ROOT/tools/test.py" "$CONFIG" "$CHECKPOINT" --launcher=slurm "$@"
