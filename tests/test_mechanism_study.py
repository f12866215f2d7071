"""The mechanism study's pipeline (issue 18) at CI size: tools/analysis/study.py classification trains a softmax and
a ReLU pico NaLaFormer (one seed, three short epochs, conv mixers off) on real Fashion-MNIST with tools/train.py,
measures the trained q, k and writes its JSON, markdown and PNG; the measured mechanism must hold."""
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
SOURCE = Path('/usr/share/datasets/fashion-mnist')
sys.path.insert(0, str(ROOT))


def test_tie_rule_and_summary():
    from nalaformer.analysis.mechanism import compare, summarise

    def cell(*values):
        t = torch.tensor(values, dtype=torch.float64)
        return dict(mean=float(t.mean()), std=float(t.std()) if len(values) > 1 else 0.0, n=len(values))

    assert compare(cell(80.0, 81.0, 82.0), cell(80.5, 81.5, 82.5)) == 'tie'  # 0.5 apart, std 1
    assert compare(cell(85.0, 85.2, 85.4), cell(80.0, 80.2, 80.4)) == '>'
    assert compare(cell(80.0, 80.2, 80.4), cell(85.0, 85.2, 85.4)) == '<'
    assert compare(cell(85.0), cell(80.0)) == 'n/a'  # one seed: no spread to judge by
    runs = [dict(seed=s, top1=t, seconds=1.0, stages=[dict(tokens=4, spearman=r, pearson=r, sweep_change=0.0,
                                                           sweep_max_abs_change=0.0, sweep_mean_entropy=[1.0, 0.5]),
                                                      dict(tokens=1)])
            for s, t, r in ((0, 80.0, -0.2), (1, 82.0, -0.4))]
    summary = summarise(runs)
    assert summary['top1'] == dict(mean=81.0, std=pytest.approx(math.sqrt(2)), n=2)
    assert summary['stages'][0]['spearman']['mean'] == pytest.approx(-0.3)
    assert 'spearman' not in summary['stages'][1]  # one token: nothing measured


def test_table_goes_between_the_markers(tmp_path):
    from nalaformer.analysis.studies.runs import BEGIN, END, write_markdown

    doc = tmp_path / 'study.md'
    doc.write_text(f'# Title\n\ntext\n\n{BEGIN}\nPending.\n{END}\n\nafter\n')
    write_markdown(doc, '| table |\n')
    assert doc.read_text() == f'# Title\n\ntext\n\n{BEGIN}\n| table |\n{END}\n\nafter\n'
    write_markdown(doc, '| new |\n')  # idempotent: replaced, not appended
    assert doc.read_text().count(BEGIN) == 1 and '| new |' in doc.read_text() and '| table |' not in doc.read_text()
    fresh = tmp_path / 'fresh.md'
    write_markdown(fresh, '| t |\n')
    assert fresh.read_text() == '| t |\n'


def test_norm_invariant_kernels_sweep_flat_and_nala_not():
    """On the same random q, k: ReLU and const_power ignore |q| (exactly, up to rounding); softmax, NaLa do not."""
    import nalaformer  # noqa: F401
    from nalaformer.analysis.mechanism import measure_stages, sweep_norms
    import timm

    torch.manual_seed(0)
    results = {}
    for kernel in ('relu', 'const_power', 'softmax', 'nala'):
        model = timm.create_model('nalaformer_t', attn_types=kernel, conv_mixers=False, embed_dims=(16, 32, 48, 64),
                                  depths=(1, 1, 1, 1), num_heads=(1, 1, 1, 2), num_classes=10)
        torch.manual_seed(1)
        stages = measure_stages(model, torch.randn(2, 3, 32, 32), kernel, sweep_norms(steps=5), sweep_queries=16)
        assert [s['tokens'] for s in stages] == [64, 16, 4, 1] and 'spearman' not in stages[3]
        results[kernel] = stages[0]
    for kernel in ('relu', 'const_power'):
        assert results[kernel]['sweep_max_abs_change'] < 1e-9, (kernel, results[kernel])
    for kernel in ('softmax', 'nala'):
        assert results[kernel]['sweep_change'] < -0.01, (kernel, results[kernel])


@pytest.mark.slow
def test_mechanism_study_ci_size(tmp_path):
    assert (SOURCE / 'train-images-idx3-ubyte.gz').is_file(), \
        f'{SOURCE} is missing: run `bash scripts/setup.sh` (as root) or `apt-get install dataset-fashion-mnist`'
    work, out = tmp_path / 'work', tmp_path / 'out' / 'study'
    command = [sys.executable, str(ROOT / 'tools' / 'analysis' / 'study.py'), 'classification', '--attn-types',
               'softmax', 'relu',
               '--seeds', '0', '--conv-mixers', 'off', '--epochs', '3', '--train-per-class', '100',
               '--val-per-class', '20', '--measure-images', '8', '--work-dir', str(work), '--out', str(out)]
    result = subprocess.run(command, capture_output=True, text=True, cwd=ROOT, timeout=900)
    assert result.returncode == 0, (result.stdout[-3000:], result.stderr[-5000:])

    report = json.loads(Path(f'{out}.json').read_text())
    assert Path(f'{out}.png').stat().st_size > 0
    table = Path(f'{out}.md').read_text()
    assert 'tools/analysis/study.py classification --attn-types softmax relu' in table and '| off | softmax | 1 |' in table
    runs = {r['kernel']: r for r in report['runs']}
    assert set(runs) == {'softmax', 'relu'} and all(0.0 <= r['top1'] <= 100.0 for r in runs.values())
    # trained, tools/train.py wrote the epoch checkpoint the measurement read
    assert (work / 'fashion-mnist' / 'mixers_off' / 'softmax' / 'seed0' / 'epoch_3.pth').is_file()
    assert all(r['top1'] > 40.0 for r in runs.values()), runs  # learned something in 48 steps (chance: 10%)
    for kernel, run in runs.items():
        assert [s['tokens'] for s in run['stages']] == [64, 16, 4, 1], kernel
    # the mechanism on the trained weights: softmax entropy falls as |q| grows (stage 1, 64 tokens) ...
    softmax = runs['softmax']['stages'][0]
    assert softmax['spearman'] < 0, softmax
    assert softmax['sweep_change'] < 0, softmax
    # ... and ReLU linear attention's entropy does not depend on |q| at all, query by query
    for stage in runs['relu']['stages'][:3]:
        assert stage['sweep_max_abs_change'] < 1e-9, stage
    assert report['cells']['off']['relu']['stages'][0]['sweep_max_abs_change']['mean'] < 1e-9

    # resumable: a second call reuses the finished runs (no training) and rewrites the same table
    again = subprocess.run(command, capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert again.returncode == 0, again.stderr[-3000:]
    assert again.stdout.count('(done before)') == 2
    assert json.loads(Path(f'{out}.json').read_text())['cells'] == report['cells']

    # an interrupted training (here: stopped after epoch 2 of 3) resumes from its checkpoint to the same model
    run = work / 'fashion-mnist' / 'mixers_off' / 'relu' / 'seed0'
    (run / 'result.json').unlink()
    (run / 'epoch_3.pth').unlink()
    (run / 'last_checkpoint').write_text(str(run / 'epoch_2.pth'))
    resumed = subprocess.run(command, capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert resumed.stdout.count('(done before)') == 1 and 'resumed epoch: 2' in (run / 'train.log').read_text()
    again = {r['kernel']: r for r in json.loads(Path(f'{out}.json').read_text())['runs']}['relu']
    assert again['top1'] == pytest.approx(runs['relu']['top1'], abs=1e-6)
    assert again['stages'][0]['spearman'] == pytest.approx(runs['relu']['stages'][0]['spearman'], abs=1e-6)


def test_brightest_of_four_mosaics_have_one_bright_item(tmp_path):
    """The harder task: four items per 32x32 mosaic, one at full contrast (the label), three dimmed."""
    import numpy as np
    from PIL import Image

    from nalaformer.datasets import CLASSES, write_brightest_of_four
    written = write_brightest_of_four(tmp_path / 'mosaics', train_per_class=3, val_per_class=2)
    assert written == {'train': 3 * len(CLASSES), 'val': 2 * len(CLASSES)}
    for path in (tmp_path / 'mosaics' / 'train').glob('*/*.png'):
        image = np.asarray(Image.open(path), dtype=np.float32)
        assert image.shape == (32, 32)
        brightest = sorted(image[r:r + 16, c:c + 16].max() for r in (0, 16) for c in (0, 16))
        assert brightest[-1] > brightest[-2]  # the labelled item stands out
