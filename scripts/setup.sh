#!/usr/bin/env bash
# Set up a fresh machine for nalaformer: every install step, idempotent and cached.
#
#   bash scripts/setup.sh
#
# Installs into the Python that runs it (PYTHON, default python3; use a venv/conda env if
# you prefer): the pinned core requirements, this package (editable), the OpenMMLab stack
# with mmcv built from source (cached wheel, ~25 min once, seconds afterwards) and timm's
# own model test-suite (from timm's sdist, used by tests/test_timm_suite.py).
# Environment: PYTHON, NALAFORMER_CACHE (default ~/.cache/nalaformer), SKIP_OPENMMLAB=1.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
CACHE=${NALAFORMER_CACHE:-$HOME/.cache/nalaformer}
export PYTHON NALAFORMER_CACHE=$CACHE
log() { echo "[setup] $*"; }
START=$SECONDS

log "core requirements into $("$PYTHON" -c 'import sys; print(sys.executable)')"
"$PYTHON" -m pip install --quiet --disable-pip-version-check -r requirements.txt
"$PYTHON" -m pip install --quiet --disable-pip-version-check --no-deps --no-build-isolation -e .

log "ONNX export extra (onnx, onnxruntime, onnxscript)"
"$PYTHON" -m pip install --quiet --disable-pip-version-check --no-build-isolation -e ".[export]"

if [ "${SKIP_OPENMMLAB:-0}" != 1 ]; then
    bash scripts/install_openmmlab.sh
fi

# timm's tests/ ship only in its sdist; keep the copy matching the installed timm.
TIMM_VERSION=$("$PYTHON" -c 'import timm; print(timm.__version__)')
TIMM_TESTS=$CACHE/timm-$TIMM_VERSION-tests
if [ ! -f "$TIMM_TESTS/test_models.py" ]; then
    log "fetching timm $TIMM_VERSION test-suite"
    tmp=$(mktemp -d)
    "$PYTHON" -m pip download --quiet --disable-pip-version-check --no-deps --no-binary :all: \
        "timm==$TIMM_VERSION" -d "$tmp"
    tar -xzf "$tmp"/timm-"$TIMM_VERSION".tar.gz -C "$tmp"
    mkdir -p "$CACHE"
    rm -rf "$TIMM_TESTS" && mv "$tmp/timm-$TIMM_VERSION/tests" "$TIMM_TESTS"
    rm -rf "$tmp"
fi

# Real images for the end-to-end training checks: Debian's Fashion-MNIST (tests/test_real_data.py), the
# mate-backgrounds nature photographs and opencv-doc's butterfly.png (super-resolution, tests/test_sr_train.py).
declare -A REAL_DATA=(
    [dataset-fashion-mnist]=/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz
    [mate-backgrounds]=/usr/share/backgrounds/mate/nature/Garden.jpg
    [opencv-doc]=/usr/share/doc/opencv-doc/examples/dnn_superres/butterfly.png
)
MISSING=()
for package in "${!REAL_DATA[@]}"; do
    [ -f "${REAL_DATA[$package]}" ] || MISSING+=("$package")
done
if [ ${#MISSING[@]} -gt 0 ]; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
        log "installing ${MISSING[*]} (Debian)"
        apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${MISSING[@]}" >/dev/null
    else
        log "WARNING: ${MISSING[*]} not installed (needs root: apt-get install ${MISSING[*]});" \
            "the real-data tests (tests/test_real_data.py, tests/test_sr_train.py) will fail without them"
    fi
fi

"$PYTHON" - <<'PY'
import timm, torch, nalaformer
assert 'nalaformer_t' in timm.list_models('nalaformer_*'), 'nalaformer models are not registered in timm'
print(f'[setup] ok: torch {torch.__version__}, timm {timm.__version__}, nalaformer {nalaformer.__version__}')
PY
log "done in $((SECONDS - START)) s"
