"""Peak memory and time of the whole NaLa-SR network per global attention: the paper's token-heavy claim.

The paper: in super-resolution at 70K+ tokens NaLa cuts peak memory by 92.3% (69 GB -> 5.3 GB) and latency by
36.4% (195 -> 124 ms). Here the same x2 network (``nalasr_light``, batch 1) runs with its global slot computed by
each of ``--slots`` (default: ``nala``; ``softmax``, PyTorch's fused SDPA; ``softmax_explicit``, which stores the
N x N matrix; ``none``, window attention only), at LR sizes 128x128, 256x256 and 256x288 (16,384, 65,536 and
73,728 tokens), for inference (forward under inference_mode) and a training step (forward, L1 loss, backward,
Adam step). For every run:

* accounted memory: the tensor memory of the run counted on fake tensors
  (:func:`nalaformer.analysis.tensor_memory.fake_memory`): any size, no data computed;
* measured memory, for runs whose accounted peak fits ``--max-memory-gb`` (default: 85% of the memory available
  at start): CPU, resident memory of a fresh process (VmHWM) with glibc mapping every tensor over 128 KiB fresh
  (``MALLOC_MMAP_THRESHOLD_``, so freed tensors leave the resident set); CUDA, ``max_memory_allocated``. Both
  after one uncounted iteration (its one-off allocations, optimizer state included, are in ``peak_mb``, not in
  ``extra_mb``), over two counted ones. ``measured_over_accounted`` compares their ``extra_mb``;
* time: median of ``--repeats`` rounds after ``--warmup`` in one process, the slots of a size and mode
  alternating (A B C D A B C D ...), with the load of other processes recorded (runs that fit only).

A run that runs out of memory is recorded ('out of memory'; 'not timed: ...' when that happens while timing); one
that fails otherwise stops the benchmark with its error, or with ``--keep-going`` records it ('memory not measured:
...', 'not timed: ...') and the others go on.

Ratios to ``nala`` at each size and mode, memory (peak_mb: measured when both runs have a measurement, else
accounted for both; the source is named) and time, are printed next to the paper's. Writes ``benchmark_sr.json``
and ``benchmark_sr.png`` to ``--out-dir``. Examples::

    python3 tools/analysis/benchmark_sr.py --threads 2 --out-dir docs/benchmark_sr_cpu     # ~1 h on 2 cores
    python3 tools/analysis/benchmark_sr.py --device cuda --amp none bf16 --out-dir runs/sr_gpu
    python3 tools/analysis/benchmark_sr.py --tiny --out-dir /tmp/sr_smoke                   # seconds
"""
import argparse
import os
import sys
import time
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import timm
import torch
import torch.nn.functional as F
from timm.layers import use_fused_attn
from tqdm import tqdm

from nalaformer.analysis.grids import parse_size
from nalaformer.analysis.machine import device_name, load_average
from nalaformer.analysis.memory import (
    MIB, add_memory_worker_arg, answer_memory_worker, available_memory_mb, free_memory, malloc_setting, memory_env,
    run_memory_worker, tune_malloc, worker_memory,
)
from nalaformer.analysis.models import ModelSpec, create_model, parse_model_spec
from nalaformer.analysis.results import (
    OUT_OF_MEMORY, Failure, add_keep_going_arg, attempt, format_optional, outputs_line, save_figure, write_json,
)
from nalaformer.analysis.steps import AMP_DTYPES, MODES, ModelStep
from nalaformer.analysis.tensor_memory import fake_memory
from nalaformer.analysis.timing import summarize, time_steps
from nalaformer.errors import ConfigError, run_tool
from nalaformer.models.nala_sr import WINDOW_ONLY

SLOTS = ('nala', 'softmax', 'softmax_explicit', WINDOW_ONLY)
BASELINE = 'nala'
DEFAULT_SIZES = ('128x128', '256x256', '256x288')
TINY_MODEL = 'nalasr_light(embed_dim=16, depths=(1, 1), num_heads=2, window_size=8)'
TINY_SIZES = ('24x24', '32x40')
# The paper's SR figures: peak memory (GB) and latency (ms), softmax SR transformer -> NaLa.
PAPER = dict(memory_gb=(69.0, 5.3), latency_ms=(195.0, 124.0))
# Memory workers: glibc maps allocations over this many bytes fresh (and unmaps them when freed).
MMAP_THRESHOLD = 131072


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--model', default=None, help='SR model spec (default nalasr_light), e.g. '
                                                      '"nalasr_light(depths=(2, 2))"')
    parser.add_argument('--scale', type=int, default=2, choices=(2, 3, 4))
    parser.add_argument('--batch', type=int, default=1)
    parser.add_argument('--sizes', nargs='+', default=None, help=f'LR sizes: 128 or HxW (default {DEFAULT_SIZES})')
    parser.add_argument('--slots', nargs='+', default=list(SLOTS),
                        help=f'global attention kernels (attn_types); {WINDOW_ONLY!r}: window attention only')
    parser.add_argument('--modes', nargs='+', default=list(MODES), choices=MODES)
    parser.add_argument('--device', default='cuda' if torch.cuda.is_available() else 'cpu', choices=('cpu', 'cuda'))
    parser.add_argument('--amp', nargs='+', default=['none'], choices=tuple(AMP_DTYPES),
                        help='autocast dtypes, each a separate set of runs (fp16 training adds a GradScaler)')
    parser.add_argument('--threads', type=int, default=None, help='CPU threads (default: torch default)')
    parser.add_argument('--warmup', type=int, default=1, help='untimed iterations per run before timing')
    parser.add_argument('--repeats', type=int, default=None,
                        help='timed rounds (default 3); each round runs every slot once')
    parser.add_argument('--max-memory-gb', type=float, default=None,
                        help='measure and time only runs whose accounted peak fits (default: 85%% of the memory '
                             'available at start, or of the GPU)')
    parser.add_argument('--no-measure', action='store_true', help='accounted memory only (no runs)')
    parser.add_argument('--account', choices=('all', 'unmeasured', 'none'), default=None,
                        help='which runs get accounted memory: all (CPU, the default there: it decides what is run), '
                             'unmeasured (CUDA default: those out of GPU memory) or none (CUDA)')
    parser.add_argument('--no-time', action='store_true', help='no timing (memory only)')
    parser.add_argument('--memory-mmap-threshold', type=int, default=MMAP_THRESHOLD, metavar='BYTES',
                        help='CPU memory workers map allocations over BYTES fresh; 0: glibc defaults (whose '
                             'dynamic threshold keeps freed memory resident: RSS above the live tensors)')
    parser.add_argument('--no-malloc-tuning', action='store_true', help='time with glibc malloc defaults')
    add_keep_going_arg(parser)
    parser.add_argument('--tiny', action='store_true',
                        help=f'smoke run defaults: {TINY_MODEL} at {TINY_SIZES}, 1 repeat')
    parser.add_argument('--out-dir', type=Path, default=Path('benchmark_sr'))
    add_memory_worker_arg(parser)
    args = parser.parse_args(argv)
    defaults = (TINY_MODEL, TINY_SIZES, 1) if args.tiny else ('nalasr_light', DEFAULT_SIZES, 3)
    args.model, args.sizes, args.repeats = (given if given is not None else default for given, default in
                                            zip((args.model, args.sizes, args.repeats), defaults))
    if args.batch < 1 or args.repeats < 1 or args.warmup < 0:
        raise ConfigError(f'--batch and --repeats must be positive and --warmup >= 0, got {args.batch}, '
                          f'{args.repeats}, {args.warmup}')
    return args


# ----------------------------------------------------------------------------------------------
# One run: a model with one global slot, at one size, in one mode
# ----------------------------------------------------------------------------------------------
def make_step(spec: ModelSpec, slot: str, size: Tuple[int, int], mode: str, scale: int, batch: int,
              device: torch.device, amp: str, fake: bool = False) -> ModelStep:
    """Build the model with ``attn_types=slot`` and a random LR batch; return one iteration.

    Training: L1 loss against a random HR target, Adam (the recipe's lr and betas), fp16 with a GradScaler (not under
    ``fake`` tensors, whose values are unknown: the scaler only rescales in place).
    """
    torch.manual_seed(0)
    model = create_model(spec, upscale=scale, attn_types=slot)
    if not fake:  # fake models are built on the CPU device and cannot move
        model = model.to(device)
    x = torch.rand(batch, 3, *size, device=device)
    if mode == 'infer':
        return ModelStep(model, x, mode, device, amp)
    target = torch.rand(batch, 3, scale * size[0], scale * size[1], device=device)
    return ModelStep(model, x, mode, device, amp, F.l1_loss, target,
                     torch.optim.Adam(model.parameters(), lr=2e-4, betas=(0.9, 0.99)), grad_scaling=not fake)


def account(spec: ModelSpec, run: Dict, args: argparse.Namespace) -> Dict:
    """Tensor memory of ``run`` counted on fake tensors (CPU device; CPU autocast for ``amp``)."""
    memory = fake_memory(lambda: make_step(spec, run['slot'], tuple(run['size']), run['mode'], args.scale,
                                           args.batch, torch.device('cpu'), run['amp'], fake=True))
    return dict(peak_mb=memory.peak_mb, extra_mb=memory.extra_mb)


def memory_worker(job: Dict) -> Dict:
    """In a fresh process (CPU) or this one (CUDA): :func:`worker_memory` of one run."""
    if job['threads']:
        torch.set_num_threads(job['threads'])
    device = torch.device(job['device'])
    return worker_memory(lambda: make_step(parse_model_spec(job['model']), job['slot'], tuple(job['size']),
                                           job['mode'], job['scale'], job['batch'], device, job['amp']), device)


def measure_memory(run: Dict, args: argparse.Namespace) -> Dict:
    """CPU: a fresh process per run; CUDA: this process (the allocator's peak is reset per run)."""
    job = dict(model=args.model, slot=run['slot'], size=run['size'], mode=run['mode'], amp=run['amp'],
               scale=args.scale, batch=args.batch, device=args.device, threads=args.threads)
    if args.device == 'cuda':
        try:
            return memory_worker(job)
        finally:
            free_memory(torch.device('cuda'))
    return run_memory_worker(Path(__file__), job, memory_env(args.memory_mmap_threshold or None))


# ----------------------------------------------------------------------------------------------
# The benchmark
# ----------------------------------------------------------------------------------------------
def memory_budget_mb(args: argparse.Namespace) -> float:
    if args.max_memory_gb is not None:
        return args.max_memory_gb * 1024
    if args.device == 'cuda':
        return 0.85 * torch.cuda.get_device_properties(0).total_memory / MIB
    available = available_memory_mb()
    if available is None:
        available = os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES') / MIB
    return 0.85 * available


def memory_ratio(run: Dict, base: Dict) -> Tuple[Optional[float], Optional[str]]:
    """Peak memory of ``run`` over ``base``'s and its source: both measured, else both accounted, else None."""
    for source in ('measured', 'accounted'):
        mine, theirs = ((r.get(source) or {}).get('peak_mb') for r in (run, base))
        if mine is not None and theirs:
            return mine / theirs, source
    return None, None


def ratios(runs: List[Dict]) -> List[Dict]:
    """Each slot against ``nala`` at the same size, mode and amp: peak memory (one source for both) and time."""
    groups = {}
    for run in runs:
        groups.setdefault((tuple(run['size']), run['mode'], run['amp']), {})[run['slot']] = run
    table = []
    for (size, mode, amp), by_slot in groups.items():
        base = by_slot.get(BASELINE)
        for slot, run in by_slot.items():
            if base is None or slot == BASELINE:
                continue
            memory, source = memory_ratio(run, base)
            time_ratio = (run['median_ms'] / base['median_ms']
                          if run.get('median_ms') is not None and base.get('median_ms') is not None else None)
            table.append(dict(size=list(size), tokens=size[0] * size[1], mode=mode, amp=amp, slot=slot,
                              memory_ratio=memory, memory_source=source, time_ratio=time_ratio))
    return table


def check_accounting(args: argparse.Namespace) -> str:
    """The --account policy: CPU runs are accounted first (what fits is decided on it); CUDA runs may try first."""
    if args.no_measure:
        return 'all'
    policy = args.account or ('all' if args.device == 'cpu' else 'unmeasured')
    if args.device == 'cpu' and policy != 'all':
        raise ConfigError(f'--account {policy} is for CUDA runs, where a run too large for the GPU fails with an '
                          f'out-of-memory error; on CPU every run is accounted first so that none exhausts the memory')
    return policy


def add_accounted(spec: ModelSpec, run: Dict, args: argparse.Namespace, budget: float):
    run['accounted'] = account(spec, run, args)
    if run['accounted']['peak_mb'] > budget:
        run['fits'] = False
        run['status'] = f"accounted only: needs {run['accounted']['peak_mb']:,.0f} MiB, budget {budget:,.0f} MiB"


def add_measured(run: Dict, args: argparse.Namespace):
    memory = attempt(lambda: measure_memory(run, args), args.keep_going, f"memory of {run_label(run)}")
    if isinstance(memory, Failure):  # not timed either
        run['fits'] = False
        run['status'] = OUT_OF_MEMORY if memory.status == OUT_OF_MEMORY else f'memory not measured: {memory.error}'
        run['error'] = memory.error
        return
    run['measured'] = memory
    if run.get('accounted') and memory.get('extra_mb') is not None:
        run['measured_over_accounted'] = memory['extra_mb'] / run['accounted']['extra_mb']


def add_times(spec: ModelSpec, runs: List[Dict], args: argparse.Namespace, device: torch.device,
              timed_group: Callable[[], None]):
    groups = {}
    for run in runs:
        if run['fits']:
            groups.setdefault((run['amp'], run['mode'], tuple(run['size'])), []).append(run)
    for (amp, mode, size), group in tqdm(groups.items(), desc='time'):
        builders = {run['slot']: (lambda run=run: make_step(spec, run['slot'], size, mode, args.scale, args.batch,
                                                            device, amp)) for run in group}
        timing = time_steps(builders, device, args.warmup, args.repeats, args.keep_going,
                            f'{mode} {size[0]}x{size[1]} amp {amp}')
        timing.steps.clear()
        free_memory(device)
        for run in group:
            run['contention'] = timing.contention
            if run['slot'] in timing.failures:
                failure = timing.failures[run['slot']]
                run.update(status=f'not timed: {failure.error}', error=failure.error)
            else:
                run.update(summarize(timing.samples[run['slot']], args.batch))
        timed_group()


def run_label(run: Dict) -> str:
    return f"{run['slot']} {run['mode']} {run['size'][0]}x{run['size'][1]} amp {run['amp']}"


def run_benchmark(args: argparse.Namespace, save: Callable[[Dict], None] = lambda report: None) -> Dict:
    """All runs of ``args``; ``save(report)`` is called with the report so far after every run measured and every
    size timed (a run stopped part-way keeps what it measured)."""
    device = torch.device(args.device)
    if device.type == 'cuda' and not torch.cuda.is_available():
        raise ConfigError('--device cuda: no CUDA device is available')
    policy = check_accounting(args)
    spec = parse_model_spec(args.model)
    for slot in args.slots:  # an unknown kernel is a user error now, not a failed run later
        with torch.device('meta'):
            create_model(spec, upscale=args.scale, attn_types=slot)
    sizes = [parse_size(s) for s in args.sizes]
    if args.threads:
        torch.set_num_threads(args.threads)
    budget = memory_budget_mb(args)
    malloc_tuned = device.type == 'cpu' and not args.no_malloc_tuning and not args.no_time and tune_malloc()
    meta = dict(
        model=args.model, scale=args.scale, batch=args.batch, device=device.type, device_name=device_name(device),
        threads=torch.get_num_threads(), warmup=args.warmup, repeats=args.repeats, memory_budget_mb=budget,
        torch=torch.__version__, timm=timm.__version__, paper=PAPER, accounting_policy=policy,
        window_attention_fused=use_fused_attn(experimental=True),
        accounted='tensor storage counted on fake tensors (nalaformer.analysis.tensor_memory), CPU device',
        measured=('torch.cuda.max_memory_allocated' if device.type == 'cuda' else
                  'VmHWM of a fresh process, ' + (f'MALLOC_MMAP_THRESHOLD_={args.memory_mmap_threshold}'
                                                  if args.memory_mmap_threshold else 'glibc malloc defaults')),
        malloc_timing=malloc_setting(malloc_tuned),
        started=time.strftime('%Y-%m-%d %H:%M:%S'), load_at_start=load_average(),
    )
    runs = [dict(slot=slot, mode=mode, size=list(size), tokens=size[0] * size[1], amp=amp, accounted=None,
                 measured=None, fits=True, status='ok')
            for amp in args.amp for mode in args.modes for size in sizes for slot in args.slots]

    def report(finished: bool = False) -> Dict:
        meta.update(finished=time.strftime('%Y-%m-%d %H:%M:%S') if finished else None,
                    load_at_end=load_average())
        return dict(meta=meta, runs=runs, ratios=ratios(runs))

    if policy == 'all':
        for run in tqdm(runs, desc='accounted memory (fake tensors)'):
            add_accounted(spec, run, args, budget)
    if args.no_measure:
        for run in runs:
            run['fits'] = False
            if run['status'] == 'ok':
                run['status'] = 'accounted only (--no-measure)'
    else:
        for run in tqdm([r for r in runs if r['fits']], desc='measured memory'):
            add_measured(run, args)
            save(report())
        if policy == 'unmeasured':
            for run in tqdm([r for r in runs if not r['fits']], desc='accounted memory (fake tensors)'):
                add_accounted(spec, run, args, budget)
        if not args.no_time:
            add_times(spec, runs, args, device, lambda: save(report()))
    return report(finished=True)


# ----------------------------------------------------------------------------------------------
# Output
# ----------------------------------------------------------------------------------------------
def paper_ratios() -> Dict[str, float]:
    return dict(memory=PAPER['memory_gb'][0] / PAPER['memory_gb'][1],
                time=PAPER['latency_ms'][0] / PAPER['latency_ms'][1])


def run_memory(run: Dict) -> Tuple[Optional[float], Optional[str]]:
    """A run's peak MiB and its source: measured, else accounted (None if neither)."""
    for source in ('measured', 'accounted'):
        if (run.get(source) or {}).get('peak_mb') is not None:
            return run[source]['peak_mb'], source
    return None, None


def markdown_table(report: Dict) -> str:
    """Per run: memory (measured / accounted, MiB), time, and the ratios to nala; then the paper's ratios."""
    by_key = {(tuple(r['size']), r['mode'], r['amp'], r['slot']): r for r in report['ratios']}
    lines = ['| mode | amp | LR size (tokens) | global slot | peak MiB measured | peak MiB accounted | '
             'measured / accounted (extra) | ms (median) | x nala memory | x nala time | status |',
             '|---|---|---|---|---|---|---|---|---|---|---|']
    for run in report['runs']:
        ratio = by_key.get((tuple(run['size']), run['mode'], run['amp'], run['slot']), {})
        measured = (run.get('measured') or {}).get('peak_mb')
        accounted = (run.get('accounted') or {}).get('peak_mb')
        memory_ratio = ratio.get('memory_ratio')
        lines.append(
            f"| {run['mode']} | {run['amp']} | {run['size'][0]}x{run['size'][1]} ({run['tokens']:,}) | {run['slot']} | "
            f"{format_optional(measured, '.0f')} | {format_optional(accounted, '.0f')} | "
            f"{format_optional(run.get('measured_over_accounted'), '.3f')} | "
            f"{format_optional(run.get('median_ms'), '.1f')} | "
            + ('' if memory_ratio is None else f"{memory_ratio:.2f} ({ratio['memory_source']})") + ' | '
            + f"{format_optional(ratio.get('time_ratio'), '.2f')} | {run['status']} |")
    paper = paper_ratios()
    lines.append(f"\nPaper (softmax SR transformer / NaLa, 70K+ tokens): memory {PAPER['memory_gb'][0]:g} -> "
                 f"{PAPER['memory_gb'][1]:g} GB = {paper['memory']:.1f}x, latency {PAPER['latency_ms'][0]:g} -> "
                 f"{PAPER['latency_ms'][1]:g} ms = {paper['time']:.2f}x.")
    return '\n'.join(lines)


def plot(report: Dict, path: Path):
    """Peak memory (log) and time per size, one bar per slot, a row per (mode, amp); accounted-only bars hatched."""
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    runs = report['runs']
    rows = list(dict.fromkeys((r['mode'], r['amp']) for r in runs))
    slots = list(dict.fromkeys(r['slot'] for r in runs))
    sizes = list(dict.fromkeys(tuple(r['size']) for r in runs))
    fig, axes = plt.subplots(len(rows), 2, figsize=(13, 3.8 * len(rows)), squeeze=False)
    width = 0.8 / len(slots)
    for (mode, amp), (ax_memory, ax_time) in zip(rows, axes):
        for i, slot in enumerate(slots):
            picked = [next((r for r in runs if r['mode'] == mode and r['amp'] == amp and r['slot'] == slot
                            and tuple(r['size']) == size), None) for size in sizes]
            xs = [j + i * width for j in range(len(sizes))]
            memory = [run_memory(r)[0] if r else 0 for r in picked]
            hatches = ['//' if r and run_memory(r)[1] == 'accounted' else '' for r in picked]
            bars = ax_memory.bar(xs, memory, width, label=slot, color=f'C{i}')
            for bar, hatch in zip(bars, hatches):
                bar.set_hatch(hatch)
            ax_time.bar(xs, [r.get('median_ms') or 0 if r else 0 for r in picked], width, label=slot, color=f'C{i}')
        labels = [f'{h}x{w}\n({h * w:,} tokens)' for h, w in sizes]
        for ax, title in ((ax_memory, 'peak memory (MiB, log; hatched: accounted only)'), (ax_time, 'time (ms)')):
            ax.set_xticks([j + 0.4 - width / 2 for j in range(len(sizes))], labels, fontsize=8)
            ax.set_title(f'{mode}, amp {amp}: {title}', fontsize=9)
            ax.legend(fontsize=7)
        ax_memory.set_yscale('log')
    meta = report['meta']
    paper = paper_ratios()
    fig.suptitle(f"{meta['model']} x{meta['scale']}, batch {meta['batch']}, {meta['device_name']}; paper: memory "
                 f"{paper['memory']:.1f}x, time {paper['time']:.2f}x (softmax / NaLa)", fontsize=9)
    save_figure(fig, path, rect=(0, 0, 1, 0.95))


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_args(argv)
    if args.memory_worker:
        return answer_memory_worker(memory_worker, args.memory_worker)
    out = args.out_dir / 'benchmark_sr.json'
    report = run_benchmark(args, lambda report: write_json(out, report))  # a run stopped part-way keeps what it did
    write_json(out, report)
    plot(report, args.out_dir / 'benchmark_sr.png')
    print(markdown_table(report))
    agreement = [r['measured_over_accounted'] for r in report['runs'] if r.get('measured_over_accounted')]
    if agreement:
        print(f'measured / accounted memory above the warm state: {min(agreement):.3f}-{max(agreement):.3f} '
              f'over {len(agreement)} runs')
    print(outputs_line(report['meta'], out, args.out_dir / 'benchmark_sr.png'))
    return 0


if __name__ == '__main__':
    sys.exit(run_tool(main))
