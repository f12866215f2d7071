"""Peak memory and time of the whole NaLa-SR network per global attention: the paper's token-heavy claim.

The x2 ``nalasr_light`` (batch 1) with its global attention (a run's ``slot``) computed by each of ``--attn-types``, for
inference and a training step: memory accounted on fake tensors (any size), measured where the accounted peak fits
(VmHWM of a fresh process, or CUDA's peak), and time; ratios to ``nala`` beside the paper's (69 -> 5.3 GB, 195 -> 124
ms at 70K+ tokens). Writes ``benchmark_sr.json`` (after every run, too) and ``benchmark_sr.png`` to ``--out-dir``::

    python3 tools/analysis/benchmark.py sr --threads 2 --out-dir docs/benchmark_sr_cpu     # ~1 h on 2 cores
    python3 tools/analysis/benchmark.py sr --device cuda --amp none bf16 --out-dir runs/sr_gpu
    python3 tools/analysis/benchmark.py sr --tiny --out-dir /tmp/sr_smoke                   # seconds
"""
import argparse
import os
from dataclasses import asdict
from functools import partial
from pathlib import Path
from typing import Callable, Dict, List, Optional, Tuple

import torch
import torch.nn.functional as F
from timm.layers import use_fused_attn
from tqdm import tqdm

from ...errors import ConfigError
from ...models.nala_sr import WINDOW_ONLY
from ..grids import parse_size
from ..memory import (
    MIB, available_memory_mb, free_memory, malloc_setting, memory_env, run_memory_worker, tune_malloc, worker_memory,
)
from ..models import ModelSpec, create_model, parse_model_spec
from ..plots import grouped_bars, measured, panels, save_figure, wrapped_title
from ..results import OUT_OF_MEMORY, Failure, attempt, format_optional, markdown_table, write_json, write_report
from ..steps import MODES, ModelStep
from ..tensor_memory import fake_memory
from ..timing import time_steps
from .common import (
    add_amp_arg, add_device_arg, add_keep_going_arg, add_mmap_arg, add_timing_args, check_device, finish_meta,
    mmap_setting, start_meta,
)

ATTN_TYPES = ('nala', 'softmax', 'softmax_explicit', WINDOW_ONLY)
BASELINE = 'nala'
DEFAULT_SIZES = ('128x128', '256x256', '256x288')
TINY_MODEL = 'nalasr_light(embed_dim=16, depths=(1, 1), num_heads=2, window_size=8)'
TINY_SIZES = ('24x24', '32x40')
# The paper's SR figures: peak memory (GB) and latency (ms), softmax SR transformer -> NaLa.
PAPER = dict(memory_gb=(69.0, 5.3), latency_ms=(195.0, 124.0))
PAPER_RATIOS = {name: before / after for name, (before, after) in zip(('memory', 'time'), PAPER.values())}
SOURCES = ('measured', 'accounted')  # of a run's peak memory, in the order preferred


def add_arguments(parser: argparse.ArgumentParser):
    parser.add_argument('--model', default=None, help='SR model spec (default nalasr_light), e.g. '
                                                      '"nalasr_light(depths=(2, 2))"')
    parser.add_argument('--scale', type=int, default=2, choices=(2, 3, 4))
    parser.add_argument('--batch', type=int, default=1)
    parser.add_argument('--sizes', nargs='+', default=None, help=f'LR sizes: 128 or HxW (default {DEFAULT_SIZES})')
    parser.add_argument('--attn-types', nargs='+', default=list(ATTN_TYPES),
                        help=f'attn_type of the global attention, one per run; {WINDOW_ONLY!r}: window attention only')
    parser.add_argument('--modes', nargs='+', default=list(MODES), choices=MODES)
    add_device_arg(parser)
    add_amp_arg(parser, several=True)
    add_timing_args(parser, warmup=1, repeats=None)
    parser.add_argument('--max-memory-gb', type=float, default=None,
                        help='measure and time only runs whose accounted peak fits (default: 85%% of the memory '
                             'available at start, or of the GPU)')
    parser.add_argument('--no-measure', action='store_true', help='accounted memory only (no runs)')
    parser.add_argument('--account', choices=('all', 'unmeasured', 'none'), default=None,
                        help='which runs get accounted memory: all (CPU, the default there: it decides what is run), '
                             'unmeasured (CUDA default: those out of GPU memory) or none (CUDA)')
    parser.add_argument('--no-time', action='store_true', help='no timing (memory only)')
    add_mmap_arg(parser, default=131072)
    parser.add_argument('--no-malloc-tuning', action='store_true', help='time with glibc malloc defaults')
    add_keep_going_arg(parser)
    parser.add_argument('--tiny', action='store_true',
                        help=f'smoke run defaults: {TINY_MODEL} at {TINY_SIZES}, 1 repeat (default: 3)')
    parser.add_argument('--out-dir', type=Path, default=Path('benchmark_sr'))


def check_args(args: argparse.Namespace) -> str:
    """Fill the defaults of ``--tiny`` or not; return the ``--account`` policy: CPU runs are accounted first (what
    fits is decided on it), CUDA runs may try first."""
    defaults = (TINY_MODEL, TINY_SIZES, 1) if args.tiny else ('nalasr_light', DEFAULT_SIZES, 3)
    args.model, args.sizes, args.repeats = (default if given is None else given for given, default in
                                            zip((args.model, args.sizes, args.repeats), defaults))
    if args.batch < 1 or args.repeats < 1 or args.warmup < 0:
        raise ConfigError(f'--batch and --repeats must be positive and --warmup >= 0, got {args.batch}, '
                          f'{args.repeats}, {args.warmup}')
    policy = 'all' if args.no_measure else args.account or ('all' if args.device == 'cpu' else 'unmeasured')
    if args.device == 'cpu' and policy != 'all':
        raise ConfigError(f'--account {policy} is for CUDA runs, where a run too large for the GPU fails with an '
                          f'out-of-memory error; on CPU every run is accounted first so that none exhausts the memory')
    return policy


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
    return asdict(fake_memory(lambda: make_step(spec, run['slot'], tuple(run['size']), run['mode'], args.scale,
                                                args.batch, torch.device('cpu'), run['amp'], fake=True)))


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
    return run_memory_worker(memory_worker, job, memory_env(args.memory_mmap_threshold))


def memory_budget_mb(args: argparse.Namespace) -> float:
    """``--max-memory-gb`` in MiB, else 85% of the GPU's memory or of the memory available now."""
    if args.max_memory_gb is not None:
        return args.max_memory_gb * 1024
    if args.device == 'cuda':
        return 0.85 * torch.cuda.get_device_properties(0).total_memory / MIB
    return 0.85 * (available_memory_mb() or os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES') / MIB)


def peak_mb(run: Dict, source: str) -> Optional[float]:
    """A run's peak memory (MiB) of ``source``, 'measured' or 'accounted'; None where it has none."""
    return (run.get(source) or {}).get('peak_mb')


def first_memory(value: Callable[[str], Optional[float]]) -> Tuple[Optional[float], Optional[str]]:
    """The first ``value(source)`` of :data:`SOURCES` that is not None, and its source; (None, None) if none is."""
    return next(((v, source) for source in SOURCES if (v := value(source)) is not None), (None, None))


def ratio(value: Optional[float], base: Optional[float]) -> Optional[float]:
    return value / base if value is not None and base else None


def run_key(run: Dict) -> Tuple:
    """The runs compared with each other and timed together: those of a size, mode and amp."""
    return tuple(run['size']), run['mode'], run['amp']


def ratios(runs: List[Dict]) -> List[Dict]:
    """Each attention type against ``nala`` at the same size, mode and amp: peak memory (both measured, else both
    accounted) and time."""
    bases = {run_key(run): run for run in runs if run['slot'] == BASELINE}
    table = []
    for run in runs:
        base = bases.get(run_key(run))
        if base is None or run is base:
            continue
        memory, source = first_memory(lambda source: ratio(peak_mb(run, source), peak_mb(base, source)))
        table.append(dict(size=run['size'], tokens=run['tokens'], mode=run['mode'], amp=run['amp'], slot=run['slot'],
                          memory_ratio=memory, memory_source=source,
                          time_ratio=ratio(run.get('median_ms'), base.get('median_ms'))))
    return table


def add_accounted(spec: ModelSpec, run: Dict, args: argparse.Namespace, budget: float):
    run['accounted'] = account(spec, run, args)
    if run['accounted']['peak_mb'] > budget:
        run['fits'] = False
        run['status'] = f"accounted only: needs {run['accounted']['peak_mb']:,.0f} MiB, budget {budget:,.0f} MiB"


def add_measured(run: Dict, args: argparse.Namespace):
    label = f"{run['slot']} {run['mode']} {run['size'][0]}x{run['size'][1]} amp {run['amp']}"
    memory = attempt(lambda: measure_memory(run, args), args.keep_going, f'memory of {label}')
    if isinstance(memory, Failure):  # not timed either
        run.update(fits=False, error=memory.error, status=OUT_OF_MEMORY if memory.status == OUT_OF_MEMORY
                   else f'memory not measured: {memory.error}')
        return
    run['measured'] = memory
    if run.get('accounted') and memory.get('extra_mb') is not None:
        run['measured_over_accounted'] = memory['extra_mb'] / run['accounted']['extra_mb']


def add_times(spec: ModelSpec, runs: List[Dict], args: argparse.Namespace, device: torch.device,
              timed_group: Callable[[], None]):
    """Time the runs that fit, the attention types of a size, mode and amp alternating; ``timed_group()`` after
    each such group."""
    groups = {}
    for run in runs:
        if run['fits']:
            groups.setdefault(run_key(run), []).append(run)
    for (size, mode, amp), group in tqdm(groups.items(), desc='time'):
        builders = {run['slot']: (lambda slot=run['slot']: make_step(spec, slot, size, mode, args.scale, args.batch,
                                                                     device, amp)) for run in group}
        timing = time_steps(builders, device, args.warmup, args.repeats, args.keep_going,
                            f'{mode} {size[0]}x{size[1]} amp {amp}')
        timing.steps.clear()
        free_memory(device)
        for run in group:
            run.update(contention=timing.contention, **timing.row(run['slot'], args.batch))
            if run['status'] != 'ok':
                run['status'] = f"not timed: {run['error']}"
        timed_group()


def run_benchmark(args: argparse.Namespace, save: Callable[[Dict], None] = lambda report: None) -> Dict:
    """All runs of ``args``; ``save(report)`` is called with the report so far after every run measured and every
    size timed (a run stopped part-way keeps what it measured)."""
    policy = check_args(args)
    device = check_device(args.device)
    spec = parse_model_spec(args.model)
    for slot in args.attn_types:  # an unknown kernel is a user error now, not a failed run later
        with torch.device('meta'):
            create_model(spec, upscale=args.scale, attn_types=slot)
    sizes = [parse_size(s) for s in args.sizes]
    budget = memory_budget_mb(args)
    meta = start_meta(
        device, args, model=args.model, scale=args.scale, batch=args.batch, memory_budget_mb=budget, paper=PAPER,
        accounting_policy=policy, window_attention_fused=use_fused_attn(experimental=True),
        accounted='tensor storage counted on fake tensors (nalaformer.analysis.tensor_memory), CPU device',
        measured=('torch.cuda.max_memory_allocated' if device.type == 'cuda' else
                  'VmHWM of a fresh process, ' + mmap_setting(args.memory_mmap_threshold)),
        malloc_timing=malloc_setting(device.type == 'cpu' and not (args.no_malloc_tuning or args.no_time)
                                     and tune_malloc()))
    runs = [dict(slot=slot, mode=mode, size=list(size), tokens=size[0] * size[1], amp=amp, accounted=None,
                 measured=None, fits=True, status='ok')
            for amp in args.amp for mode in args.modes for size in sizes for slot in args.attn_types]

    def report(finished: bool = False) -> Dict:
        return dict(meta=finish_meta(meta, finished), runs=runs, ratios=ratios(runs))

    def add_all_accounted(chosen: List[Dict]):
        for run in tqdm(chosen, desc='accounted memory (fake tensors)'):
            add_accounted(spec, run, args, budget)

    if policy == 'all':
        add_all_accounted(runs)
    if args.no_measure:
        for run in runs:
            run.update(fits=False, status='accounted only (--no-measure)' if run['status'] == 'ok' else run['status'])
    else:
        for run in tqdm([r for r in runs if r['fits']], desc='measured memory'):
            add_measured(run, args)
            save(report())
        if policy == 'unmeasured':
            add_all_accounted([r for r in runs if not r['fits']])
        if not args.no_time:
            add_times(spec, runs, args, device, lambda: save(report()))
    return report(finished=True)


def table(report: Dict) -> str:
    """Per run: memory (measured / accounted, MiB), time, and the ratios to nala; then the paper's ratios."""
    ratios_of = {(*run_key(r), r['slot']): r for r in report['ratios']}
    fmt, rows = format_optional, []
    for run in report['runs']:
        vs_nala = ratios_of.get((*run_key(run), run['slot']), {})
        memory_ratio = vs_nala.get('memory_ratio')
        rows.append([run['mode'], run['amp'], f"{run['size'][0]}x{run['size'][1]} ({run['tokens']:,})", run['slot'],
                     fmt(peak_mb(run, 'measured'), '.0f'), fmt(peak_mb(run, 'accounted'), '.0f'),
                     fmt(run.get('measured_over_accounted'), '.3f'), fmt(run.get('median_ms'), '.1f'),
                     '' if memory_ratio is None else f"{memory_ratio:.2f} ({vs_nala['memory_source']})",
                     fmt(vs_nala.get('time_ratio'), '.2f'), run['status']])
    return markdown_table(['mode', 'amp', 'LR size (tokens)', 'global slot', 'peak MiB measured', 'peak MiB accounted',
                           'measured / accounted (extra)', 'ms (median)', 'x nala memory', 'x nala time', 'status'],
                          rows) + (
        f"\n\nPaper (softmax SR transformer / NaLa, 70K+ tokens): memory {PAPER['memory_gb'][0]:g} -> "
        f"{PAPER['memory_gb'][1]:g} GB = {PAPER_RATIOS['memory']:.1f}x, latency {PAPER['latency_ms'][0]:g} -> "
        f"{PAPER['latency_ms'][1]:g} ms = {PAPER_RATIOS['time']:.2f}x.")


def plot(report: Dict, path: Path):
    """Peak memory (log) and time per size, one bar per attention type, a row per (mode, amp); accounted-only bars
    hatched. A quantity no run has (time with ``--no-time``) gets no panels."""
    runs = report['runs']
    rows = list(dict.fromkeys((r['mode'], r['amp']) for r in runs))
    slots = list(dict.fromkeys(r['slot'] for r in runs))
    sizes = list(dict.fromkeys(tuple(r['size']) for r in runs))
    labels = [f'{h}x{w}\n({h * w:,} tokens)' for h, w in sizes]
    run_of = {(*run_key(r), r['slot']): r for r in runs}
    quantities = measured(['memory', 'time'], runs, lambda quantity, r: r.get('median_ms') if quantity == 'time'
                          else first_memory(partial(peak_mb, r))[0])
    fig, axes = panels(len(rows), max(1, len(quantities)), 6.5, 3.8)
    for (mode, amp), row_axes in zip(rows, axes):
        picked = {slot: [run_of.get((size, mode, amp, slot), {}) for size in sizes] for slot in slots}
        for quantity, ax in zip(quantities, row_axes):
            if quantity == 'memory':
                # measured memory where there is some, else accounted
                memory = {s: [first_memory(partial(peak_mb, r)) for r in rs] for s, rs in picked.items()}
                grouped_bars(ax, labels, {s: [mb for mb, _ in m] for s, m in memory.items()},
                             hatches={s: ['//' if source == 'accounted' else '' for _, source in m]
                                      for s, m in memory.items()})
                ax.set_yscale('log')
                ax.set_title(f'{mode}, amp {amp}: peak memory (MiB, log; hatched: accounted only)', fontsize=9)
            else:
                grouped_bars(ax, labels, {s: [r.get('median_ms') for r in rs] for s, rs in picked.items()})
                ax.set_title(f'{mode}, amp {amp}: time (ms)', fontsize=9)
    meta = report['meta']
    wrapped_title(fig, f"{meta['model']} x{meta['scale']}, batch {meta['batch']}, {meta['device_name']}; paper: "
                       f"memory {PAPER_RATIOS['memory']:.1f}x, time {PAPER_RATIOS['time']:.2f}x (softmax / NaLa)")
    save_figure(fig, path, rect=(0, 0, 1, 0.95))


def main(args: argparse.Namespace) -> int:
    out = args.out_dir / 'benchmark_sr.json'
    report = run_benchmark(args, lambda report: write_json(out, report))  # a run stopped part-way keeps what it did
    written = write_report(report, out, plot, args.out_dir / 'benchmark_sr.png')
    print(table(report))
    agreement = [r['measured_over_accounted'] for r in report['runs'] if r.get('measured_over_accounted')]
    if agreement:
        print(f'measured / accounted memory above the warm state: {min(agreement):.3f}-{max(agreement):.3f} '
              f'over {len(agreement)} runs')
    print(written)
    return 0
