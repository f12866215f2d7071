#!/usr/bin/env bash
# Distributed evaluation with torch's elastic launcher, any task (classification, segmentation, detection);
# the signature and environment of mmdetection's and mmsegmentation's dist_test.sh.
#
#   tools/dist_test.sh CONFIG CHECKPOINT GPUS [tools/test.py options, e.g. --tta --show-dir DIR]
#
# GPUS: processes on this node. Environment: NNODES (1), NODE_RANK (0), MASTER_ADDR (127.0.0.1),
# PORT (29500), PYTHON (python3).
set -euo pipefail
if [ $# -lt 3 ]; then
    echo "usage: $0 CONFIG CHECKPOINT GPUS [tools/test.py options]" >&2
    exit 2
fi
CONFIG=$1
CHECKPOINT=$2
GPUS=$3
shift 3
ROOT=$(cd "$(dirname "$0")/.." && pwd)
PYTHONPATH="$ROOT:${PYTHONPATH:-}" exec "${PYTHON:-python3}" -m torch.distributed.run \
    --nnodes="${NNODES:-1}" --node_rank="${NODE_RANK:-0}" --master_addr="${MASTER_ADDR:-127.0.0.1}" \
    --nproc_per_node="$GPUS" --master_port="${PORT:-29500}" \
    "$ROOT/tools/test.py" "$CONFIG" "$CHECKPOINT" --launcher pytorch "$@"
