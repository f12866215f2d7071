#!/usr/bin/env bash
# The GPU checks of the fused Triton kernels (kernels/) in one run, at most 9 minutes (one device call) on
# one H200: the benchmark at the sizes (batch 1, 2 heads) and at a training-like batch, a
# per-launcher time breakdown, a tuning sweep, then the kernel tests in compiled mode (timings
# first: they are what only a GPU can give).
#
#   OUT=runs/gpu_kernels bash scripts/gpu_kernel_checks.sh        (step limits: 110 + 60 + 200 + 170 s)
#
# Run from the repository root on a machine with a CUDA GPU whose python3 has torch, triton,
# timm, pytest, matplotlib and tqdm (the package itself is installed here without dependencies).
# Wheels in .device_wheels/ (git-ignored) are installed first, for a machine without network
# whose timm is too old:  pip download timm==1.0.31 --no-deps --only-binary :all: -d .device_wheels
# Writes run.log and three folders with benchmark_kernels.{json,png} to $OUT.
set -uo pipefail
OUT=${OUT:-runs/gpu_kernels}
mkdir -p "$OUT"
export TRITON_INTERPRET=0 PYTHONUNBUFFERED=1
LOG="$OUT/run.log"
BENCH=(python3 tools/analysis/benchmark_kernels.py --device cuda --dtype bfloat16)

step() { echo "== $* ($(date +%T))" | tee -a "$LOG"; }

step install
if compgen -G '.device_wheels/*.whl' >/dev/null; then
    python3 -m pip install -q --no-deps .device_wheels/*.whl 2>&1 | tee -a "$LOG"
fi
if ! python3 -m pip install -q --no-deps --no-build-isolation -e . >>"$LOG" 2>&1; then
    # No setuptools there: the source tree as it is, with kernels/ where the package expects it.
    ln -sfn ../kernels nalaformer/kernels
    export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
fi
python3 -c 'import nalaformer.kernels.nala_triton, timm; print("nalaformer ok, timm", timm.__version__)' 2>&1 \
    | tee -a "$LOG" | grep -q 'nalaformer ok' || exit 1
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,clocks.max.mem --format=csv 2>&1 | tee -a "$LOG"
python3 -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__)' 2>&1 | tee -a "$LOG"

step 'benchmark: batch 1, 2 heads, N = 3,136 .. 82,944, errors and breakdown'
timeout 110 "${BENCH[@]}" --check --breakdown --out-dir "$OUT/b1h2" 2>&1 | grep -v '%|' | tee -a "$LOG"

step 'benchmark: batch 16, 4 heads (64 heads in all), N = 3,136 and 16,384'
timeout 60 "${BENCH[@]}" --batch 16 --heads 4 --sides 56 128 --breakdown --out-dir "$OUT/b16h4" 2>&1 \
    | grep -v '%|' | tee -a "$LOG"

step 'tuning sweep: block_n x warps x programs (132 SMs on an H200: 1, 2, 4, 8 per SM), bf16 products'
timeout 200 "${BENCH[@]}" --batch 16 --heads 4 --sides 56 128 --methods nala_triton --sweep --repeats 5 \
    --sweep-dot bf16 --sweep-programs 132 264 528 1056 --out-dir "$OUT/sweep" 2>&1 | grep -v '%|' | tee -a "$LOG"

step 'kernel tests, compiled'
timeout 170 python3 -m pytest -q -p no:cacheprovider tests/test_triton_kernels.py 2>&1 | tail -n 40 | tee -a "$LOG"
step done
