"""tools/analysis/benchmark.py: a tiny end-to-end run, its statistics and its error handling."""
import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BENCHMARK = ROOT / 'tools' / 'analysis' / 'benchmark.py'


@pytest.fixture(scope='module')
def bench():
    spec = importlib.util.spec_from_file_location('benchmark_tool', BENCHMARK)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run(*args):
    return subprocess.run([sys.executable, BENCHMARK, *map(str, args)], capture_output=True, text=True)


def test_tiny_run_writes_json_and_png(tmp_path):
    out_json, out_png = tmp_path / 'bench.json', tmp_path / 'bench.png'
    # deit's 16x16 patches cannot cover an 8-pixel-wide image: that entry must be 'n/a', not a crash
    proc = run('--models', 'nalaformer_xt', 'deit_small_patch16_224', '--sizes', '32', '16x8', '--repeats', 1,
               '--warmup', 1, '--device', 'cpu', '--out-json', out_json, '--out-png', out_png)
    assert proc.returncode == 0, proc.stderr
    report = json.loads(out_json.read_text())
    rows = {(r['model'], tuple(r['size'])): r for r in report['results']}
    assert set(rows) == {('nalaformer_xt', (32, 32)), ('deit_small_patch16_224', (32, 32)),
                         ('nalaformer_xt', (16, 8)), ('deit_small_patch16_224', (16, 8))}
    failed = rows[('deit_small_patch16_224', (16, 8))]
    assert failed['status'] == 'n/a' and failed['reason'] and failed['median_ms'] is None
    for key in [('nalaformer_xt', (32, 32)), ('deit_small_patch16_224', (32, 32)), ('nalaformer_xt', (16, 8))]:
        row = rows[key]
        assert row['status'] == 'ok' and row['median_ms'] > 0 and row['throughput'] > 0 and row['peak_mb'] > 0
        assert len(row['load_before']) == 3
    assert rows[('nalaformer_xt', (32, 32))]['latency_ratio'] == 1.0
    assert report['meta']['baseline'] == 'nalaformer_xt' and report['meta']['mode'] == 'infer'
    assert len(report['growth']['nalaformer_xt']) == 1
    assert out_png.read_bytes()[:8] == b'\x89PNG\r\n\x1a\n'


def test_train_mode_step(bench):
    import torch
    from nalaformer.analysis.models import ModelSpec
    step = bench.make_step(ModelSpec('nalaformer_xt'), (32, 32), 2, 'train', torch.device('cpu'))
    step()
    assert bench.timed(step, torch.device('cpu')) > 0


@pytest.mark.parametrize('args, message', [
    (['--models', 'swin_tiny_patch4_windw7_224'], 'swin_tiny_patch4_window7_224'),
    (['--sizes', '224x'], 'bad image size'),
    (['--sizes', '224', '448', '--batch-sizes', '1', '2', '3'], '--batch-sizes'),
    (['--models', 'convnext_tiny', '--baseline', 'resnet50'], '--baseline'),
])
def test_user_errors_exit_2(args, message):
    proc = run(*args, '--repeats', 1)
    assert proc.returncode == 2 and message in proc.stderr and 'Traceback' not in proc.stderr


def test_statistics(bench):
    stats = bench.summarize([4.0, 1.0, 3.0, 2.0, 5.0], batch=2)
    assert (stats['median_ms'], stats['q1_ms'], stats['q3_ms'], stats['min_ms'], stats['max_ms']) == (3, 2, 4, 1, 5)
    assert stats['throughput'] == pytest.approx(2 / 3e-3)
    rows = [dict(model=m, size=[s, s], batch=b, median_ms=t, peak_mb=mem)
            for m, s, b, t, mem in [('lin', 100, 4, 8.0, 10.0), ('lin', 200, 1, 8.0, 40.0),
                                    ('quad', 100, 4, 8.0, 10.0), ('quad', 200, 1, 32.0, 160.0)]]
    bench.add_ratios(rows, 'lin')
    assert [r['latency_ratio'] for r in rows] == [1, 1, 1, 4] and rows[3]['memory_ratio'] == 4
    growth = bench.growth(rows)
    # per image: 'lin' 2 ms -> 8 ms for 4x pixels; 'quad' 2 ms -> 32 ms
    assert growth['lin'][0]['latency_per_image_per_4x_pixels'] == pytest.approx(4)
    assert growth['quad'][0]['latency_per_image_per_4x_pixels'] == pytest.approx(16)
    assert growth['lin'][0]['peak_memory_per_4x_pixels'] == pytest.approx(4)
