#!/usr/bin/env bash
# Install the OpenMMLab stack used by the detection/segmentation configs:
#   mmcv 2.1.0 (built from source, with compiled ops), mmengine 0.10.7,
#   mmdet 3.3.0, mmsegmentation 1.2.2 (+ ftfy, regex, pycocotools).
#
# Idempotent and cached: the ~25 min mmcv build happens once per torch version and build kind; its
# wheel is kept in $NALAFORMER_CACHE/wheels. A re-run with everything in place takes seconds.
#
# CPU or CUDA ops (nalaformer/mmcv_build.py decides, and says why): with nvcc for torch's CUDA major
# version and a visible GPU (or MMCV_CUDA_ARCH), mmcv is built with CUDA ops for those architectures
# (FORCE_CUDA=1, TORCH_CUDA_ARCH_LIST), cached per torch + CUDA version + architectures; otherwise with
# CPU ops, and the log says what a GPU detection run would need. The verify step runs the ops on the
# device they were built for.
#
# Environment:
#   PYTHON            interpreter to install into (default: python3)
#   NALAFORMER_CACHE  cache root (default: ~/.cache/nalaformer)
#   MAX_JOBS          parallel compile jobs for the mmcv build (default: 2)
#   MMCV_CUDA_ARCH    CUDA architectures to build for, e.g. '8.0;9.0' (default: the visible GPUs')
#   MMCV_FORCE_REBUILD=1  ignore a cached wheel / installed mmcv and build again
set -euo pipefail

PYTHON=${PYTHON:-python3}
CACHE_ROOT=${NALAFORMER_CACHE:-$HOME/.cache/nalaformer}
MAX_JOBS=${MAX_JOBS:-2}
MMCV_VERSION=2.1.0
# mmdet 3.3 / mmseg 1.2 require mmcv>=2.0,<2.2 and mmengine>=0.7.1,<1.0.
REQUIREMENTS=(
    "mmengine==0.10.7"
    "mmdet==3.3.0"
    "mmsegmentation==1.2.2"
    ftfy                        # imported by mmseg.utils, not declared by mmseg
    regex                       # likewise
    pycocotools                 # mmdet's CocoMetric
    "opencv-python<5"           # mmcv 2.1 predates OpenCV 5
    # torch needs >=77.0.3; mmengine's mmdet::/mmseg:: config inheritance needs
    # pkg_resources, which setuptools 81 removed.
    "setuptools>=77.0.3,<81"
)

log() { echo "[install_openmmlab] $*"; }
die() { echo "[install_openmmlab] ERROR: $*" >&2; exit 1; }
pip_main() { "$PYTHON" -m pip "$@"; }

START=$SECONDS
"$PYTHON" -c 'import torch' 2>/dev/null || die "$PYTHON cannot import torch; install the core requirements first"
read -r PY_EXE TORCH_VERSION PY_TAG < <("$PYTHON" -c \
    'import sys, torch; print(sys.executable, torch.__version__, "cp%d%d" % sys.version_info[:2])')
log "python: $PY_EXE (torch $TORCH_VERSION)"

# CPU or CUDA ops: MMCV_BUILD, FORCE_CUDA, TORCH_CUDA_ARCH_LIST, MMCV_CACHE_TAG, MMCV_PLAN_NOTE.
# (Run as a file: only the standard library and torch are needed, not the installed package.)
PLAN=$("$PYTHON" "$(dirname "$0")/../nalaformer/mmcv_build.py" plan) || die "could not decide the mmcv build"
eval "$PLAN"
export MMCV_BUILD
log "mmcv build: $MMCV_PLAN_NOTE"

# The compiled ops are tied to the torch ABI (and CUDA version and architectures), hence the key.
WHEEL_DIR=$CACHE_ROOT/wheels/torch-$TORCH_VERSION-$PY_TAG-$MMCV_CACHE_TAG
SDIST_DIR=$CACHE_ROOT/sdist
mkdir -p "$WHEEL_DIR" "$SDIST_DIR"

# Everything that must hold at the end; also the fast-path check of a re-run.
verify() {
    "$PYTHON" - <<'EOF'
import importlib.metadata as md
import sys

import numpy as np
import torch
import torchvision

from mmcv.ops import RoIAlign, nms
import mmcv, mmdet, mmengine, mmseg
import mmseg.utils  # noqa: F401  (needs ftfy and regex)
import warnings
with warnings.catch_warnings():
    warnings.simplefilter('ignore')  # its deprecation notice
    import pkg_resources  # noqa: F401  (mmengine's mmdet::/mmseg:: config inheritance)

boxes = torch.tensor([[0., 0., 10., 10.], [1., 1., 10., 10.], [20., 20., 30., 30.]])
scores = torch.tensor([0.9, 0.8, 0.7])
_, keep = nms(boxes, scores, iou_threshold=0.5)
assert keep.tolist() == [0, 2], f'nms kept {keep.tolist()}, expected [0, 2]'

feat = torch.arange(2 * 3 * 8 * 8, dtype=torch.float32).reshape(2, 3, 8, 8)
rois = torch.tensor([[0., 1., 1., 6., 5.], [1., 0., 2., 7., 7.]])
out = RoIAlign((2, 2), spatial_scale=1.0, sampling_ratio=2, aligned=True)(feat, rois)
ref = torchvision.ops.roi_align(feat, rois, (2, 2), spatial_scale=1.0, sampling_ratio=2, aligned=True)
assert out.shape == (2, 3, 2, 2) and torch.allclose(out, ref), 'RoIAlign disagrees with torchvision'

import os
from mmcv.ops import get_compiling_cuda_version
if os.environ.get('MMCV_BUILD') == 'cuda':  # the ops on the device they were built for
    assert get_compiling_cuda_version() != 'not available', 'mmcv was meant to have CUDA ops but has CPU ops only'
    if torch.cuda.is_available():
        _, keep = nms(boxes.cuda(), scores.cuda(), iou_threshold=0.5)
        assert keep.tolist() == [0, 2], f'CUDA nms kept {keep.tolist()}'
        out = RoIAlign((2, 2), spatial_scale=1.0, sampling_ratio=2, aligned=True)(feat.cuda(), rois.cuda())
        assert torch.allclose(out.cpu(), ref, atol=1e-5), 'CUDA RoIAlign disagrees with torchvision'

from packaging.version import Version
setuptools_version = md.version('setuptools')
assert Version('77.0.3') <= Version(setuptools_version) < Version('81'), \
    f'setuptools {setuptools_version} is outside >=77.0.3,<81'

import cv2
print('versions: ' + ', '.join(f'{name} {version}' for name, version in [
    ('torch', torch.__version__), ('mmcv', mmcv.__version__), ('mmengine', mmengine.__version__),
    ('mmdet', mmdet.__version__), ('mmseg', mmseg.__version__), ('numpy', np.__version__),
    ('opencv', cv2.__version__), ('setuptools', setuptools_version)]))
EOF
}

installed_version() {
    "$PYTHON" -c "import importlib.metadata as md, sys; print(md.version(sys.argv[1]))" "$1" 2>/dev/null || true
}

all_installed() {
    [[ $(installed_version mmcv) == "$MMCV_VERSION" && $(installed_version mmengine) == 0.10.7 \
       && $(installed_version mmdet) == 3.3.0 && $(installed_version mmsegmentation) == 1.2.2 ]]
}

mmcv_ops_work() {  # the installed mmcv has the ops of the planned kind
    [[ $(installed_version mmcv) == "$MMCV_VERSION" ]] && "$PYTHON" -c '
import os, sys
from mmcv.ops import RoIAlign, get_compiling_cuda_version, nms
sys.exit(os.environ["MMCV_BUILD"] == "cuda" and get_compiling_cuda_version() == "not available")' 2>/dev/null
}

build_mmcv() {
    local tmp venv sdist real
    tmp=$(mktemp -d "${TMPDIR:-/tmp}/mmcv-build.XXXXXX")
    # shellcheck disable=SC2064  # expand $tmp now
    trap "rm -rf '$tmp'" EXIT

    # mmcv's setup.py imports pkg_resources and needs setuptools<70 to build, while the main
    # environment keeps a newer one: build in a throwaway venv that still sees torch.
    venv=$tmp/venv
    log "creating build venv $venv (setuptools<70, wheel, ninja)"
    "$PYTHON" -m venv --system-site-packages "$venv"
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check "setuptools<70" wheel ninja

    sdist=$(find "$SDIST_DIR" -name "mmcv-$MMCV_VERSION.tar.gz" | head -n1)
    if [[ -z $sdist ]]; then
        log "downloading mmcv $MMCV_VERSION sdist into $SDIST_DIR"
        # pip prepares the sdist's metadata, which runs setup.py: hence the build venv.
        "$venv/bin/python" -m pip download --disable-pip-version-check --no-deps \
            --no-binary :all: --no-build-isolation "mmcv==$MMCV_VERSION" -d "$SDIST_DIR"
        sdist=$SDIST_DIR/mmcv-$MMCV_VERSION.tar.gz
    fi

    # torch >= 2.10 headers need C++20 but mmcv's setup.py passes -std=c++17. torch's
    # cpp_extension compiles with $CXX (default `c++`); setuptools' fallback uses gcc/g++.
    # Every one of those names goes through a wrapper that rewrites the standard.
    mkdir -p "$tmp/bin"
    for name in c++ g++ gcc cc; do
        real=$(command -v "$name") || continue
        cat > "$tmp/bin/$name" <<EOF
#!/usr/bin/env bash
args=()
for a in "\$@"; do
    case "\$a" in -std=c++14|-std=c++17|-std=gnu++14|-std=gnu++17) a=-std=c++20 ;; esac
    args+=("\$a")
done
exec "$real" "\${args[@]}"
EOF
        chmod +x "$tmp/bin/$name"
    done
    [[ -x $tmp/bin/c++ ]] || die "no C++ compiler found (apt-get install g++)"

    log "building mmcv $MMCV_VERSION with $MMCV_BUILD ops (MAX_JOBS=$MAX_JOBS; ~25 min on 2 cores for CPU ops)"
    # A CPU build hides the GPUs (CUDA_VISIBLE_DEVICES=''), so mmcv's setup.py never tries nvcc.
    local device_env=(FORCE_CUDA=0 CUDA_VISIBLE_DEVICES=)
    if [[ $MMCV_BUILD == cuda ]]; then
        device_env=(FORCE_CUDA=1 "TORCH_CUDA_ARCH_LIST=$TORCH_CUDA_ARCH_LIST")
    fi
    (
        cd "$tmp"
        env PATH="$tmp/bin:$venv/bin:$PATH" CXX="$tmp/bin/c++" CC="$tmp/bin/gcc" \
            MMCV_WITH_OPS=1 "${device_env[@]}" MAX_JOBS="$MAX_JOBS" \
            "$venv/bin/python" -m pip wheel -v --disable-pip-version-check \
            --no-build-isolation --no-deps "$sdist" -w "$tmp/wheel"
    ) || die "mmcv build failed (log above)"

    local built
    built=$(find "$tmp/wheel" -name "mmcv-$MMCV_VERSION-*.whl" | head -n1)
    [[ -n $built ]] || die "mmcv build produced no wheel"
    # Copy then rename so an interrupted copy never looks like a cached wheel.
    cp "$built" "$WHEEL_DIR/.partial.whl"
    mv "$WHEEL_DIR/.partial.whl" "$WHEEL_DIR/$(basename "$built")"
    rm -rf "$tmp"
    trap - EXIT
    log "cached $WHEEL_DIR/$(basename "$built") ($(( SECONDS - START ))s so far)"
}

if [[ ${MMCV_FORCE_REBUILD:-0} != 1 ]] && all_installed && verify; then
    log "OpenMMLab stack already installed and working ($(( SECONDS - START ))s)"
    exit 0
fi

# Installed packages never change torch, torchvision or numpy behind the project's back.
CONSTRAINTS=$(mktemp "${TMPDIR:-/tmp}/openmmlab-constraints.XXXXXX")
"$PYTHON" - > "$CONSTRAINTS" <<'EOF'
import importlib.metadata as md
for name in ('torch', 'torchvision', 'numpy'):
    try:
        print(f'{name}=={md.version(name)}')
    except md.PackageNotFoundError:
        pass
EOF

if [[ ${MMCV_FORCE_REBUILD:-0} != 1 ]] && mmcv_ops_work; then
    log "mmcv $MMCV_VERSION with ops already installed"
    MMCV_REQ="mmcv==$MMCV_VERSION"
else
    WHEEL=$(find "$WHEEL_DIR" -name "mmcv-$MMCV_VERSION-$PY_TAG-*.whl" | head -n1)
    if [[ -z $WHEEL || ${MMCV_FORCE_REBUILD:-0} == 1 ]]; then
        build_mmcv
        WHEEL=$(find "$WHEEL_DIR" -name "mmcv-$MMCV_VERSION-$PY_TAG-*.whl" | head -n1)
    else
        log "using cached wheel $WHEEL"
    fi
    MMCV_REQ=$WHEEL
fi

if [[ ${MMCV_FORCE_REBUILD:-0} == 1 ]]; then
    pip_main install --disable-pip-version-check --force-reinstall --no-deps "$MMCV_REQ"
fi
log "installing ${MMCV_REQ##*/} ${REQUIREMENTS[*]}"
pip_main install --disable-pip-version-check -c "$CONSTRAINTS" "$MMCV_REQ" "${REQUIREMENTS[@]}"
rm -f "$CONSTRAINTS"

log "verifying"
verify || die "OpenMMLab stack is installed but does not work (see the traceback above)"
[[ $MMCV_BUILD == cuda ]] || log "note: $MMCV_PLAN_NOTE"
log "done in $(( SECONDS - START ))s"
