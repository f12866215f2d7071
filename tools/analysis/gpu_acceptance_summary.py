"""The figures of one scripts/gpu_acceptance.sh run and each acceptance target: met, not met or not measured.

Reads the step outputs in WORK_DIR (names in ``FILES``; ``steps.tsv``: one line per step, name, exit code,
seconds used, seconds allowed) and writes ``summary.json`` (figures, targets, checks, steps and every step's
report) and ``summary.txt`` (the same for a reader) to ``--out-dir``. A target whose step failed, ran out
of time or did not produce the row it needs is 'not measured', with the reason. Standard library only (not
even nalaformer's measurement toolkit, whose import needs torch and timm), so that it runs whatever broke before
it::

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
FILES = {
    'kernel_tests': 'kernel_tests.xml',
    'kernels': 'kernels/benchmark_kernels.json',
    'train_bf16': 'train_bf16.json',
    'upernet_bf16': 'upernet_bf16.json',
    'train_fp16': 'train_fp16.json',
    'sr': 'sr/benchmark_sr.json',
}
STEPS_FILE = 'steps.tsv'
TIMED_OUT = (124, 137)  # timeout(1)'s exit codes: limit reached, killed after it
# The issue's targets: the fused kernel against the PyTorch op, alone and in NaLaFormer-T's training step.
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
}
# benchmark.py sr's baseline and the global attentions compared with it in the summary.
SR_BASELINE, SR_COMPARED = 'nala', ('softmax_explicit', 'softmax')
MET, NOT_MET, NOT_MEASURED = 'met', 'not met', 'not measured'

Outcome = Dict[str, str]


def outcome(name: str, met: Optional[bool], value: str) -> Outcome:
    """``met`` None: not measured, ``value`` then says why."""
    return dict(name=name, status=NOT_MEASURED if met is None else MET if met else NOT_MET, value=value)


def read_steps(work: Path) -> Dict[str, Dict[str, int]]:
    """``steps.tsv``: {name: {rc, seconds, budget}} in the order the steps ran."""
    steps = {}
    path = work / STEPS_FILE
    for line in path.read_text().splitlines() if path.is_file() else []:
        name, *numbers = line.split('\t')
        if len(numbers) == 3 and all(n.lstrip('-').isdigit() for n in numbers):
            steps[name] = dict(zip(('rc', 'seconds', 'budget'), map(int, numbers)))
    return steps


def step_problem(steps: Dict[str, Dict[str, int]], name: str) -> Optional[str]:
    """Why step ``name`` gave nothing usable, or None if it exited 0."""
    step = steps.get(name)
    if step is None:
        return f"step '{name}' did not run"
    if step['rc'] in TIMED_OUT:
        return f"step '{name}' ran out of its {step['budget']} s"
    if step['rc']:
        return f"step '{name}' failed (exit {step['rc']}; see run.log)"
    return None


def read_output(work: Path, steps: Dict[str, Dict[str, int]], name: str) -> Tuple[Optional[object], Optional[str]]:
    """(the step's output, None), or (None, why there is none). JSON files are parsed; pytest's XML too."""
    path = work / FILES[name]
    if not path.is_file():
        return None, step_problem(steps, name) or f'{FILES[name]} was not written'
    try:
        if path.suffix == '.xml':
            return junit_counts(path), None
        return json.loads(path.read_text()), None
    except (ValueError, ElementTree.ParseError) as e:
        return None, f'{FILES[name]} is unreadable ({e})'


def junit_counts(path: Path) -> Dict[str, int]:
    """Test counts of a pytest ``--junitxml`` file: tests, failures, errors, skipped, passed."""
    root = ElementTree.parse(path).getroot()
    suites = [root] if root.tag == 'testsuite' else root.findall('testsuite')
    counts = {key: sum(int(s.get(key, 0)) for s in suites) for key in ('tests', 'failures', 'errors', 'skipped')}
    counts['passed'] = counts['tests'] - counts['failures'] - counts['errors'] - counts['skipped']
    return counts


def kernel_row(report: Dict, method: str, mode: str, tokens: int, batch: Optional[int] = None) -> Optional[Dict]:
    """The timed row of a method, mode and token count (and batch) in benchmark_kernels.json, if any."""
    return next((r for r in report['rows'] if r['method'] == method and r['mode'] == mode and r['tokens'] == tokens
                 and (batch is None or r['batch'] == batch) and r.get('ms') is not None), None)


def kernel_targets(report: Dict) -> List[Outcome]:
    large, stage1, bound = KERNEL_TARGETS
    results = []
    fused, torch = (kernel_row(report, m, 'forward_backward', LARGE_TOKENS) for m in ('fused', 'torch'))
    if fused and torch:
        speedup = torch['ms'] / fused['ms']
        results.append(outcome(large, speedup >= LARGE_SPEEDUP,
                               f"{speedup:.2f}x (PyTorch op {torch['ms']:.3f} ms, fused {fused['ms']:.3f} ms)"))
    else:
        results.append(outcome(large, None, f'no timed fused and torch forward_backward rows at {LARGE_TOKENS} tokens'))
    fused, torch = (kernel_row(report, m, 'forward_backward', STAGE1_TOKENS, STAGE1_BATCH) for m in ('fused', 'torch'))
    if fused and torch:
        ratio = fused['ms'] / torch['ms']
        results.append(outcome(stage1, ratio <= 1.0, f"{ratio:.2f}x the PyTorch op's time "
                                                     f"(PyTorch op {torch['ms']:.3f} ms, fused {fused['ms']:.3f} ms)"))
    else:
        results.append(outcome(stage1, None, f'no timed fused and torch forward_backward rows at '
                                             f'{STAGE1_TOKENS} tokens x batch {STAGE1_BATCH}'))
    rows = [kernel_row(report, 'fused', mode, LARGE_TOKENS) for mode in ('forward', 'forward_backward')]
    if all(r and r.get('x_bound') is not None for r in rows):
        results.append(outcome(bound, all(r['x_bound'] <= BANDWIDTH_FACTOR for r in rows),
                               f"forward {rows[0]['x_bound']:.2f}x, forward+backward {rows[1]['x_bound']:.2f}x the "
                               f"bound ({report['peak_bandwidth_gbs']:.0f} GB/s peak)"))
    else:
        results.append(outcome(bound, None, 'no fused rows at that size with x_bound (is the peak bandwidth of '
                                            f"{report.get('device')} unknown to the benchmark?)"))
    return results


def training_rows(report: Dict) -> Tuple[Optional[Dict], Optional[Dict]]:
    """The PyTorch op's row (the run's baseline model) and the fused kernel's ('fused:' + baseline)."""
    baseline = report['meta']['baseline']
    rows = {r['model']: r for r in report['results'] if r['status'] == 'ok'}
    return rows.get(baseline), rows.get(f'fused:{baseline}')


def training_targets(report: Dict) -> List[Outcome]:
    speed, memory = TRAIN_TARGETS
    torch, fused = training_rows(report)
    if not (torch and fused):
        why = 'the PyTorch op or the fused kernel has no timed row (see the report)'
        return [outcome(speed, None, why), outcome(memory, None, why)]
    speedup = fused['throughput'] / torch['throughput']
    results = [outcome(speed, speedup >= TRAIN_SPEEDUP, f"{speedup:.2f}x (PyTorch op {torch['throughput']:.1f} img/s, "
                                                        f"fused {fused['throughput']:.1f} img/s)")]
    if torch.get('peak_mb') and fused.get('peak_mb'):
        ratio = fused['peak_mb'] / torch['peak_mb']
        results.append(outcome(memory, ratio <= TRAIN_MEMORY, f"{ratio:.2f}x (PyTorch op {torch['peak_mb']:.0f} MiB, "
                                                              f"fused {fused['peak_mb']:.0f} MiB)"))
    else:
        results.append(outcome(memory, None, 'peak memory was not measured (see memory_error in the report)'))
    return results


def finite_check(name: str, report: Dict) -> Outcome:
    """Every timed model of a benchmark.py model training report had finite losses only."""
    rows = report['results']
    bad = [f"{r['model']}: {r['status']}: {r.get('error')}" for r in rows if r['status'] != 'ok']
    bad += [f"{r['model']}: non-finite loss" for r in rows if r['status'] == 'ok' and not r.get('losses_finite')]
    if not rows:
        return outcome(name, None, 'no models in the report')
    return outcome(name, not bad, '; '.join(bad) or ', '.join(f"{r['model']} final loss {r['final_loss']:.4f}"
                                                              for r in rows))


def kernel_tests_check(name: str, counts: Dict[str, int]) -> Outcome:
    ran = counts['tests'] - counts['skipped']
    value = (f"{counts['passed']} passed, {counts['failures']} failed, {counts['errors']} errors, "
             f"{counts['skipped']} skipped")
    return outcome(name, None if ran == 0 else counts['failures'] + counts['errors'] == 0,
                   value + (': none ran' if ran == 0 else ''))


def upernet_check(name: str, report: Dict) -> Outcome:
    """benchmark.py segmentor's report: finite losses, with its figures."""
    r, meta = report['result'], report['meta']
    return outcome(name, r['losses_finite'],
                   f"{meta['size'][0]}x{meta['size'][1]}, batch {meta['batch']}, AMP {meta['amp']}: "
                   f"{r['median_ms']:.1f} ms/iteration, {r['throughput']:.1f} img/s, peak {_fmt(r['peak_mb'], '.0f')} "
                   f"MiB, final loss {r['final_loss']:.4f} (mmcv ops: {meta['mmcv_ops']})")


def sr_check(name: str, report: Dict) -> Outcome:
    """benchmark.py sr's report: every NaLa run has a measured peak and a time; the ratios at the most tokens."""
    runs = report['runs']
    nala = [r for r in runs if r['slot'] == SR_BASELINE]
    if not nala:
        return outcome(name, None, f'no {SR_BASELINE} runs in the report')
    missing = [f"{r['mode']} {r['size'][0]}x{r['size'][1]} amp {r['amp']} ({r['status']})" for r in nala
               if r.get('median_ms') is None or (r.get('measured') or {}).get('peak_mb') is None]
    tokens = max(r['tokens'] for r in runs)
    parts = []
    for ratio in report['ratios']:
        if ratio['tokens'] == tokens and ratio['slot'] in SR_COMPARED:
            memory = ('memory n/a' if ratio['memory_ratio'] is None else
                      f"memory {ratio['memory_ratio']:.2f}x ({ratio['memory_source']})")
            time_ratio = 'n/a' if ratio['time_ratio'] is None else f"{ratio['time_ratio']:.2f}x"
            parts.append(f"{ratio['slot']} {ratio['mode']} amp {ratio['amp']}: {memory}, time {time_ratio}")
    value = f"at {tokens:,} tokens, x {SR_BASELINE}: " + ('; '.join(parts) or 'no ratios')
    if missing:
        return outcome(name, None, f"{SR_BASELINE} not measured: {'; '.join(missing)}; {value}")
    return outcome(name, True, value)


def guarded(names: Sequence[str], build: Callable[[], List[Outcome]]) -> List[Outcome]:
    """``build()``, or 'not measured' for each name where a report lacks what it reads."""
    try:
        return build()
    except (KeyError, TypeError, ValueError, ZeroDivisionError) as e:
        return [outcome(name, None, f'unexpected report contents ({type(e).__name__}: {e})') for name in names]


def summarise(work: Path) -> Dict:
    steps = read_steps(work)
    outputs = {name: read_output(work, steps, name) for name in FILES}

    def section(name: str, names: Sequence[str], build: Callable[[object], List[Outcome]]) -> List[Outcome]:
        data, why = outputs[name]
        if data is None:
            return [outcome(n, None, why) for n in names]
        return guarded(names, lambda: build(data))

    targets = section('kernels', KERNEL_TARGETS, kernel_targets) + section('train_bf16', TRAIN_TARGETS,
                                                                           training_targets)
    check_of = dict(kernel_tests=kernel_tests_check, train_bf16=finite_check, train_fp16=finite_check,
                    upernet_bf16=upernet_check, sr=sr_check)
    checks = [o for step, name in CHECKS.items()
              for o in section(step, [name], lambda data, step=step, name=name: [check_of[step](name, data)])]
    reports = {name: data for name, (data, _) in outputs.items() if data is not None}
    train_meta = (reports.get('train_bf16') or {}).get('meta', {})
    return dict(generated=time.strftime('%Y-%m-%d %H:%M:%S'),
                device=train_meta.get('device_name') or (reports.get('kernels') or {}).get('device'),
                torch=train_meta.get('torch'), timm=train_meta.get('timm'),
                targets=targets, checks=checks, steps=steps, reports=reports)


def _fmt(value, spec: str) -> str:
    return 'n/a' if value is None else format(value, spec)


def kernel_lines(report: Dict) -> List[str]:
    peak = _fmt(report.get('peak_bandwidth_gbs'), '.0f')
    lines = [f"Kernels ({report.get('dtype')}, peak DRAM bandwidth {peak} GB/s)",
             f"  {'B x H x N x D':<22}{'mode':<18}{'method':<11}{'ms':>9}{'peak MiB':>10}{'GB/s':>8}{'x bound':>9}"]
    for r in report['rows']:
        shape = f"{r['batch']}x{r['heads']}x{r['tokens']}x{r['head_dim']}"
        failed = '' if r['status'] == 'ok' else f"  {r['status']}: {r.get('error')}"
        lines.append(f"  {shape:<22}{r['mode']:<18}{r['method']:<11}{_fmt(r.get('ms'), '.3f'):>9}"
                     f"{_fmt(r.get('peak_mib'), '.0f'):>10}{_fmt(r.get('bandwidth_gbs'), '.0f'):>8}"
                     f"{_fmt(r.get('x_bound'), '.2f'):>9}{failed}")
    return lines


def training_lines(title: str, report: Dict) -> List[str]:
    meta = report['meta']
    lines = [f"{title}, AMP {meta['amp']}, median of {meta['repeats']}",
             f"  {'model':<24}{'size':<9}{'batch':>6}{'ms':>9}{'img/s':>9}{'peak MiB':>10}{'final loss':>12}  finite"]
    for r in report['results']:
        size = f"{r['size'][0]}x{r['size'][1]}"
        if r['status'] != 'ok':
            lines.append(f"  {r['model']:<24}{size:<9}{r['batch']:>6}  {r['status']}: {r.get('error')}")
            continue
        lines.append(f"  {r['model']:<24}{size:<9}{r['batch']:>6}{r['median_ms']:>9.1f}{r['throughput']:>9.1f}"
                     f"{_fmt(r.get('peak_mb'), '.0f'):>10}{_fmt(r.get('final_loss'), '.4f'):>12}  "
                     f"{'yes' if r.get('losses_finite') else 'NO'}")
    return lines


def sr_lines(report: Dict) -> List[str]:
    meta = report['meta']
    lines = [f"NaLa-SR ({meta['model']}) x{meta['scale']}, batch {meta['batch']}, median of {meta['repeats']}",
             f"  {'mode':<7}{'amp':<6}{'LR size':<9}{'tokens':>8}  {'global slot':<18}{'peak MiB':>10}{'ms':>10}"
             '  status']
    for r in report['runs']:
        peak = (r.get('measured') or {}).get('peak_mb')
        size = f"{r['size'][0]}x{r['size'][1]}"
        lines.append(f"  {r['mode']:<7}{r['amp']:<6}{size:<9}{r['tokens']:>8,}  {r['slot']:<18}"
                     f"{_fmt(peak, '.0f'):>10}{_fmt(r.get('median_ms'), '.1f'):>10}  {r['status']}")
    return lines


def render(summary: Dict) -> str:
    width = max(len(s) for s in (MET, NOT_MET, NOT_MEASURED)) + 2
    known = {key: summary[key] or 'unknown' for key in ('device', 'torch', 'timm')}
    lines = [f"NaLaFormer GPU acceptance (scripts/gpu_acceptance.sh) on {known['device']}, torch {known['torch']}, "
             f"timm {known['timm']}, {summary['generated']}", '', 'Acceptance targets']
    lines += [f"  {o['status']:<{width}}{o['name']}: {o['value']}" for o in summary['targets']]
    lines += ['', 'Checks']
    lines += [f"  {o['status']:<{width}}{o['name']}: {o['value']}" for o in summary['checks']]
    reports = summary['reports']
    tables = dict(kernels=kernel_lines, train_bf16=lambda r: training_lines('NaLaFormer-T training step', r),
                  train_fp16=lambda r: training_lines('NaLaFormer-T training step', r), sr=sr_lines)
    for step, table in tables.items():
        if step in reports:
            try:
                lines += [''] + table(reports[step])
            except (KeyError, TypeError, ValueError) as e:
                lines += ['', f'{step}: unexpected report contents ({type(e).__name__}: {e})']
    steps = summary['steps']
    lines += ['', 'Steps (seconds used / allowed, exit code): ' + (', '.join(
        f"{name} {s['seconds']}/{s['budget']} s" + ('' if s['rc'] == 0 else f" (exit {s['rc']})")
        for name, s in steps.items()) or 'none recorded'),
        f"  in all {sum(s['seconds'] for s in steps.values())} s of {sum(s['budget'] for s in steps.values())} s"]
    return '\n'.join(lines) + '\n'


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('work_dir', type=Path, help="the steps' outputs (scripts/gpu_acceptance.sh's WORK)")
    parser.add_argument('--out-dir', type=Path, required=True, help='where summary.json and summary.txt go')
    return parser.parse_args(argv)


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_args(argv)
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
