"""A checkout that was never pip-installed imports and runs with only ``PYTHONPATH=<checkout>``: its top-level
``kernels/`` is reached as ``nalaformer.kernels``, as setup.py installs it."""
import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# In the fresh process, the editable install of this repository (setuptools' finder on sys.meta_path, put there by a
# .pth file) is taken away first: it would answer for nalaformer.kernels with this repository's folder.
PROBE = r'''
import sys
sys.meta_path[:] = [finder for finder in sys.meta_path if 'editable' not in getattr(finder, '__module__', '')]
import timm, torch
import nalaformer, nalaformer.kernels
from nalaformer.ops import ATTENTION_KERNELS
model = timm.create_model('nalaformer_xt', num_classes=3).eval()
with torch.no_grad():
    logits = model(torch.randn(1, 3, 64, 64))
assert torch.isfinite(logits).all()
print(nalaformer.__file__, nalaformer.kernels.__file__, tuple(logits.shape), sep='\n')
if 'nala_triton' in ATTENTION_KERNELS:
    print(sys.modules['nalaformer.kernels.nala_triton'].__file__)
'''


def checkout_copy(destination: Path) -> Path:
    """The files a checkout of this working tree has (tracked, and new ones git does not ignore), copied."""
    listed = subprocess.run(['git', 'ls-files', '--cached', '--others', '--exclude-standard', '-z'], cwd=ROOT,
                            capture_output=True, text=True, check=True).stdout.split('\0')
    for name in filter(None, listed):
        source = ROOT / name
        if source.is_file():  # a tracked file deleted in the working tree is not in a checkout of it
            target = destination / name
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target)
    return destination


def test_a_checkout_that_was_never_installed_imports_and_runs(tmp_path):
    copy = checkout_copy(tmp_path / 'checkout')
    assert not (copy / 'nalaformer' / 'kernels').exists()  # only setup.py's remap names it nalaformer.kernels
    env = {**os.environ, 'PYTHONPATH': str(copy), 'OMP_NUM_THREADS': '1'}
    run = subprocess.run([sys.executable, '-c', PROBE], cwd=tmp_path, env=env, capture_output=True, text=True,
                         timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    package, kernels, shape, *fused = run.stdout.split('\n')[:4]
    assert Path(package) == copy / 'nalaformer' / '__init__.py'
    assert Path(kernels) == copy / 'kernels' / '__init__.py'
    assert shape == '(1, 3)'
    if importlib.util.find_spec('triton') is not None:  # the fused kernels registered, from the copy's kernels/
        assert fused and Path(fused[0]) == copy / 'kernels' / 'nala_triton.py'
