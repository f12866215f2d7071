#!/usr/bin/env bash
# GPU acceptance of the fused NaLa kernel: one run of under 10 minutes on one H200 that tests the kernels in
# compiled mode, times them against the PyTorch op and SDPA, times NaLaFormer-T's and UperNet-T's training on
# them, and says which acceptance target is met, not met or not measured. Needs no network.
#
# Prepare, here (needs PyPI; again after changing a pinned version):
#     bash scripts/prepare_gpu_bundle.sh        # wheels into .gpu_bundle/ (git-ignored, ~8 MB)
# Run, from the repository root, on a machine with a CUDA GPU whose python3 (3.12) has torch, triton, pytest,
# pytest-timeout, numpy, scipy, matplotlib, tqdm, opencv and huggingface_hub (the bundle brings the rest):
#     OUT=runs/gpu_acceptance bash scripts/gpu_acceptance.sh
# With this workplace's device tool ($OUT is set there; .gpu_bundle/ is ignored, so it must be carried):
#     run(command='bash scripts/gpu_acceptance.sh', carry=['.gpu_bundle'], timeout_s=600)
#
# Steps in this order, each under `timeout` with its budget in seconds, Triton and inductor compilation included.
# The budgets add up to more than a device call allows: the run stops starting steps at DEADLINE seconds (570 by
# default) and cuts the last step's budget to what is left, so the summary and the archive always get written;
# a step left out is reported 'not measured: did not run'. The steps the fused-kernel decision needs come first.
#   install 30        the bundle's wheels into $SITE (pip --target, no index); nalaformer runs from this tree
#   environment 40    versions, the GPU, every import the steps need (cold imports took over 15 s on an H200)
#   kernels 90        fused kernel vs PyTorch op vs SDPA, forward and forward+backward, bf16, at the shape of
#                     NaLaFormer-T's stage 1 (1 head of 64): 64 x 3,136, 8 x 16,384 and 2 x 65,536 tokens
#   train_bf16 120    NaLaFormer-T training step at 224, batch 64, AMP bf16, PyTorch op vs fused kernel
#                     (img/s; max memory in a fresh process each; losses)
#   peers 45          NaLaFormer-T (all-NaLa, released hybrid) beside Swin-T, ConvNeXt-T and EfficientViT-B2
#                     (benchmark.py model --peers t), fp32 eager inference at 224, 512, 1024 and 2048 (batch 32,
#                     8, 2, 1): latency and where NaLaFormer overtakes each (the CPU figures: README, docs/peers_cpu)
#   peers_train 45    the same models' fp32 training step at 224 (batch 32) and 512 (batch 8)
#   kernel_tests 200  tests/test_triton_kernels.py on the GPU, compiled (TRITON_INTERPRET=0); after the timings,
#                     which only a GPU can give (the benchmark's --check compares fused with the PyTorch op first)
#   peers_compiled 90 all-NaLa, ConvNeXt-T and EfficientViT-B2 at 224, batch 32, eager and torch.compile'd
#   upernet_bf16 55   UperNet-T at 512x512, batch 2, AMP bf16: 2 + 5 training iterations (random data)
#   train_fp16 50     the train_bf16 step with AMP fp16 (GradScaler), 1 + 3 steps each: losses finite
#   sr 120            the whole NaLa-SR x2 network (nalasr_light), batch 1, LR 128x128 and 256x288 (16,384 and
#                     73,728 tokens), inference and training step, global slot nala / SDPA / explicit softmax /
#                     none, fp32 and bf16: CUDA max memory and latency (tools/analysis/benchmark.py sr; a run that
#                     does not fit the GPU is reported 'out of memory', not accounted on fake tensors, for time)
#   peers_profile 120 inference of all-NaLa on the PyTorch op ('torch:') and on the default ('auto': the fused
#                     kernel in CUDA inference), ConvNeXt-T and EfficientViT-B2 at 224 and 2048 (batch 32, 1), each
#                     with its GPU time per operator class (--profile): where the time goes
#   peers_s 60        the inference of the peers step for NaLaFormer-S (--peers s)
#   peers_memory 100  the T peers and all-NaLa on the op at 2048, batch 1: CUDA max memory (a fresh process each)
#   peers_xt 50       the inference of the peers step for NaLaFormer-XT (--peers xt)
#   summary 10        tools/analysis/gpu_acceptance_summary.py (after DEADLINE)
# STEPS="kernel_tests:300 peers_s" runs only the steps named there (install, environment and the summary always
# run), a step with ':SECONDS' under that budget instead: a second run that measures what a first one did not reach; KERNEL_TESTS="<expression>" selects kernel
# tests the same way (pytest's -k).
# The benchmarks run with --keep-going: a method or model that fails has its error in its row (and the log), the
# others are still measured.
# Writes to $OUT: summary.txt and summary.json (figures, each target and check, every step's report),
# run.log (everything printed), benchmark_kernels.png, benchmark_sr.png and steps.tar.gz (the steps' own outputs).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:?set OUT to the folder for the results}
SITE=${SITE:-/tmp/gpu_acceptance_site}
DEADLINE=${DEADLINE:-570}  # seconds for every step before the summary: a device call may run 600
mkdir -p "$OUT"
WORK=$(mktemp -d "${TMPDIR:-/tmp}/gpu_acceptance.XXXXXX")  # the steps' outputs, kept as $OUT/steps.tar.gz
trap 'rm -rf "$WORK"' EXIT
LOG="$OUT/run.log"
: >"$LOG"
export TRITON_INTERPRET=0 PYTHONUNBUFFERED=1 TQDM_DISABLE=1
unset NALAFORMER_NALA_BACKEND  # unprefixed models run on the default backend, 'auto'

step() {  # step NAME BUDGET COMMAND...: COMMAND under timeout, its output logged; exit code and time to steps.tsv
    local name=$1 budget=$2 start=$SECONDS rc left=$((DEADLINE - SECONDS))
    shift 2
    if [[ -n ${STEPS:-} && " install environment summary " != *" $name "* ]]; then
        local chosen="" word
        for word in $STEPS; do
            [[ $word == "$name" || $word == "$name":* ]] && chosen=$word
        done
        if [[ -z $chosen ]]; then
            echo "== $name: not selected (STEPS=$STEPS)" | tee -a "$LOG"
            return
        fi
        [[ $chosen == *:* ]] && budget=${chosen#*:}
    fi
    if ((left < 5)); then
        echo "== $name: not run, the run's $DEADLINE s are used up" | tee -a "$LOG"
        return
    fi
    ((budget > left)) && budget=$left
    echo "== $name (at most $budget s, $(date +%T)): $*" | tee -a "$LOG"
    timeout -k 5 "$budget" "$@" 2>&1 | tee -a "$LOG"
    rc=${PIPESTATUS[0]}
    printf '%s\t%d\t%d\t%d\n' "$name" "$rc" $((SECONDS - start)) "$budget" >>"$WORK/steps.tsv"
    echo "== $name: exit $rc after $((SECONDS - start)) s" | tee -a "$LOG"
}
PEERS=(python3 tools/analysis/benchmark.py model --device cuda --no-memory --keep-going)
TRAIN=(python3 tools/analysis/benchmark.py model --device cuda --mode train --sizes 224 --batch-sizes 64
       --models nalaformer_t fused:nalaformer_t --keep-going)

[[ -d .gpu_bundle ]] || echo "no .gpu_bundle/: run scripts/prepare_gpu_bundle.sh where PyPI is reachable and carry it" \
    | tee -a "$LOG"
step install 30 python3 -m pip install -q --no-index --no-deps --no-compile --target "$SITE" --upgrade .gpu_bundle/*.whl
if [[ ! -e nalaformer/kernels ]]; then  # where the package expects its kernels (setup.py maps kernels/ there)
    ln -s ../kernels nalaformer/kernels
    trap 'rm -rf "$WORK" nalaformer/kernels' EXIT
fi
export PYTHONPATH="$SITE:$PWD"

nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,clocks.max.mem,driver_version --format=csv 2>&1 | tee -a "$LOG"
step environment 40 python3 -c '
import sys, torch, triton, timm, pytest
import nalaformer.kernels.nala_triton
from nalaformer.mmcv_build import allow_mmcv_lite
lite = allow_mmcv_lite()
import mmcv, mmengine, mmseg, mmseg.utils
print("python", sys.version.split()[0], "torch", torch.__version__, "triton", triton.__version__,
      "timm", timm.__version__, "mmcv", mmcv.__version__, "(no compiled ops)" if lite else "",
      "mmengine", mmengine.__version__, "mmseg", mmseg.__version__,
      "| CUDA:", torch.cuda.is_available() and torch.cuda.get_device_name())'

step kernels 90 python3 tools/analysis/benchmark.py kernels --device cuda --dtype bfloat16 --check \
    --shapes 64x1x3136x64 8x1x16384x64 2x1x65536x64 --methods fused torch sdpa --warmup 5 --repeats 20 --keep-going \
    --out-dir "$WORK/kernels"
step train_bf16 120 "${TRAIN[@]}" --amp bf16 --warmup 3 --repeats 10 \
    --out-json "$WORK/train_bf16.json" --out-png "$WORK/train_bf16.png"
step peers 45 "${PEERS[@]}" --peers t --sizes 224 512 1024 2048 --batch-sizes 32 8 2 1 --warmup 2 --repeats 5 \
    --out-json "$WORK/peers.json" --out-png "$WORK/peers.png"
step peers_train 45 "${PEERS[@]}" --peers t --mode train --sizes 224 512 --batch-sizes 32 8 --warmup 2 --repeats 5 \
    --out-json "$WORK/peers_train.json" --out-png "$WORK/peers_train.png"
step kernel_tests 200 python3 -m pytest -q tests/test_triton_kernels.py ${KERNEL_TESTS:+-k "$KERNEL_TESTS"} \
    --junitxml="$WORK/kernel_tests.xml"
step peers_compiled 90 python3 tools/analysis/benchmark.py model --device cuda --no-memory --keep-going --compile \
    --models "nalaformer_t(attn_types='nala')" convnext_tiny efficientvit_b2 --sizes 224 --batch-sizes 32 \
    --warmup 3 --repeats 5 \
    --out-json "$WORK/peers_compiled.json" --out-png "$WORK/peers_compiled.png"
step upernet_bf16 55 python3 tools/analysis/benchmark.py segmentor --device cuda --amp bf16 --size 512 \
    --warmup 2 --repeats 5 --out-json "$WORK/upernet_bf16.json"
step train_fp16 50 "${TRAIN[@]}" --amp fp16 --warmup 1 --repeats 3 --no-memory \
    --out-json "$WORK/train_fp16.json" --out-png "$WORK/train_fp16.png"
step sr 120 python3 tools/analysis/benchmark.py sr --device cuda --amp none bf16 --sizes 128x128 256x288 \
    --account none --warmup 1 --repeats 3 --keep-going --out-dir "$WORK/sr"
NALA_T=("torch:nalaformer_t(attn_types='nala')" "nalaformer_t(attn_types='nala')")  # the PyTorch op; the default
T_PEERS=(nalaformer_t swin_tiny_patch4_window7_224 convnext_tiny efficientvit_b2)
step peers_profile 120 python3 tools/analysis/benchmark.py model --device cuda --no-memory --keep-going --profile \
    --models "${NALA_T[@]}" convnext_tiny efficientvit_b2 --sizes 224 2048 --batch-sizes 32 1 --warmup 2 --repeats 5 \
    --out-json "$WORK/peers_profile.json" --out-png "$WORK/peers_profile.png"
step peers_s 60 "${PEERS[@]}" --peers s --sizes 224 512 1024 2048 --batch-sizes 32 8 2 1 --warmup 2 \
    --repeats 5 --out-json "$WORK/peers_s.json" --out-png "$WORK/peers_s.png"
step peers_memory 100 python3 tools/analysis/benchmark.py model --device cuda --keep-going \
    --models "${NALA_T[@]}" "${T_PEERS[@]}" --sizes 2048 --batch-sizes 1 --warmup 2 --repeats 5 \
    --out-json "$WORK/peers_memory.json" --out-png "$WORK/peers_memory.png"
step peers_xt 50 "${PEERS[@]}" --peers xt --sizes 224 512 1024 2048 --batch-sizes 32 8 2 1 --warmup 2 \
    --repeats 5 --out-json "$WORK/peers_xt.json" --out-png "$WORK/peers_xt.png"
# The summary runs whatever time is left.
DEADLINE=$((SECONDS + 10)) step summary 10 python3 tools/analysis/gpu_acceptance_summary.py "$WORK" --out-dir "$OUT"

cp "$WORK/kernels/benchmark_kernels.png" "$WORK/sr/benchmark_sr.png" "$OUT/" 2>/dev/null
tar -czf "$OUT/steps.tar.gz" -C "$WORK" .
echo "wrote $OUT: $(ls "$OUT" | tr '\n' ' ')" | tee -a "$LOG"
