#!/usr/bin/env bash
# Distributed training on one or more nodes with torch's elastic launcher, any task (classification,
# segmentation, detection); the signature and environment of mmdetection's and mmsegmentation's dist_train.sh.
#
#   tools/dist_train.sh CONFIG GPUS [tools/train.py options]
#   NNODES=2 NODE_RANK=0 MASTER_ADDR=10.1.1.1 tools/dist_train.sh CONFIG 8   # first node; NODE_RANK=1 on the second
#
# GPUS: processes on this node. Environment: NNODES (1), NODE_RANK (0), MASTER_ADDR (127.0.0.1),
# PORT (29500), PYTHON (python3).
set -euo pipefail
if [ $# -lt 2 ]; then
    echo "usage: $0 CONFIG GPUS [tools/train.py options]" >&2
    exit 2
fi
CONFIG=$1
GPUS=$2
shift 2
ROOT=$(cd "$(dirname "$0")/.." && pwd)
PYTHONPATH="$ROOT:${PYTHONPATH:-}" exec "${PYTHON:-python3}" -m torch.distributed.run \
    --nnodes="${NNODES:-1}" --node_rank="${NODE_RANK:-0}" --master_addr="${MASTER_ADDR:-127.0.0.1}" \
    --nproc_per_node="$GPUS" --master_port="${PORT:-29500}" \
    "$ROOT/tools/train.py" "$CONFIG" --launcher pytorch "$@"
