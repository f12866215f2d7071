"""Throughput, latency and peak memory of several models at several input sizes, side by side, on CPU or CUDA.

Every model of a size is timed in the same loop, alternating (A B C A B C ...), so that drifts
of the machine hit all of them alike; results are medians with their IQR and min/max, and
ratios to a baseline model measured in the same run. Peak memory comes from a fresh
subprocess per (model, size): peak RSS (VmHWM) above the post-import baseline on CPU (default
glibc allocator), ``torch.cuda.max_memory_allocated`` on CUDA (over two iterations after an untimed
first one, whose one-off allocations, e.g. cuBLAS / cuDNN workspaces, would otherwise count); it includes the weights (and in
training the gradients and AdamW state). ``extra_mb`` is the peak above the built model, optimizer
and input (VmHWM reset after the build), i.e. what the iterations add. glibc's dynamic mmap
threshold makes RSS peaks move by ~10% between identical runs; ``--memory-mmap-threshold 131072``
maps every tensor fresh so that they follow the live tensors exactly.

On CPU the timing process disables glibc's per-tensor mmap and heap trimming (mallopt, the
same as MALLOC_MMAP_MAX_=0 and an unbounded MALLOC_TRIM_THRESHOLD_): otherwise every tensor over 32 MB is
mapped fresh on every forward and high resolutions look slower than they are. Load averages
and the CPU time used by other processes during each timing loop are recorded.

Models are timm names or specs with kwargs; swin/deit-style models with a fixed input size
are built for each size (``img_size``). A model that fails to build or run at a size stops the benchmark with
its error; with ``--keep-going`` the row records the error (status 'error') and the others go on. Running out of
memory is a result (status 'out of memory'), not a failure.
Every model is built right after ``torch.manual_seed(0)``: models of one architecture get the same weights.
``--amp bf16|fp16`` runs forward (and the loss) under ``torch.autocast``, fp16 training with a
``GradScaler``. Training rows also record the final loss and whether every loss of the run was finite.
Prefixes compare implementations of one NaLaFormer spec in the same run:

* ``fused:<spec>`` / ``reference:<spec>`` run our model with the ``nala`` / ``nala_cos`` kernels on the
  fused Triton backend (where it supports the inputs) / on nala.py's plain-PyTorch reference
  (``nalaformer.ops.use_nala_backend``); without a prefix they run on the current backend, by default
  the PyTorch operator (``meta['nala_backend']``);
* ``release:<spec>`` runs the authors' release model (``NALAFORMER`` of the NALA.py given by
  ``--release-file``, kept outside this repository) of the same architecture and attention types
  ('nala' -> 'l', 'softmax' -> 'v'), with our model's weights loaded (the layouts are identical).

Examples::

    python3 tools/analysis/benchmark.py --sizes 224 448 896 --batch-sizes 8 4 1
    python3 tools/analysis/benchmark.py --mode train --models nalaformer_t swin_tiny_patch4_window7_224
    python3 tools/analysis/benchmark.py --models "nalaformer_t(attn_types='nala')" convnext_tiny --sizes 512x1024
    python3 tools/analysis/benchmark.py --mode train --sizes 224 --batch-sizes 8 --release-file /tmp/release/NALA.py \
        --models release:nalaformer_t nalaformer_t reference:nalaformer_t swin_tiny_patch4_window7_224
    python3 tools/analysis/benchmark.py --device cuda --amp bf16 --mode train --sizes 224 --batch-sizes 64 \
        --models nalaformer_t fused:nalaformer_t
"""
import argparse
import math
import sys
import time
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

import timm
import torch
import torch.nn.functional as F
from tqdm import tqdm

from nalaformer.analysis.grids import parse_size
from nalaformer.analysis.machine import device_name, load_average
from nalaformer.analysis.memory import (
    add_memory_worker_arg, answer_memory_worker, free_memory, malloc_setting, memory_env, run_memory_worker,
    tune_malloc, worker_memory,
)
from nalaformer.analysis.models import ModelSpec, create_model, parse_entry
from nalaformer.analysis.release import load_release, release_model
from nalaformer.analysis.results import (
    Failure, add_keep_going_arg, add_ratios, attempt, format_optional, outputs_line, save_figure, write_json,
)
from nalaformer.analysis.steps import AMP_DTYPES, ModelStep, backend_context, loss_summary
from nalaformer.analysis.timing import summarize, time_steps
from nalaformer.errors import ConfigError, run_tool
from nalaformer.ops import nala_backend

DEFAULT_MODELS = (
    'nalaformer_t', "nalaformer_t(attn_types='nala')", "nalaformer_t(attn_types='softmax')",
    'swin_tiny_patch4_window7_224', 'convnext_tiny', 'deit_small_patch16_224',
)


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--models', nargs='+', default=list(DEFAULT_MODELS),
                        help="timm names or specs such as \"nalaformer_t(attn_types='nala')\"; prefix "
                             "'fused:', 'reference:' (NaLa backend) or 'release:' (see --release-file)")
    parser.add_argument('--release-file', type=Path, default=None,
                        help="the authors' NALA.py (outside this repository) for 'release:<spec>' models")
    parser.add_argument('--baseline', default=None, help='model the ratios refer to (default: the first)')
    parser.add_argument('--sizes', nargs='+', default=['224', '448', '896'], help='input sizes: 224 or HxW')
    parser.add_argument('--batch-sizes', type=int, nargs='+', default=[1],
                        help='one batch size for all sizes, or one per size')
    parser.add_argument('--mode', choices=('infer', 'train'), default='infer',
                        help='infer: forward under inference_mode; train: forward, backward, AdamW step')
    parser.add_argument('--device', default='cuda' if torch.cuda.is_available() else 'cpu', choices=('cpu', 'cuda'))
    parser.add_argument('--amp', choices=tuple(AMP_DTYPES), default='none',
                        help='autocast dtype of forward and loss (fp16 training adds a GradScaler)')
    parser.add_argument('--threads', type=int, default=None, help='CPU threads (default: torch default)')
    parser.add_argument('--warmup', type=int, default=2, help='untimed iterations per model and size')
    parser.add_argument('--repeats', type=int, default=10, help='timed rounds; each round runs every model once')
    parser.add_argument('--no-memory', action='store_true', help='skip the peak-memory subprocesses')
    parser.add_argument('--no-malloc-tuning', action='store_true', help='time with glibc malloc defaults')
    parser.add_argument('--memory-mmap-threshold', type=int, default=None, metavar='BYTES',
                        help='memory workers map every allocation over BYTES fresh (MALLOC_MMAP_THRESHOLD_: '
                             "no dynamic glibc threshold, so peak RSS follows live tensors; default: glibc defaults)")
    add_keep_going_arg(parser)
    parser.add_argument('--out-json', type=Path, default=Path('benchmark.json'))
    parser.add_argument('--out-png', type=Path, default=Path('benchmark.png'))
    add_memory_worker_arg(parser)
    return parser.parse_args(argv)


def make_step(spec: ModelSpec, size: Tuple[int, int], batch: int, mode: str,
              device: torch.device, variant: Optional[str] = None,
              release_file: Optional[Path] = None, amp: str = 'none') -> ModelStep:
    """Build ``spec`` for ``size`` (H, W) with a random (batch, 3, H, W) input; return one iteration.

    ``variant``: None (as built), 'fused' / 'reference' (our model on that NaLa backend) or 'release' (the
    release's model). ``amp``: a key of ``AMP_DTYPES``. Training: cross-entropy on random labels, AdamW.
    """
    torch.manual_seed(0)
    model = create_model(spec, img_size=size)
    if variant == 'release':
        model = release_model(model, release_file)
    model = model.to(device)
    x = torch.randn(batch, 3, *size, device=device)
    context = backend_context(variant if variant != 'release' else None)
    if mode == 'infer':
        return ModelStep(model, x, mode, device, amp, context=context)
    target = torch.randint(0, model.num_classes, (batch,), device=device)
    return ModelStep(model, x, mode, device, amp, F.cross_entropy, target,
                     torch.optim.AdamW(model.parameters(), lr=1e-4), context)


# ----------------------------------------------------------------------------------------------
# Peak memory, one fresh process per (model, size)
# ----------------------------------------------------------------------------------------------
def memory_worker(job: Dict) -> Dict:
    """Run in a fresh process: peak memory (MiB) of two iterations of one model at one size.

    ``peak_mb``: above the post-import baseline (weights, gradients and optimizer state included);
    ``extra_mb``: above the built model, its optimizer and input (what the iterations add). On CUDA after an
    uncounted first call (its one-off allocations, library workspaces, are not an iteration's).
    """
    device = torch.device(job['device'])
    if job['threads']:
        torch.set_num_threads(job['threads'])
    spec, variant = parse_entry(job['spec'])
    return worker_memory(lambda: make_step(spec, tuple(job['size']), job['batch'], job['mode'], device, variant,
                                           job.get('release_file'), job.get('amp', 'none')),
                         device, warmup=1 if device.type == 'cuda' else 0, extra_since='build')


def measure_memory(spec: str, size: Tuple[int, int], batch: int, args: argparse.Namespace) -> Dict:
    job = dict(spec=spec, size=size, batch=batch, mode=args.mode, device=args.device, threads=args.threads,
               release_file=None if args.release_file is None else str(args.release_file), amp=args.amp)
    return run_memory_worker(Path(__file__), job, memory_env(args.memory_mmap_threshold))


# ----------------------------------------------------------------------------------------------
# The run
# ----------------------------------------------------------------------------------------------
def growth(results: List[Dict]) -> Dict[str, List[Dict]]:
    """Per model, between consecutive sizes: factor of per-image latency and of peak memory per 4x pixels."""
    table = {}
    for model in dict.fromkeys(r['model'] for r in results):
        rows = [r for r in results if r['model'] == model and r.get('median_ms') is not None]
        steps = []
        for a, b in zip(rows, rows[1:]):
            pixels = (b['size'][0] * b['size'][1]) / (a['size'][0] * a['size'][1])
            if pixels == 1:
                continue
            exponent = math.log(4) / math.log(pixels)
            latency = (b['median_ms'] / b['batch']) / (a['median_ms'] / a['batch'])
            memory = b['peak_mb'] / a['peak_mb'] if a.get('peak_mb') and b.get('peak_mb') else None
            steps.append(dict(sizes=[a['size'], b['size']], batches=[a['batch'], b['batch']],
                              latency_per_image_per_4x_pixels=latency ** exponent,
                              peak_memory_per_4x_pixels=None if memory is None else memory ** exponent))
        table[model] = steps
    return table


def run(args: argparse.Namespace) -> Dict:
    device = torch.device(args.device)
    if device.type == 'cuda' and not torch.cuda.is_available():
        raise ConfigError('--device cuda: no CUDA device is available')
    specs = [parse_entry(m) for m in args.models]
    if any(variant == 'release' for _, variant in specs):
        load_release(args.release_file)  # a missing or broken file is a user error now, not failed rows
    labels = [s.label for s, _ in specs]
    if len(set(labels)) != len(labels):
        raise ConfigError(f'models are listed twice: {labels}')
    baseline = args.baseline or labels[0]
    if baseline not in labels:
        raise ConfigError(f'--baseline {baseline!r} is not one of --models {labels}')
    sizes = [parse_size(s) for s in args.sizes]
    if len(args.batch_sizes) not in (1, len(sizes)) or min(args.batch_sizes) < 1:
        raise ConfigError(f'--batch-sizes takes one positive value or one per size ({len(sizes)}), '
                          f'got {args.batch_sizes}')
    batches = args.batch_sizes * len(sizes) if len(args.batch_sizes) == 1 else args.batch_sizes
    if args.threads:
        torch.set_num_threads(args.threads)
    malloc_tuned = device.type == 'cpu' and not args.no_malloc_tuning and tune_malloc()

    meta = dict(
        device=device.type, device_name=device_name(device), threads=torch.get_num_threads(), mode=args.mode,
        amp=args.amp, warmup=args.warmup, repeats=args.repeats, baseline=baseline, torch=torch.__version__,
        timm=timm.__version__, malloc_timing=malloc_setting(malloc_tuned),
        memory=('torch.cuda.max_memory_allocated, iterations 2-3' if device.type == 'cuda' else
                'peak RSS (VmHWM) above the post-import baseline, fresh process, ' +
                ('glibc defaults' if args.memory_mmap_threshold is None else
                 f'MALLOC_MMAP_THRESHOLD_={args.memory_mmap_threshold}')),
        extra_memory=('max_memory_allocated - memory_allocated after the build' if device.type == 'cuda' else
                      'VmHWM (reset by /proc/self/clear_refs after the build) - VmRSS after the build'),
        nala_backend=nala_backend(),
        release_file=None if args.release_file is None else str(args.release_file),
        started=time.strftime('%Y-%m-%d %H:%M:%S'), load_at_start=load_average(),
    )
    results = []
    for size, batch in zip(sizes, batches):
        builders = {spec.label: (lambda spec=spec, variant=variant: make_step(
            spec, size, batch, args.mode, device, variant, args.release_file, args.amp)) for spec, variant in specs}
        timing = time_steps(builders, device, args.warmup, args.repeats, args.keep_going,
                            f'{size[0]}x{size[1]} b{batch}')
        for spec, _ in specs:
            row = dict(model=spec.label, size=list(size), batch=batch, **timing.contention)
            if spec.label in timing.failures:
                row.update(timing.failures[spec.label].as_row(), median_ms=None, peak_mb=None, extra_mb=None)
            else:
                row.update(status='ok', **summarize(timing.samples[spec.label], batch),
                           **loss_summary(timing.steps[spec.label].losses), peak_mb=None, extra_mb=None)
            results.append(row)
        del timing
        free_memory(device)
    if not args.no_memory:
        for row in tqdm([r for r in results if r['status'] == 'ok'], desc='peak memory (fresh process each)'):
            memory = attempt(lambda: measure_memory(row['model'], tuple(row['size']), row['batch'], args),
                             args.keep_going, f"peak memory of {row['model']} at {row['size'][0]}x{row['size'][1]}")
            if isinstance(memory, Failure):
                row['memory_error'] = f'{memory.status}: {memory.error}'
            else:
                row.update(peak_mb=memory['peak_mb'], extra_mb=memory['extra_mb'])
    add_ratios(results, lambda r: r['model'] == baseline, lambda r: (tuple(r['size']), r['batch']),
               dict(latency_ratio='median_ms', memory_ratio='peak_mb', extra_ratio='extra_mb'))
    meta.update(finished=time.strftime('%Y-%m-%d %H:%M:%S'), load_at_end=load_average())
    return dict(meta=meta, results=results, growth=growth(results))


# ----------------------------------------------------------------------------------------------
# Output
# ----------------------------------------------------------------------------------------------
def markdown_table(report: Dict) -> str:
    train = report['meta']['mode'] == 'train'
    lines = [f"| model | size | batch | latency ms, median (IQR) | img/s | x {report['meta']['baseline']} "
             f"latency | peak MB | x memory | extra MB | x extra |" + (' final loss | finite |' if train else ''),
             '|---|---|---|---|---|---|---|---|---|---|' + ('---|---|' if train else '')]
    for r in report['results']:
        if r['status'] != 'ok':
            lines.append(f"| {r['model']} | {r['size'][0]}x{r['size'][1]} | {r['batch']} | {r['status']}: {r['error']} "
                         f"|{' |' * (8 if train else 6)}")
            continue
        latency = f"{r['median_ms']:.1f} ({r['q1_ms']:.1f}-{r['q3_ms']:.1f})"
        line = (f"| {r['model']} | {r['size'][0]}x{r['size'][1]} | {r['batch']} | {latency} | "
                f"{format_optional(r.get('throughput'), '.1f')} | {format_optional(r['latency_ratio'], '.2f')} | "
                f"{format_optional(r['peak_mb'], '.0f')} | {format_optional(r['memory_ratio'], '.2f')} | "
                f"{format_optional(r.get('extra_mb'), '.0f')} | {format_optional(r.get('extra_ratio'), '.2f')} |")
        if train:
            finite = r.get('losses_finite')
            line += f" {format_optional(r.get('final_loss'), '.4f')} | {'n/a' if finite is None else 'yes' if finite else 'NO'} |"
        lines.append(line)
    return '\n'.join(lines)


def plot(report: Dict, out: Path):
    """Per-image latency and peak memory against pixels per image, log-log, with slope-1/2 guides."""
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(12, 4.6))
    panels = ((axes[0], lambda r: None if r['median_ms'] is None else r['median_ms'] / r['batch'],
               'latency per image (ms)'),
              (axes[1], lambda r: r['peak_mb'], 'peak memory (MB)'))
    models = list(dict.fromkeys(r['model'] for r in report['results']))
    sizes = {r['size'][0] * r['size'][1] / 1e6: r['size'] for r in report['results']}  # megapixels -> (H, W)
    largest = max(sizes)
    for ax, value, ylabel in panels:
        points = {m: [(r['size'][0] * r['size'][1] / 1e6, value(r)) for r in report['results']
                      if r['model'] == m and value(r) is not None] for m in models}
        for model, xy in points.items():
            if xy:
                ax.plot(*zip(*xy), marker='o', label=model)
        anchor = next((xy[0] for xy in points.values() if xy), None)  # guides start at the first model's first point
        if anchor and largest > anchor[0]:
            for slope, style in ((1, ':'), (2, '--')):
                ax.plot([anchor[0], largest], [anchor[1], anchor[1] * (largest / anchor[0]) ** slope],
                        color='gray', ls=style, lw=1, label=f'∝ pixels^{slope}')
        ax.set_xscale('log')
        ax.set_yscale('log')
        ax.set_xticks(list(sizes), [f'{h}x{w}' for h, w in sizes.values()], minor=False)
        ax.set_xticks([], minor=True)
        ax.set_xlabel('input size (log pixels per image)')
        ax.set_ylabel(ylabel)
        ax.grid(True, which='both', alpha=0.3)
    axes[0].legend(fontsize=7)
    meta = report['meta']
    batches = sorted({r['batch'] for r in report['results']})
    others = [r['other_busy_cores'] for r in report['results'] if r.get('other_busy_cores') is not None]
    fig.suptitle(f"{meta['mode']} on {meta['device_name']}, {meta['threads']} thread(s), batch {batches}, "
                 f"median of {meta['repeats']}; load {meta['load_at_start']} -> {meta['load_at_end']}"
                 + (f'; other processes busy: up to {max(others):.2f} cores' if others else ''), fontsize=9)
    save_figure(fig, out, rect=(0, 0, 1, 0.94))


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_args(argv)
    if args.memory_worker:
        return answer_memory_worker(memory_worker, args.memory_worker)
    report = run(args)
    write_json(args.out_json, report)
    plot(report, args.out_png)
    print(markdown_table(report))
    for model, steps in report['growth'].items():
        for g in steps:
            print(f"{model}: {g['sizes'][0]} -> {g['sizes'][1]}: per 4x pixels, latency/image "
                  f"x{g['latency_per_image_per_4x_pixels']:.2f}, memory x{format_optional(g['peak_memory_per_4x_pixels'], '.2f')}")
    print(outputs_line(report['meta'], args.out_json, args.out_png))
    return 0


if __name__ == '__main__':
    sys.exit(run_tool(main))
