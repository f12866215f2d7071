"""The figures of one scripts/gpu_acceptance.sh run and each acceptance target: met, not met or not measured.

Reads the step outputs in WORK_DIR (``FILES``; ``steps.tsv``: per step name, exit code, seconds used and allowed)
and writes ``summary.json`` (figures, targets, checks, steps, every step's report) and ``summary.txt`` to
``--out-dir``. A target whose step failed, ran out of time or lacks the row it needs is 'not measured', with the
reason. Standard library only (nalaformer's toolkit needs torch and timm), so that it runs whatever broke before::

    python3 tools/analysis/gpu_acceptance_summary.py /tmp/gpu_acceptance --out-dir runs/gpu_acceptance
"""
import argparse
import json
import sys
import time
import xml.etree.ElementTree as ElementTree
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence, Tuple

# Step name -> its output in the work dir (the names scripts/gpu_acceptance.sh uses).
FILES = dict(kernel_tests='kernel_tests.xml', kernels='kernels/benchmark_kernels.json', train_bf16='train_bf16.json',
             upernet_bf16='upernet_bf16.json', train_fp16='train_fp16.json', sr='sr/benchmark_sr.json',
             peers='peers.json', peers_train='peers_train.json', peers_compiled='peers_compiled.json',
             peers_profile='peers_profile.json', peers_s='peers_s.json', peers_memory='peers_memory.json',
             peers_xt='peers_xt.json')
TIMED_OUT = (124, 137)  # timeout(1)'s exit codes: limit reached, killed after it
# The targets: the fused kernel against the PyTorch op, alone and in NaLaFormer-T's training step.
LARGE_TOKENS = 65536
STAGE1_BATCH, STAGE1_TOKENS = 64, 3136  # stage 1 of NaLaFormer-T at 224 in a batch of 64
LARGE_SPEEDUP, BANDWIDTH_FACTOR, TRAIN_SPEEDUP, TRAIN_MEMORY = 5.0, 4.0, 1.3, 0.7
KERNEL_TARGETS = (
    f'fused forward+backward >= {LARGE_SPEEDUP:g}x the PyTorch op at {LARGE_TOKENS:,} tokens',
    f'fused forward+backward no slower than the PyTorch op at {STAGE1_TOKENS:,} tokens x batch {STAGE1_BATCH}',
    f'fused within {BANDWIDTH_FACTOR:g}x of the memory-bandwidth bound at {LARGE_TOKENS:,} tokens '
    '(forward and forward+backward)',
)
TRAIN_TARGETS = (
    f'NaLaFormer-T training step, fused kernel: >= {TRAIN_SPEEDUP:g}x the img/s of the PyTorch op',
    f'NaLaFormer-T training step, fused kernel: <= {TRAIN_MEMORY:g}x the max memory of the PyTorch op',
)
# What else the run must show, by the step that shows it.
CHECKS = {
    'kernel_tests': 'compiled-mode kernel tests (tests/test_triton_kernels.py) pass',
    'train_bf16': 'NaLaFormer-T training step, AMP bf16: losses finite (PyTorch op and fused)',
    'train_fp16': 'NaLaFormer-T training step, AMP fp16: losses finite (PyTorch op and fused)',
    'upernet_bf16': 'UperNet-T training iterations with AMP: losses finite',
    'sr': 'NaLa-SR x2 whole network (benchmark.py sr): CUDA max memory and latency of NaLa measured at every size '
          '(fp32, bf16)',
    'peers': 'NaLaFormer-T beside Swin-T, ConvNeXt-T and EfficientViT-B2 (benchmark.py model --peers t), inference: '
             'every model timed',
    'peers_train': 'the same peers, training step: every model timed',
    'peers_compiled': 'all-NaLa, ConvNeXt-T and EfficientViT-B2 compiled (--compile), inference: every model timed',
    'peers_profile': 'all-NaLa on the PyTorch op and the fused kernel beside the T peers, inference with GPU time per '
                     'operator class (--profile): every model timed',
    'peers_s': 'NaLaFormer-S beside Swin-S, ConvNeXt-S and EfficientViT-B3 (--peers s), inference: every model timed',
    'peers_memory': 'the T peers and fused all-NaLa at 2048, CUDA max memory: every model timed',
    'peers_xt': 'NaLaFormer-XT beside ConvNeXt-femto and EfficientViT-B1 (--peers xt), inference: every model timed',
}
# benchmark.py sr's baseline and the global attentions compared with it in the summary.
SR_BASELINE, SR_COMPARED = 'nala', ('softmax_explicit', 'softmax')
MET, NOT_MET, NOT_MEASURED = 'met', 'not met', 'not measured'
UNITS = dict(ms=('ms', '.3f'), throughput=('img/s', '.1f'), peak_mb=('MiB', '.0f'))  # of the compared figures

Outcome = Dict[str, str]


def outcome(name: str, met: Optional[bool], value: str) -> Outcome:
    """``met`` None: not measured, ``value`` then says why."""
    return dict(name=name, status=NOT_MEASURED if met is None else MET if met else NOT_MET, value=value)


def fmt(value: object, spec: str = '', unit: str = '') -> str:
    return 'n/a' if value is None else format(value, spec) + unit


def size(row: Dict) -> str:
    return 'x'.join(map(str, row['size']))


def read_steps(work: Path) -> Dict[str, Dict[str, int]]:
    """``steps.tsv``: {name: {rc, seconds, budget}} in the order the steps ran."""
    path = work / 'steps.tsv'
    lines = [line.split('\t') for line in (path.read_text().splitlines() if path.is_file() else [])]
    return {name: dict(zip(('rc', 'seconds', 'budget'), map(int, numbers))) for name, *numbers in lines
            if len(numbers) == 3 and all(n.lstrip('-').isdigit() for n in numbers)}


def read_output(work: Path, steps: Dict[str, Dict[str, int]], name: str) -> Tuple[Optional[object], Optional[str]]:
    """(the step's output, None), or (None, why there is none). JSON files are parsed; pytest's XML too."""
    path, step = work / FILES[name], steps.get(name)
    if path.is_file():
        try:
            return (junit_counts(path) if path.suffix == '.xml' else json.loads(path.read_text())), None
        except (ValueError, ElementTree.ParseError) as e:
            return None, f'{FILES[name]} is unreadable ({e})'
    if step is None:
        return None, f"step '{name}' did not run (see run.log)"
    if step['rc'] in TIMED_OUT:
        return None, f"step '{name}' ran out of its {step['budget']} s"
    if step['rc']:
        return None, f"step '{name}' failed (exit {step['rc']}; see run.log)"
    return None, f'{FILES[name]} was not written'


def junit_counts(path: Path) -> Dict[str, int]:
    """Test counts of a pytest ``--junitxml`` file: tests, failures, errors, skipped, passed."""
    suites = list(ElementTree.parse(path).getroot().iter('testsuite'))  # the root or its children
    counts = {key: sum(int(s.get(key, 0)) for s in suites) for key in ('tests', 'failures', 'errors', 'skipped')}
    return dict(counts, passed=counts['tests'] - counts['failures'] - counts['errors'] - counts['skipped'])


def compared(name: str, torch: Optional[Dict], fused: Optional[Dict], key: str, why: str,
             meets: Callable[[float], bool], inverse: bool = False, label: str = '') -> Outcome:
    """The fused row's ``key`` over the PyTorch op's (``inverse``: the PyTorch op's over the fused one's), judged by
    ``meets``; not measured, ``why``, where a row or its figure is missing."""
    if not (torch and fused and torch.get(key) and fused.get(key)):
        return outcome(name, None, why)
    ratio = torch[key] / fused[key] if inverse else fused[key] / torch[key]
    unit, spec = UNITS[key]
    return outcome(name, meets(ratio), f'{ratio:.2f}x{label} (PyTorch op {torch[key]:{spec}} {unit}, '
                                       f'fused {fused[key]:{spec}} {unit})')


def kernel_row(report: Dict, method: str, mode: str, tokens: int, batch: Optional[int] = None) -> Optional[Dict]:
    """The timed row of a method, mode and token count (and batch) in benchmark_kernels.json, if any."""
    return next((r for r in report['rows'] if r['method'] == method and r['mode'] == mode and r['tokens'] == tokens
                 and (batch is None or r['batch'] == batch) and r.get('ms') is not None), None)


def kernel_targets(report: Dict) -> List[Outcome]:
    """benchmark_kernels.json: fused against the PyTorch op (forward+backward), and against the bandwidth bound."""
    large, stage1, bound = KERNEL_TARGETS
    no_rows = 'no timed fused and torch forward_backward rows at '
    fb_large, fb_stage1 = ([kernel_row(report, m, 'forward_backward', *shape) for m in ('torch', 'fused')]
                           for shape in ((LARGE_TOKENS,), (STAGE1_TOKENS, STAGE1_BATCH)))
    bounds = [(kernel_row(report, 'fused', mode, LARGE_TOKENS) or {}).get('x_bound')
              for mode in ('forward', 'forward_backward')]
    if None in bounds:
        bandwidth = outcome(bound, None, 'no fused rows at that size with x_bound (is the peak bandwidth of '
                                         f"{report.get('device')} unknown to the benchmark?)")
    else:
        bandwidth = outcome(bound, max(bounds) <= BANDWIDTH_FACTOR, f'forward {bounds[0]:.2f}x, forward+backward '
                            f"{bounds[1]:.2f}x the bound ({report['peak_bandwidth_gbs']:.0f} GB/s peak)")
    return [compared(large, *fb_large, 'ms', no_rows + f'{LARGE_TOKENS} tokens', lambda x: x >= LARGE_SPEEDUP,
                     inverse=True),
            compared(stage1, *fb_stage1, 'ms', no_rows + f'{STAGE1_TOKENS} tokens x batch {STAGE1_BATCH}',
                     lambda x: x <= 1.0, label=" the PyTorch op's time"),
            bandwidth]


def training_targets(report: Dict) -> List[Outcome]:
    """The fused kernel's row ('fused:' + the run's baseline model) against the PyTorch op's (the baseline)."""
    speed, memory = TRAIN_TARGETS
    baseline = report['meta']['baseline']
    rows = {r['model']: r for r in report['results'] if r['status'] == 'ok'}
    torch, fused = rows.get(baseline), rows.get(f'fused:{baseline}')
    no_row = 'the PyTorch op or the fused kernel has no timed row (see the report)'
    no_peak = 'peak memory was not measured (see memory_error in the report)' if torch and fused else no_row
    return [compared(speed, torch, fused, 'throughput', no_row, lambda x: x >= TRAIN_SPEEDUP),
            compared(memory, torch, fused, 'peak_mb', no_peak, lambda x: x <= TRAIN_MEMORY)]


def finite_check(name: str, report: Dict) -> Outcome:
    """Every timed model of a benchmark.py model training report had finite losses only."""
    rows = report['results']
    if not rows:
        return outcome(name, None, 'no models in the report')
    bad = [f"{r['model']}: {r['status']}: {r.get('error')}" for r in rows if r['status'] != 'ok']
    bad += [f"{r['model']}: non-finite loss" for r in rows if r['status'] == 'ok' and not r.get('losses_finite')]
    return outcome(name, not bad, '; '.join(bad) or ', '.join(f"{r['model']} final loss {r['final_loss']:.4f}"
                                                              for r in rows))


def peers_check(name: str, report: Dict) -> Outcome:
    """benchmark.py model --peers: every row timed; where the baseline (all-NaLa) overtakes each peer."""
    bad = [f"{r['model']} {size(r)}: {r['status']}: {r.get('error')}" for r in report['results'] if r['status'] != 'ok']
    where = [f"{model} from {'x'.join(map(str, c['overtakes_at'])) if c['overtakes_at'] else 'none'} ("
             + ', '.join(f'{s} {ratio:.2f}x' for s, ratio in c['latency_ratio'].items()) + ')'
             for model, c in report['crossover'].items()]
    return outcome(name, not bad and bool(report['results']), '; '.join(bad) or
                   f"{report['meta']['baseline']} overtakes: " + '; '.join(where))


def kernel_tests_check(name: str, counts: Dict[str, int]) -> Outcome:
    """Every kernel test that ran passed; none ran: not measured."""
    none_ran = counts['tests'] == counts['skipped']
    value = (f"{counts['passed']} passed, {counts['failures']} failed, {counts['errors']} errors, "
             f"{counts['skipped']} skipped" + (': none ran' if none_ran else ''))
    return outcome(name, None if none_ran else counts['failures'] + counts['errors'] == 0, value)


def upernet_check(name: str, report: Dict) -> Outcome:
    """benchmark.py segmentor's report: finite losses, with its figures."""
    r, meta = report['result'], report['meta']
    return outcome(name, r['losses_finite'],
                   f"{size(meta)}, batch {meta['batch']}, AMP {meta['amp']}: {r['median_ms']:.1f} ms/iteration, "
                   f"{r['throughput']:.1f} img/s, peak {fmt(r['peak_mb'], '.0f')} MiB, final loss "
                   f"{r['final_loss']:.4f} (mmcv ops: {meta['mmcv_ops']})")


def sr_check(name: str, report: Dict) -> Outcome:
    """benchmark.py sr's report: every NaLa run has a measured peak and a time; the ratios at the most tokens."""
    runs = report['runs']
    nala = [r for r in runs if r['slot'] == SR_BASELINE]
    if not nala:
        return outcome(name, None, f'no {SR_BASELINE} runs in the report')
    missing = [f"{r['mode']} {size(r)} amp {r['amp']} ({r['status']})" for r in nala
               if r.get('median_ms') is None or (r.get('measured') or {}).get('peak_mb') is None]
    tokens = max(r['tokens'] for r in runs)
    parts = [f"{q['slot']} {q['mode']} amp {q['amp']}: memory {fmt(q['memory_ratio'], '.2f', 'x')}"
             + (f" ({q['memory_source']})" if q['memory_source'] else '') + f", time {fmt(q['time_ratio'], '.2f', 'x')}"
             for q in report['ratios'] if q['tokens'] == tokens and q['slot'] in SR_COMPARED]
    value = f"at {tokens:,} tokens, x {SR_BASELINE}: " + ('; '.join(parts) or 'no ratios')
    return outcome(name, None if missing else True,
                   (f"{SR_BASELINE} not measured: {'; '.join(missing)}; " if missing else '') + value)


def evaluate(output: Tuple[Optional[object], Optional[str]], names: Sequence[str],
             build: Callable[[object], List[Outcome]]) -> List[Outcome]:
    """``build(data)`` of a step's (data, why not), or each name 'not measured': why, or what the report lacks."""
    data, why = output
    try:
        return [outcome(name, None, why) for name in names] if data is None else build(data)
    except (KeyError, TypeError, ValueError, ZeroDivisionError) as e:
        return [outcome(name, None, f'unexpected report contents ({type(e).__name__}: {e})') for name in names]


def summarise(work: Path) -> Dict:
    steps = read_steps(work)
    outputs = {name: read_output(work, steps, name) for name in FILES}
    check_of = dict(kernel_tests=kernel_tests_check, train_bf16=finite_check, train_fp16=finite_check,
                    upernet_bf16=upernet_check, sr=sr_check,
                    **{step: peers_check for step in CHECKS if step.startswith('peers')})
    targets = (evaluate(outputs['kernels'], KERNEL_TARGETS, kernel_targets)
               + evaluate(outputs['train_bf16'], TRAIN_TARGETS, training_targets))
    checks = [o for step, name in CHECKS.items()  # evaluate calls the lambda at once: step and name are this loop's
              for o in evaluate(outputs[step], [name], lambda data: [check_of[step](name, data)])]
    reports = {name: data for name, (data, _) in outputs.items() if data is not None}
    train_meta = (reports.get('train_bf16') or {}).get('meta', {})
    return dict(generated=time.strftime('%Y-%m-%d %H:%M:%S'),
                device=train_meta.get('device_name') or (reports.get('kernels') or {}).get('device'),
                torch=train_meta.get('torch'), timm=train_meta.get('timm'),
                targets=targets, checks=checks, steps=steps, reports=reports)


# A text table's columns: (header, alignment and width, the row's key or a function of the row, format of its value).
STATUS = ('status', '', lambda r: r['status'] + (f": {r['error']}" if r.get('error') else ''), '')
KERNEL_COLUMNS = (('B x H x N x D', '<21', lambda r: f"{r['batch']}x{r['heads']}x{r['tokens']}x{r['head_dim']}", ''),
                  ('mode', '<17', 'mode', ''), ('method', '<10', 'method', ''), ('ms', '>9', 'ms', '.3f'),
                  ('peak MiB', '>9', 'peak_mib', '.0f'), ('GB/s', '>7', 'bandwidth_gbs', '.0f'),
                  ('x bound', '>8', 'x_bound', '.2f'), STATUS)
TRAIN_COLUMNS = (('model', '<23', 'model', ''), ('size', '<8', size, ''), ('batch', '>6', 'batch', ''),
                 ('ms', '>8', 'median_ms', '.1f'), ('img/s', '>8', 'throughput', '.1f'),
                 ('peak MiB', '>9', 'peak_mb', '.0f'), ('final loss', '>11', 'final_loss', '.4f'),
                 ('finite', '<6', lambda r: 'yes' if r.get('losses_finite') else 'NO', ''), STATUS)
SR_COLUMNS = (('mode', '<6', 'mode', ''), ('amp', '<5', 'amp', ''), ('LR size', '<8', size, ''),
              ('tokens', '>9', 'tokens', ','), ('global slot', '<17', 'slot', ''),
              ('peak MiB', '>10', lambda r: (r.get('measured') or {}).get('peak_mb'), '.0f'),
              ('ms', '>9', 'median_ms', '.1f'), STATUS)
PEERS_COLUMNS = (('model', '<36', 'model', ''), ('size', '<10', size, ''), ('batch', '>6', 'batch', ''),
                 ('ms', '>9', 'median_ms', '.2f'), ('img/s', '>9', 'throughput', '.1f'),
                 ('x baseline', '>11', 'latency_ratio', '.2f'), ('peak MiB', '>9', 'peak_mb', '.0f'), STATUS)
PEERS_TABLE = (lambda r: f"{r['meta']['mode']} {r['meta']['amp']}, baseline {r['meta']['baseline']}, median of "
                         f"{r['meta']['repeats']}", 'results', PEERS_COLUMNS)
TRAIN_TABLE = (lambda r: f"NaLaFormer-T training step, AMP {r['meta']['amp']}, median of {r['meta']['repeats']}",
               'results', TRAIN_COLUMNS)
# Step -> its report's table: the title (a function of the report), the key of its rows, the columns.
TABLES = dict(
    kernels=(lambda r: f"Kernels ({r.get('dtype')}, peak DRAM bandwidth {fmt(r.get('peak_bandwidth_gbs'), '.0f')} "
                       'GB/s)', 'rows', KERNEL_COLUMNS),
    train_bf16=TRAIN_TABLE, train_fp16=TRAIN_TABLE,
    **{step: PEERS_TABLE for step in CHECKS if step.startswith('peers')},
    sr=(lambda r: 'NaLa-SR ({model}) x{scale}, batch {batch}, median of {repeats}'.format(**r['meta']), 'runs',
        SR_COLUMNS))


def table(step: str, report: Dict) -> List[str]:
    """A step's report as text: title, headers, one line a row; a figure the row lacks reads 'n/a'."""
    title, rows, columns = TABLES[step]

    def line(cells: Sequence[str]) -> str:
        return '  ' + ' '.join(format(cell, width) for cell, (_, width, _, _) in zip(cells, columns)).rstrip()

    return [title(report), line([header for header, *_ in columns])] + [
        line([fmt(r.get(get) if isinstance(get, str) else get(r), spec) for _, _, get, spec in columns])
        for r in report[rows]]


def sr_lines(report: Dict) -> List[str]:
    return table('sr', report)


def render(summary: Dict) -> str:
    width = len(NOT_MEASURED) + 2
    known = {key: summary[key] or 'unknown' for key in ('device', 'torch', 'timm')}
    lines = [f"NaLaFormer GPU acceptance (scripts/gpu_acceptance.sh) on {known['device']}, torch {known['torch']}, "
             f"timm {known['timm']}, {summary['generated']}"]
    for title, key in (('Acceptance targets', 'targets'), ('Checks', 'checks')):
        lines += ['', title] + [f"  {o['status']:<{width}}{o['name']}: {o['value']}" for o in summary[key]]
    for step in (step for step in summary['reports'] if step in TABLES):
        try:
            lines += [''] + table(step, summary['reports'][step])
        except (KeyError, TypeError, ValueError) as e:
            lines += ['', f'{step}: unexpected report contents ({type(e).__name__}: {e})']
    steps = summary['steps'].items()
    lines += ['', 'Steps (seconds used / allowed, exit code): ' + (', '.join(
        f"{name} {s['seconds']}/{s['budget']} s" + (f" (exit {s['rc']})" if s['rc'] else '') for name, s in steps)
        or 'none recorded'),
        f"  in all {sum(s['seconds'] for _, s in steps)} s of {sum(s['budget'] for _, s in steps)} s"]
    return '\n'.join(lines) + '\n'


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('work_dir', type=Path, help="the steps' outputs (scripts/gpu_acceptance.sh's WORK)")
    parser.add_argument('--out-dir', type=Path, required=True, help='where summary.json and summary.txt go')
    args = parser.parse_args(argv)
    if not args.work_dir.is_dir():
        print(f'error: {args.work_dir} is not a directory', file=sys.stderr)
        return 2
    summary = summarise(args.work_dir)
    args.out_dir.mkdir(parents=True, exist_ok=True)
    (args.out_dir / 'summary.json').write_text(json.dumps(summary, indent=2) + '\n')
    text = render(summary)
    (args.out_dir / 'summary.txt').write_text(text)
    print(text, end='')
    return 0


if __name__ == '__main__':
    sys.exit(main())
