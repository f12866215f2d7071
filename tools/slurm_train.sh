#!/usr/bin/env bash
# Training on a Slurm cluster, one srun task per GPU, any task (classification, segmentation, detection);
# the signature and environment of mmdetection's slurm_train.sh (mmsegmentation's, without WORK_DIR, works too).
#
#   tools/slurm_train.sh PARTITION JOB_NAME CONFIG [WORK_DIR] [tools/train.py options]
#   GPUS=16 tools/slurm_train.sh PARTITION upernet-t CONFIG work_dirs/upernet-t     # two nodes of 8 GPUs
#
# WORK_DIR: where logs and checkpoints go (default: work_dirs/<config name>). Environment: GPUS (8, the total),
# GPUS_PER_NODE (GPUS, at most 8), CPUS_PER_TASK (5), SRUN_ARGS (extra srun arguments), PYTHON (python3).
set -euo pipefail
if [ $# -lt 3 ]; then
    echo "usage: [GPUS=8] $0 PARTITION JOB_NAME CONFIG [WORK_DIR] [tools/train.py options]" >&2
    exit 2
fi
PARTITION=$1
JOB_NAME=$2
CONFIG=$3
shift 3
WORK_DIR_ARGS=()
if [ $# -gt 0 ] && [[ $1 != -* ]]; then
    if [[ $1 =~ ^[0-9]+$ ]]; then
        echo "error: the GPU count comes from the environment, not the 4th argument: GPUS=$1 $0 $PARTITION" \
             "$JOB_NAME $CONFIG WORK_DIR (a work dir named $1: pass ./$1)" >&2
        exit 2
    fi
    WORK_DIR_ARGS=("--work-dir=$1")
    shift
fi
GPUS=${GPUS:-8}
GPUS_PER_NODE=${GPUS_PER_NODE:-$((GPUS < 8 ? GPUS : 8))}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
# shellcheck disable=SC2086  # SRUN_ARGS is a list of arguments
PYTHONPATH="$ROOT:${PYTHONPATH:-}" exec srun -p "$PARTITION" --job-name="$JOB_NAME" \
    --gres=gpu:"$GPUS_PER_NODE" --ntasks="$GPUS" --ntasks-per-node="$GPUS_PER_NODE" \
    --cpus-per-task="${CPUS_PER_TASK:-5}" --kill-on-bad-exit=1 ${SRUN_ARGS:-} \
    "${PYTHON:-python3}" -u "$ROOT/tools/train.py" "$CONFIG" ${WORK_DIR_ARGS[@]+"${WORK_DIR_ARGS[@]}"} \
    --launcher=slurm "$@"
