#!/usr/bin/env bash
# Fill .gpu_bundle/ (git-ignored) with the wheels that scripts/gpu_acceptance.sh installs on the GPU machine,
# which has no network: Python 3.12 x86-64 wheels of what its image lacks (mmengine, mmcv, mmsegmentation and
# their small dependencies) or has in an unknown version (timm), pinned to the versions tested here.
#
#   bash scripts/prepare_gpu_bundle.sh        (here, with access to PyPI; about 8 MB; re-run after changing a pin)
#
# mmcv is mmcv-lite 2.1.0: mmcv 2.1.0 without compiled ops (what MMCV_WITH_OPS=0 builds from mmcv's source),
# since its ops cannot be built for the GPU machine's torch here and a build there would take most of the run.
# UperNet needs none of them (nalaformer.mmcv_build.allow_mmcv_lite). The image's own numpy, opencv, rich,
# regex, scipy, matplotlib and huggingface_hub are used as they are.
# Prints the bundle's size and what travels to the GPU machine in all (the limit is 64 MiB).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
BUNDLE=.gpu_bundle
WHEELS=(
    timm==1.0.31                                                # the image's timm: version unknown
    mmengine==0.10.7 mmcv-lite==2.1.0 mmsegmentation==1.2.2     # scripts/install_openmmlab.sh's versions
    addict==2.4.0 yapf==0.43.0 platformdirs==4.14.9 termcolor==3.3.0  # what mmengine and mmcv need beyond the image
    ftfy==6.3.1 wcwidth==0.7.0 prettytable==3.18.0              # likewise for mmsegmentation
    setuptools==80.10.2   # pkg_resources (removed in setuptools 81): mmengine resolves mmseg:: config bases with it
)

tmp=$(mktemp -d "$BUNDLE.partial.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
"$PYTHON" -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    -d "$tmp" "${WHEELS[@]}"
found=$(find "$tmp" -name '*.whl' | wc -l)
[[ $found == "${#WHEELS[@]}" ]] || { echo "expected ${#WHEELS[@]} wheels, got $found" >&2; exit 1; }
rm -rf "$BUNDLE"
mv "$tmp" "$BUNDLE"
trap - EXIT

"$PYTHON" - "$BUNDLE" <<'EOF'
import os, subprocess, sys
bundle = sys.argv[1]
files = subprocess.run(['git', 'ls-files', '-z', '--cached', '--others', '--exclude-standard'],
                       capture_output=True, text=True, check=True).stdout.split('\0')
tree = sum(os.path.getsize(f) for f in files if os.path.isfile(f))
wheels = sum(os.path.getsize(os.path.join(bundle, f)) for f in os.listdir(bundle))
total = (tree + wheels) / 2 ** 20
print(f'{bundle}: {len(os.listdir(bundle))} wheels, {wheels / 2 ** 20:.1f} MiB; working tree {tree / 2 ** 20:.1f} MiB; '
      f'travels: {total:.1f} MiB of 64')
sys.exit(total > 64)
EOF
