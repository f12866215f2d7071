"""scripts/gpu_acceptance.sh's summary (tools/analysis/gpu_acceptance_summary.py) on fabricated and real step
outputs, and the script run with stubbed commands: it runs the steps whose outputs the summary reads, within the
time budget."""
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Tuple

import pytest

from analysis_tools import load_tool
from nalaformer.analysis.benchmarks import model as bench

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / 'scripts' / 'gpu_acceptance.sh'


@pytest.fixture(scope='module')
def summary_tool():
    return load_tool('gpu_acceptance_summary')


def kernel_row(batch, tokens, method, mode, ms, x_bound=None):
    return dict(batch=batch, heads=1, tokens=tokens, head_dim=64, method=method, mode=mode, status='ok', ms=ms,
                peak_mib=10.0, bandwidth_gbs=1000.0, x_bound=x_bound)


def training_report(amp, torch_row, fused_row):
    rows = [dict(model='nalaformer_t', size=[224, 224], batch=64, status='ok', **torch_row),
            dict(model='fused:nalaformer_t', size=[224, 224], batch=64, status='ok', **fused_row)]
    return dict(meta=dict(baseline='nalaformer_t', amp=amp, repeats=10, device_name='NVIDIA H200',
                          torch='2.11.0+cu130', timm='1.0.31'), results=rows)


def write_work(work: Path, files: dict, steps: dict):
    for name, content in files.items():
        path = work / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(content if isinstance(content, str) else json.dumps(content))
    (work / 'steps.tsv').write_text(''.join(f'{name}\t{rc}\t{seconds}\t{budget}\n'
                                            for name, (rc, seconds, budget) in steps.items()))


JUNIT = ('<?xml version="1.0" encoding="utf-8"?><testsuites><testsuite name="pytest" errors="0" failures="0" '
         'skipped="1" tests="12" time="80.0"></testsuite></testsuites>')
UPERNET = dict(meta=dict(size=[512, 512], batch=2, amp='bf16', mmcv_ops='stand-ins (mmcv-lite)'),
               result=dict(status='ok', median_ms=150.0, throughput=13.3, peak_mb=9000.0, losses=[5.1, 5.0],
                           final_loss=5.0, losses_finite=True))


def statuses(summary):
    return {o['name']: (o['status'], o['value']) for o in summary['targets'] + summary['checks']}


def test_a_complete_run_gives_each_target_and_check_with_its_figures(summary_tool, tmp_path):
    s = summary_tool
    kernels = dict(device='NVIDIA H200', dtype='bfloat16', peak_bandwidth_gbs=4800.0, rows=[
        kernel_row(2, 65536, 'torch', 'forward_backward', 10.0), kernel_row(2, 65536, 'fused', 'forward_backward', 1.5,
                                                                            x_bound=4.5),
        kernel_row(2, 65536, 'fused', 'forward', 0.5, x_bound=3.0), kernel_row(2, 65536, 'sdpa', 'forward', 3.0),
        kernel_row(64, 3136, 'torch', 'forward_backward', 1.8), kernel_row(64, 3136, 'fused', 'forward_backward', 2.0),
        kernel_row(8, 3136, 'torch', 'forward_backward', 0.1),  # another batch at 3,136 tokens: not the target's
    ])
    bf16 = training_report('bf16', dict(median_ms=64.0, throughput=1000.0, peak_mb=20000.0, final_loss=6.9,
                                        losses_finite=True),
                           dict(median_ms=45.7, throughput=1400.0, peak_mb=15000.0, final_loss=6.9, losses_finite=True))
    fp16 = training_report('fp16', dict(median_ms=60.0, throughput=1066.0, peak_mb=None, final_loss=6.9,
                                        losses_finite=True),
                           dict(median_ms=44.0, throughput=1454.0, peak_mb=None, final_loss=float('nan'),
                                losses_finite=False))
    peer_rows = [dict(model=m, size=[side, side], batch=b, status='ok', median_ms=ms) for m, side, b, ms in
                 [('nala', 224, 32, 32.0), ('nala', 1024, 2, 20.0), ('convnext_tiny', 224, 32, 16.0),
                  ('convnext_tiny', 1024, 2, 30.0)]]
    for row in peer_rows:
        row.update(throughput=row['batch'] * 1000 / row['median_ms'], latency_ratio=None)
    peers = dict(meta=dict(baseline='nala', mode='infer', amp='none', repeats=5), results=peer_rows,
                 crossover=bench.crossover(peer_rows, 'nala'))
    write_work(tmp_path, {'kernel_tests.xml': JUNIT, 'kernels/benchmark_kernels.json': kernels,
                          'train_bf16.json': bf16, 'train_fp16.json': fp16, 'upernet_bf16.json': UPERNET,
                          'peers.json': peers},
               {'install': (0, 5, 40), 'kernel_tests': (0, 80, 120), 'kernels': (0, 60, 110),
                'train_bf16': (0, 100, 130), 'upernet_bf16': (0, 30, 60), 'train_fp16': (0, 40, 60)})
    out = tmp_path / 'out'
    assert s.main([str(tmp_path), '--out-dir', str(out)]) == 0
    summary = json.loads((out / 'summary.json').read_text())
    got = statuses(summary)
    large, stage1, bound = s.KERNEL_TARGETS
    speed, memory = s.TRAIN_TARGETS
    assert got[large][0] == s.MET and got[large][1].startswith('6.67x')
    assert got[stage1][0] == s.NOT_MET and got[stage1][1].startswith('1.11x')  # 2.0 ms against 1.8 ms
    assert got[bound][0] == s.NOT_MET and '4.50x' in got[bound][1]  # forward+backward 4.5x the bound
    assert got[speed][0] == s.MET and got[speed][1].startswith('1.40x')
    assert got[memory][0] == s.NOT_MET and got[memory][1].startswith('0.75x')
    assert got[s.CHECKS['kernel_tests']] == (s.MET, '11 passed, 0 failed, 0 errors, 1 skipped')
    assert got[s.CHECKS['train_bf16']][0] == s.MET
    assert got[s.CHECKS['train_fp16']] == (s.NOT_MET, 'fused:nalaformer_t: non-finite loss')
    assert got[s.CHECKS['upernet_bf16']][0] == s.MET and '150.0 ms/iteration' in got[s.CHECKS['upernet_bf16']][1]
    assert got[s.CHECKS['peers']] == (s.MET, 'nala overtakes: convnext_tiny from 1024x1024 (224x224 2.00x, '
                                              '1024x1024 0.67x)')
    assert summary['device'] == 'NVIDIA H200' and summary['reports']['train_bf16'] == bf16
    text = (out / 'summary.txt').read_text()
    assert f'met           {large}: 6.67x' in text and f'not met       {memory}: 0.75x' in text
    assert '2x1x65536x64' in text and 'fused:nalaformer_t' in text and 'in all 315 s of 520 s' in text
    assert 'infer none, baseline nala, median of 5' in text and re.search(r'convnext_tiny +1024x1024 +2 +30\.00 +66\.7', text)


def test_failed_late_and_malformed_steps_are_not_measured_with_the_reason(summary_tool, tmp_path):
    s = summary_tool
    write_work(tmp_path, {'train_bf16.json': '{"meta": {', 'upernet_bf16.json': {'meta': {}},
                          'kernel_tests.xml': JUNIT.replace('failures="0"', 'failures="2"')},
               {'kernel_tests': (1, 90, 120), 'kernels': (124, 110, 110), 'train_bf16': (0, 100, 130),
                'upernet_bf16': (0, 20, 60)})
    got = statuses(s.summarise(tmp_path))
    for name in s.KERNEL_TARGETS:
        assert got[name] == (s.NOT_MEASURED, "step 'kernels' ran out of its 110 s")
    for name in s.TRAIN_TARGETS:
        assert got[name][0] == s.NOT_MEASURED and 'train_bf16.json is unreadable' in got[name][1]
    assert got[s.CHECKS['kernel_tests']][0] == s.NOT_MET  # its XML is read although pytest exited 1
    assert got[s.CHECKS['train_fp16']] == (s.NOT_MEASURED, "step 'train_fp16' did not run (see run.log)")
    assert got[s.CHECKS['upernet_bf16']][0] == s.NOT_MEASURED
    assert 'unexpected report contents' in got[s.CHECKS['upernet_bf16']][1]
    assert "step 'kernels' ran out of its 110 s" in s.render(s.summarise(tmp_path))


def test_bandwidth_target_needs_the_bound_and_all_skipped_tests_are_not_a_pass(summary_tool, tmp_path):
    s = summary_tool
    rows = [kernel_row(2, 65536, 'fused', mode, 1.0) for mode in ('forward', 'forward_backward')]  # no x_bound
    write_work(tmp_path, {'kernels/benchmark_kernels.json': dict(device='GPU X', peak_bandwidth_gbs=None, rows=rows),
                          'kernel_tests.xml': JUNIT.replace('skipped="1"', 'skipped="12"')},
               {'kernel_tests': (0, 5, 120), 'kernels': (0, 30, 110)})
    got = statuses(s.summarise(tmp_path))
    assert got[s.KERNEL_TARGETS[2]][0] == s.NOT_MEASURED and 'GPU X' in got[s.KERNEL_TARGETS[2]][1]
    assert got[s.KERNEL_TARGETS[0]][0] == s.NOT_MEASURED  # no torch row to compare with
    assert got[s.CHECKS['kernel_tests']] == (s.NOT_MEASURED, '0 passed, 0 failed, 0 errors, 12 skipped: none ran')


def test_a_model_that_failed_is_named_with_its_error(summary_tool, tmp_path):
    """benchmark.py --keep-going records a failing model's error in its row; the summary passes it on."""
    s = summary_tool
    report = training_report('bf16', dict(median_ms=64.0, throughput=1000.0, peak_mb=None, final_loss=6.9,
                                          losses_finite=True), {})
    report['results'][1] = dict(model='fused:nalaformer_t', size=[224, 224], batch=64, status='error',
                                error='RuntimeError: Triton compilation failed', median_ms=None)
    write_work(tmp_path, {'train_bf16.json': report}, {'train_bf16': (0, 100, 130)})
    summary = s.summarise(tmp_path)
    got = statuses(summary)
    assert got[s.CHECKS['train_bf16']] == (s.NOT_MET, 'fused:nalaformer_t: error: RuntimeError: Triton compilation '
                                                      'failed')
    assert got[s.TRAIN_TARGETS[0]][0] == s.NOT_MEASURED
    assert 'error: RuntimeError: Triton compilation failed' in s.render(summary)


def stubbed_script(tmp_path: Path, seconds_per_command: int = 0, **env) -> Tuple[Path, Path]:
    """scripts/gpu_acceptance.sh run with every command but the summary stubbed (no GPU), each stub taking
    ``seconds_per_command``: (its $OUT, the file listing the stubs' arguments)."""
    repo, bin_dir, out = tmp_path / 'repo', tmp_path / 'bin', tmp_path / 'out'
    (repo / 'scripts').mkdir(parents=True)
    (repo / 'nalaformer' / 'kernels').mkdir(parents=True)
    (repo / 'scripts' / SCRIPT.name).write_text(SCRIPT.read_text())
    (repo / 'tools').symlink_to(ROOT / 'tools')
    bin_dir.mkdir()
    calls = tmp_path / 'calls.txt'
    stub = bin_dir / 'python3'
    stub.write_text(f'#!/bin/bash\nprintf "%s\\n" "$*" >> {calls}\n'
                    f'[[ "$*" == *gpu_acceptance_summary.py* ]] && exec {sys.executable} "$@"\n'
                    f'sleep {seconds_per_command}\n')
    stub.chmod(0o755)
    env = {**os.environ, 'OUT': str(out), 'TMPDIR': str(tmp_path), 'PATH': f'{bin_dir}{os.pathsep}{os.environ["PATH"]}',
           **env}
    subprocess.run(['bash', str(repo / 'scripts' / SCRIPT.name)], env=env, check=True, capture_output=True)
    return out, calls


def test_the_script_runs_every_step_the_summary_reads(summary_tool, tmp_path):
    """Each step runs, is recorded in steps.tsv and writes where the summary reads; the summary then reports each
    missing output."""
    out, calls = stubbed_script(tmp_path)
    summary = json.loads((out / 'summary.json').read_text())
    steps = summary['steps']
    assert list(steps)[0] == 'install' and set(summary_tool.FILES) <= set(steps)
    assert all(s['rc'] == 0 for s in steps.values())
    work = re.search(r'gpu_acceptance_summary.py (\S+) --out-dir', calls.read_text())[1]
    arguments = set(calls.read_text().replace('=', ' ').split())
    for file in summary_tool.FILES.values():
        assert {f'{work}/{file}', f'{work}/{Path(file).parent}'} & arguments, file
    assert all(o['status'] == summary_tool.NOT_MEASURED and 'was not written' in o['value']
               for o in summary['targets'] + summary['checks'])
    assert {'summary.txt', 'run.log', 'steps.tar.gz'} <= {p.name for p in out.iterdir()}


def test_the_script_stops_starting_steps_at_its_deadline_and_still_summarises(summary_tool, tmp_path):
    """Steps take 3 s each and the run has 10 s: the first steps run in the script's order, each within what was left
    (however slow the machine, the first one starts), the rest are reported not run, and the summary and the archive
    are still written."""
    out, _ = stubbed_script(tmp_path, seconds_per_command=3, DEADLINE='10')
    summary = json.loads((out / 'summary.json').read_text())
    steps = summary['steps']
    order = ['install', 'environment', 'kernels', 'train_bf16']
    assert 1 <= len(steps) <= 3 and list(steps) == order[:len(steps)]
    assert all(s['budget'] <= 10 for s in steps.values())
    got = statuses(summary)
    assert got[summary_tool.CHECKS['sr']] == (summary_tool.NOT_MEASURED, "step 'sr' did not run (see run.log)")
    assert "== sr: not run, the run's 10 s are used up" in (out / 'run.log').read_text()
    assert {'summary.txt', 'steps.tar.gz'} <= {p.name for p in out.iterdir()}


def test_a_second_run_measures_only_the_steps_named_in_STEPS(summary_tool, tmp_path):
    """STEPS names the steps a first run did not reach (one with the budget it gets instead of its own); install,
    environment and the summary still run, in the script's order, and KERNEL_TESTS reaches pytest."""
    out, calls = stubbed_script(tmp_path, STEPS='peers_xt kernel_tests:321', KERNEL_TESTS='falls_back or keeps_half')
    summary = json.loads((out / 'summary.json').read_text())
    assert list(summary['steps']) == ['install', 'environment', 'kernel_tests', 'peers_xt']
    assert summary['steps']['kernel_tests']['budget'] == 321 and summary['steps']['peers_xt']['budget'] == 50
    assert 'pytest -q tests/test_triton_kernels.py -k falls_back or keeps_half --junitxml' in calls.read_text()
    got = statuses(summary)
    assert got[summary_tool.CHECKS['peers']] == (summary_tool.NOT_MEASURED, "step 'peers' did not run (see run.log)")
    assert '== kernels: not selected (STEPS=peers_xt kernel_tests:321)' in (out / 'run.log').read_text()


@pytest.mark.slow
def test_the_summary_reads_the_tools_real_reports(summary_tool, tmp_path):
    """benchmark.py model's and segmentor's own reports (CPU, tiny) through the summary."""
    s = summary_tool
    bench = load_tool('benchmark')
    assert bench.main(['model', '--mode', 'train', '--amp', 'bf16', '--device', 'cpu', '--models', 'nalaformer_xt',
                       'fused:nalaformer_xt', '--sizes', '32', '--batch-sizes', '2', '--warmup', '0', '--repeats', '1',
                       '--no-memory', '--out-json', str(tmp_path / 'train_bf16.json'),
                       '--out-png', str(tmp_path / 'train_bf16.png')]) == 0
    config = tmp_path / 'upernet_tiny.py'
    config.write_text(f"_base_ = ['{ROOT / 'configs/ade20k/upernet_nalaformer-t_8xb2-160k_ade20k-512x512.py'}']\n"
                      "model = dict(backbone=dict(embed_dims=[16, 32, 48, 64], depths=[1, 1, 1, 1], "
                      "num_heads=[1, 2, 3, 4]), decode_head=dict(in_channels=[16, 32, 48, 64], channels=32), "
                      "auxiliary_head=dict(in_channels=48, channels=16))\n")
    assert bench.main(['segmentor', '--config', str(config), '--device', 'cpu', '--size', '32', '--amp', 'bf16',
                           '--warmup', '0', '--repeats', '1', '--out-json', str(tmp_path / 'upernet_bf16.json')]) == 0
    (tmp_path / 'steps.tsv').write_text('train_bf16\t0\t20\t130\nupernet_bf16\t0\t10\t60\n')
    summary = s.summarise(tmp_path)
    got = statuses(summary)
    rows = {r['model']: r for r in summary['reports']['train_bf16']['results']}
    speed, memory = s.TRAIN_TARGETS
    assert got[speed][0] in (s.MET, s.NOT_MET)
    assert f"{rows['nalaformer_xt']['throughput']:.1f} img/s" in got[speed][1]
    assert got[memory][0] == s.NOT_MEASURED  # --no-memory
    assert got[s.CHECKS['train_bf16']][0] == s.MET and got[s.CHECKS['upernet_bf16']][0] == s.MET
    assert 'nalaformer_xt' in s.render(summary)
