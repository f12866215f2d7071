"""The whole-network SR memory claim: tensor memory counted on fake tensors (nalaformer/analysis/tensor_memory.py)
against the counting on real tensors and the resident memory measured in a fresh process, and
tools/analysis/benchmark.py sr end to end at tiny sizes; its report through the GPU acceptance summary."""
import json

import pytest
import torch
from PIL import Image

from analysis_tools import load_tool
from nalaformer.analysis.benchmarks import sr
from nalaformer.analysis.models import parse_model_spec
from nalaformer.analysis.tensor_memory import LiveTensorMemory, fake_memory
from nalaformer.ops import nala_fast, rope_angles, rope_table

MIB = 2 ** 20


@pytest.fixture(scope='module')
def tool():
    return load_tool('benchmark')


def sr_args(tool, *argv):
    """The options of ``benchmark.py sr ARGV``, defaults filled."""
    args = tool.parse_args(['sr', *argv])
    sr.check_args(args)
    return args


def test_live_tensors_are_counted_once_until_freed():
    with LiveTensorMemory() as memory:
        a = torch.empty(256, 1024)  # 1 MiB
        b = a + 1
        view = b.view(-1)
        b.add_(1)  # in place and views: no new memory
        assert memory.live_bytes == memory.peak_bytes == 2 * MIB
        del a
        c = torch.empty(512, 1024)
        assert memory.live_bytes == 3 * MIB and memory.peak_bytes == 3 * MIB
        del b, view, c
        assert memory.live_bytes == 0
        memory.reset_peak()
        assert memory.peak_bytes == 0


def test_the_projects_custom_ops_count_their_temporaries():
    q, k, v = torch.randn(3, 1, 2, 4096, 16).unbind(0)
    rope = rope_table(rope_angles(16), 64, 64)
    with LiveTensorMemory() as memory:
        out = nala_fast.nala_attention(q, k, v, rope)
    outputs = out.nbytes + 2 * 32 * 16 * 4 + 2 * 4096 * 4 + 2 * 32 * 4  # out, state, normaliser, key mean
    assert memory.live_bytes == out.nbytes
    assert memory.peak_bytes >= outputs + 2 * 4096 * 32 * 4  # its (N, 2d) feature maps, counted inside it


@pytest.mark.slow
def test_fake_tensors_count_what_real_tensors_count(tool):
    args = sr_args(tool, '--tiny')
    spec = parse_model_spec(args.model)

    def build():
        return sr.make_step(spec, 'nala', (24, 16), 'train', 2, 1, torch.device('cpu'), 'none', fake=True)

    with LiveTensorMemory() as real:
        step = build()
        step()
        settled = real.live_bytes
        real.reset_peak()
        step()
        step()
    fake = fake_memory(build)
    assert fake.extra_mb == pytest.approx((real.peak_bytes - settled) / MIB, rel=1e-6)
    # Tensors made from Python data (torch.tensor: the RGB mean, Adam's step counters) reach the mode only as fakes:
    # 444 bytes here.
    assert fake.peak_mb == pytest.approx(real.peak_bytes / MIB, abs=1e-3)


@pytest.mark.slow
@pytest.mark.parametrize('attn_type, mode, size', [('softmax_explicit', 'train', [64, 64]), ('nala', 'train', [128, 128])])
def test_accounted_memory_agrees_with_resident_memory_measured(tool, attn_type, mode, size):
    # The tiny network at 4,096 tokens with an explicit softmax (532 MiB, its N x N matrices) and at 16,384 tokens
    # with NaLa (95 MiB): the memory a fresh process gains over two training steps after a first one.
    args = sr_args(tool, '--tiny', '--threads', '1')
    run = dict(slot=attn_type, mode=mode, size=size, amp='none')
    accounted = sr.account(parse_model_spec(args.model), run, args)
    measured = sr.measure_memory(run, args)
    assert 'error' not in measured, measured
    assert measured['extra_mb'] == pytest.approx(accounted['extra_mb'], rel=0.10)
    assert accounted['extra_mb'] > (400 if attn_type == 'softmax_explicit' else 80)


@pytest.mark.slow
def test_benchmark_measures_what_fits_and_accounts_the_rest(tool, tmp_path):
    # A budget that holds NaLa's run (~24 MiB) but not the explicit softmax's accounted ~270 MiB at 64x64.
    argv = ['sr', '--tiny', '--sizes', '64x64', '--attn-types', 'nala', 'softmax_explicit', '--modes', 'infer', '--threads', '1',
            '--max-memory-gb', str(100 / 1024), '--no-malloc-tuning', '--out-dir', str(tmp_path)]
    assert tool.main(argv) == 0
    report = json.loads((tmp_path / 'benchmark_sr.json').read_text())
    runs = {r['slot']: r for r in report['runs']}
    nala, explicit = runs['nala'], runs['softmax_explicit']
    assert nala['status'] == 'ok' and nala['median_ms'] > 0 and nala['measured']['peak_mb'] > 0
    assert nala['measured_over_accounted'] > 0
    assert explicit['status'].startswith('accounted only') and explicit['measured'] is None
    assert explicit.get('median_ms') is None and explicit['accounted']['peak_mb'] > 200
    [ratio] = report['ratios']
    assert ratio['slot'] == 'softmax_explicit' and ratio['memory_source'] == 'accounted'
    assert ratio['memory_ratio'] == pytest.approx(explicit['accounted']['peak_mb'] / nala['accounted']['peak_mb'])
    assert ratio['time_ratio'] is None
    assert report['meta']['paper'] == {'memory_gb': [69.0, 5.3], 'latency_ms': [195.0, 124.0]}
    assert (tmp_path / 'benchmark_sr.png').stat().st_size > 0


def test_a_memory_only_run_plots_no_empty_time_panels(tool, tmp_path):
    memory_only = tmp_path / 'memory_only'
    assert tool.main(['sr', '--tiny', '--sizes', '16x16', '--attn-types', 'nala', '--modes', 'infer', '--no-time',
                      '--no-measure', '--out-dir', str(memory_only)]) == 0
    report = json.loads((memory_only / 'benchmark_sr.json').read_text())
    [run] = report['runs']
    assert run.get('median_ms') is None and run['accounted']['peak_mb'] > 0
    timed = tmp_path / 'timed.png'
    sr.plot(dict(report, runs=[dict(run, median_ms=12.0)]), timed)
    assert Image.open(memory_only / 'benchmark_sr.png').width < 0.6 * Image.open(timed).width


def test_runs_out_of_gpu_memory_are_reported_and_accounted(tool, monkeypatch):
    # CUDA runs try first (--account unmeasured): one that fails for memory is neither timed nor measured.
    args = sr_args(tool, '--tiny')
    run = dict(slot='softmax_explicit', mode='train', size=[24, 24], amp='none', accounted=None, measured=None,
               fits=True, status='ok')
    def out_of_memory(run, args):
        raise torch.cuda.OutOfMemoryError('CUDA out of memory. Tried to allocate 64.00 GiB')
    monkeypatch.setattr(sr, 'measure_memory', out_of_memory)
    sr.add_measured(run, args)  # without --keep-going: running out of memory is a result, not a failure
    assert run['status'] == 'out of memory' and run['fits'] is False and run['measured'] is None
    assert 'Tried to allocate 64.00 GiB' in run['error']
    sr.add_accounted(parse_model_spec(args.model), run, args, budget=10 ** 6)
    assert run['accounted']['peak_mb'] > 0 and run['status'] == 'out of memory'


def test_benchmark_refuses_what_it_cannot_do(tool):
    with pytest.raises(ValueError, match='--account none is for CUDA runs'):
        sr.run_benchmark(tool.parse_args(['sr', '--tiny', '--device', 'cpu', '--account', 'none']))
    with pytest.raises(ValueError, match="unknown attention kernel 'nala2'"):
        sr.run_benchmark(tool.parse_args(['sr', '--tiny', '--attn-types', 'nala2', '--no-measure']))


def test_gpu_summary_reads_the_sr_report():
    summary = load_tool('gpu_acceptance_summary')
    name = summary.CHECKS['sr']

    def run(slot, ms, peak, status='ok'):
        return dict(slot=slot, mode='infer', amp='none', size=[256, 288], tokens=73728, status=status, median_ms=ms,
                    measured=None if peak is None else dict(peak_mb=peak, extra_mb=peak))
    report = dict(meta=dict(model='nalasr_light', scale=2, batch=1, repeats=3),
                  runs=[run('nala', 100.0, 800.0), run('softmax', 400.0, 790.0),
                        run('softmax_explicit', None, None, 'out of memory')],
                  ratios=[dict(tokens=73728, mode='infer', amp='none', slot='softmax', memory_ratio=0.9875,
                               memory_source='measured', time_ratio=4.0),
                          dict(tokens=73728, mode='infer', amp='none', slot='softmax_explicit', memory_ratio=None,
                               memory_source=None, time_ratio=None)])
    outcome = summary.sr_check(name, report)
    assert outcome['status'] == summary.MET
    assert 'softmax infer amp none: memory 0.99x (measured), time 4.00x' in outcome['value']
    assert 'softmax_explicit infer amp none: memory n/a, time n/a' in outcome['value']
    report['runs'][0]['median_ms'] = None
    assert summary.sr_check(name, report)['status'] == summary.NOT_MEASURED
    assert 'out of memory' in '\n'.join(summary.sr_lines(report))
