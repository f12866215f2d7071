"""The SR mechanism study: its measurement on NaLa-SR's global slot, and the resumable one-command tool at a
tiny budget (the real study is the lead's run: see tools/analysis/study.py sr)."""
import json
import subprocess
import sys
from pathlib import Path

import pytest
import timm
import torch

from nalaformer.analysis.entropy import capture_kernel_qk
from nalaformer.analysis.mechanism import measure_global_slots, sweep_norms

ROOT = Path(__file__).resolve().parents[1]
TOOL = ROOT / 'tools' / 'analysis' / 'study.py'
PICO = dict(embed_dim=24, depths=(1, 1), num_heads=2, window_size=8)


@pytest.mark.parametrize('kernel', ['nala', 'relu', 'softmax'])
def test_measure_global_slots(kernel):
    """One row per residual group over all tokens of the (window-padded) image; ReLU's entropy ignores |q|
    (positively homogeneous), NaLa's and softmax's do not."""
    torch.manual_seed(0)
    model = timm.create_model('nalasr_light', upscale=2, attn_types=kernel, **PICO)
    rows = measure_global_slots(model, torch.rand(2, 3, 12, 16), kernel, sweep_norms(), sweep_queries=8, chunk=64)
    assert [row['stage'] for row in rows] == [0, 1]
    assert all(row['tokens'] == 16 * 16 and row['heads'] == 2 and row['head_dim'] == 12 for row in rows)
    for row in rows:
        if kernel == 'relu':
            assert row['sweep_max_abs_change'] < 1e-9
        else:
            assert row['sweep_max_abs_change'] > 1e-3


def test_capture_kernel_qk_names_a_kernel_that_did_not_run():
    model = timm.create_model('nalasr_light', upscale=2, attn_types=('nala', 'none'), **PICO)
    q, k = capture_kernel_qk(model, model.groups[0].layers[0].global_attn.attn.kernel, torch.rand(1, 3, 8, 8))
    assert q.shape == k.shape == (1, 2, 64, 12)
    with pytest.raises(ValueError, match='did not run'):
        capture_kernel_qk(model, torch.nn.Identity(), torch.rand(1, 3, 8, 8))


@pytest.mark.slow
def test_study_runs_resumes_and_combines(tmp_path):
    work, out = tmp_path / 'work', tmp_path / 'study'
    command = [sys.executable, str(TOOL), 'sr', '--attn-types', 'nala', 'relu', '--seeds', '0', '--iters', '2',
               '--measure-size', '16', '--work-dir', str(work), '--out', str(out)]
    result = subprocess.run(command, capture_output=True, text=True, cwd=ROOT, timeout=1800)
    assert result.returncode == 0, result.stderr[-4000:]
    report = json.loads(out.with_suffix('.json').read_text())
    assert set(report['cells']) == {'nala', 'relu'} and len(report['runs']) == 2
    relu, nala = report['cells']['relu'], report['cells']['nala']
    assert relu['stages'][0]['sweep_max_abs_change']['mean'] < 1e-9 < nala['stages'][0]['sweep_max_abs_change']['mean']
    assert report['cells']['nala']['psnr']['n'] == 1 and report['verdicts'][0]['verdict'] == 'n/a'  # one seed
    assert out.with_suffix('.png').stat().st_size > 0 and '| relu | nala |' in out.with_suffix('.md').read_text()
    # a second run reuses the finished runs (no training), --combine only rewrites the outputs
    logs = {p: p.read_text() for p in work.glob('*/seed0/train.log')}
    assert len(logs) == 2
    assert subprocess.run(command, capture_output=True, cwd=ROOT, timeout=600).returncode == 0
    assert {p: p.read_text() for p in logs} == logs
    out.with_suffix('.json').unlink()
    assert subprocess.run(command + ['--combine'], capture_output=True, cwd=ROOT, timeout=600).returncode == 0
    assert json.loads(out.with_suffix('.json').read_text())['cells'].keys() == {'nala', 'relu'}
