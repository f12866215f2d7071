"""Throughput, latency and peak memory of several models at several input sizes, side by side, on CPU or CUDA.

The models of a size are timed alternating; ratios to a baseline model. Peak memory in a fresh process per (model,
size), weights and optimizer state included; ``extra_mb`` above the built model, optimizer and input.
``torch:<spec>`` / ``fused:<spec>`` / ``reference:<spec>`` run on that NaLa backend (unprefixed: the default, 'auto'),
``release:<spec>`` the authors' model with our weights (``--release-file``: beside each NaLaFormer model, unless
``release:`` models are named),
``compiled:<spec>`` the model under torch.compile (``--compile``: each model eager and compiled; compilation happens
in the untimed warm-up), ``frozen:<spec>`` compiled for inference with inductor's freezing (``--freeze``; the
weights become constants of the compiled code: only for a model whose weights no longer change), ``deploy:<spec>`` the model reparameterized for inference (timm's ``reparameterize_model``;
``--deploy``: each model beside its deploy form), ``outofplace:<spec>`` NaLaFormer's inference without its in-place
element-wise work (:func:`nalaformer.models.inplace_inference`). ``--profile`` adds, per row, one profiled
iteration's self time per operator class (CPU time; on CUDA, GPU time: :mod:`nalaformer.analysis.profiles`), and
the multiply-adds of a forward with the rate the median time gives them. Examples::

    python3 tools/analysis/benchmark.py model --sizes 224 448 896 --batch-sizes 8 4 1
    python3 tools/analysis/benchmark.py model --compile --models nalaformer_t convnext_tiny --sizes 224
    python3 tools/analysis/benchmark.py model --peers t --release-file /path/to/NaLaFormer/NaLaformer/NALA.py
    python3 tools/analysis/benchmark.py model --device cuda --amp bf16 --mode train --sizes 224 --batch-sizes 64 \\
        --models nalaformer_t fused:nalaformer_t
"""
import argparse
import math
from pathlib import Path
from typing import Dict, List, Optional, Tuple

import torch
import torch.nn.functional as F
from timm.utils import reparameterize_model

from ...errors import ConfigError
from ...models import inplace_inference
from ...ops import nala_backend
from ..flops import model_flops
from ..grids import parse_size
from ..memory import add_worker_memory, free_memory, malloc_setting, memory_env, tune_malloc, worker_memory
from ..models import ModelSpec, OnnxRuntimeModel, create_model, parse_entry
from ..plots import measured, panels, save_figure, wrapped_title
from ..profiles import KERNEL_PROFILE, class_times
from ..release import has_release, load_release, release_model
from ..results import add_ratios, format_optional, markdown_table, write_report
from ..steps import ModelStep, backend_context, loss_summary
from ..timing import time_steps
from .common import (
    add_amp_arg, add_device_arg, add_keep_going_arg, add_mmap_arg, add_timing_args, check_device, finish_meta,
    mmap_setting, start_meta,
)

# NaLaFormer (all-NaLa first: the baseline; then the released hybrid) beside timm's backbones of about its size
# (params / GMACs at 224): Swin, ConvNeXt and EfficientViT (ReLU linear attention). timm has no Swin below T.
PEERS = dict(
    xt=("nalaformer_xt(attn_types='nala')", 'nalaformer_xt', 'convnext_femto', 'efficientvit_b1'),
    t=("nalaformer_t(attn_types='nala')", 'nalaformer_t', 'swin_tiny_patch4_window7_224', 'convnext_tiny',
       'efficientvit_b2'),
    s=("nalaformer_s(attn_types='nala')", 'nalaformer_s', 'swin_small_patch4_window7_224', 'convnext_small',
       'efficientvit_b3'),
)
TWINS = ('compiled', 'frozen', 'onnx', 'deploy')  # what --compile / --freeze / --onnx / --deploy add beside each model
DEFAULT_MODELS = (
    'nalaformer_t', "nalaformer_t(attn_types='nala')", "nalaformer_t(attn_types='softmax')",
    'swin_tiny_patch4_window7_224', 'convnext_tiny', 'deit_small_patch16_224',
)


def add_arguments(parser: argparse.ArgumentParser):
    parser.add_argument('--models', nargs='+', default=list(DEFAULT_MODELS),
                        help="timm names or specs such as \"nalaformer_t(attn_types='nala')\"; prefix "
                             "'torch:', 'fused:', 'reference:' (NaLa backend), 'release:' (see --release-file), "
                             "'compiled:', 'frozen:', 'onnx:', 'deploy:' or 'outofplace:'")
    parser.add_argument('--peers', choices=tuple(PEERS), default=None,
                        help='instead of --models: NaLaFormer of this size (all-NaLa, the baseline; the released '
                             'hybrid) beside Swin, ConvNeXt and EfficientViT of about its size')
    parser.add_argument('--compile', action='store_true',
                        help="also time each model compiled (torch.compile; as 'compiled:<model>')")
    parser.add_argument('--onnx', action='store_true',
                        help="also time each model exported to ONNX and run by ONNX Runtime (CPU inference; as "
                             "'onnx:<model>')")
    parser.add_argument('--freeze', action='store_true',
                        help="also time each model compiled for inference with inductor's freezing (weights as "
                             "constants; as 'frozen:<model>')")
    parser.add_argument('--deploy', action='store_true',
                        help="also time each model reparameterized for inference (timm's reparameterize_model; as "
                             "'deploy:<model>')")
    parser.add_argument('--profile', action='store_true',
                        help='also profile one iteration of each model: self time per operator class (CPU time; '
                             'on CUDA, GPU time)')
    parser.add_argument('--release-file', type=Path, default=None,
                        help="the authors' NALA.py (outside this repository): the release of each NaLaFormer model "
                             "is timed beside it ('release:<model>'), or only the 'release:<spec>' models named")
    parser.add_argument('--baseline', default=None, help='model the ratios refer to (default: the first)')
    parser.add_argument('--sizes', nargs='+', default=['224', '448', '896'], help='input sizes: 224 or HxW')
    parser.add_argument('--batch-sizes', type=int, nargs='+', default=[1],
                        help='one batch size for all sizes, or one per size')
    parser.add_argument('--mode', choices=('infer', 'train'), default='infer',
                        help='infer: forward under inference_mode; train: forward, backward, AdamW step')
    add_device_arg(parser)
    add_amp_arg(parser)
    add_timing_args(parser, warmup=2, repeats=10)
    parser.add_argument('--no-memory', action='store_true', help='skip the peak-memory subprocesses')
    parser.add_argument('--no-malloc-tuning', action='store_true', help='time with glibc malloc defaults')
    add_mmap_arg(parser)
    add_keep_going_arg(parser)
    parser.add_argument('--out-json', type=Path, default=Path('benchmark.json'))
    parser.add_argument('--out-png', type=Path, default=Path('benchmark.png'))


def make_step(spec: ModelSpec, size: Tuple[int, int], batch: int, mode: str, device: torch.device,
              implementation: Optional[str] = None, release_file: Optional[Path] = None,
              amp: str = 'none', profiled: bool = False) -> ModelStep:
    """Build ``spec`` for ``size`` (H, W) with a random (batch, 3, H, W) input; return one iteration.

    ``implementation``: None (as built), 'torch' / 'fused' / 'reference' (our model on that NaLa backend), 'release',
    'compiled', 'frozen' (compiled with inductor's freezing, for inference), 'onnx' (ONNX Runtime, inference on the
    CPU), 'deploy' (reparameterized for inference) or
    'outofplace' (inference without in-place element-wise work).
    Training: cross-entropy on random labels, AdamW. ``profiled``: a compiled model records each of its generated
    kernels for the profiler (:data:`~nalaformer.analysis.profiles.KERNEL_PROFILE`).
    """
    torch.manual_seed(0)
    model = create_model(spec, img_size=size)
    if implementation == 'release':
        model = release_model(model, release_file)
    if implementation == 'deploy':
        model = reparameterize_model(model.eval())
    model = model.to(device)
    if implementation in ('compiled', 'frozen'):
        # Static shapes: each size gets its own compiled code, as a user compiling for one input size would have
        # (dynamo would otherwise recompile the second size with dynamic shapes).
        options = dict(freezing=implementation == 'frozen', **(KERNEL_PROFILE if profiled else {}))
        model.compile(dynamic=False, options=options)
    x = torch.randn(batch, 3, *size, device=device)
    if implementation == 'onnx':
        model = OnnxRuntimeModel(model, x)
    context = (backend_context(implementation if implementation in ('torch', 'fused', 'reference') else None)
               if implementation != 'outofplace' else lambda: inplace_inference(False))
    if mode == 'infer':
        return ModelStep(model, x, mode, device, amp, context=context)
    target = torch.randint(0, model.num_classes, (batch,), device=device)
    return ModelStep(model, x, mode, device, amp, F.cross_entropy, target,
                     torch.optim.AdamW(model.parameters(), lr=1e-4), context)


def memory_worker(job: Dict) -> Dict:
    """In a fresh process: peak memory (MiB) of two iterations of one model at one size, ``extra_mb`` above the
    built model, its optimizer and input; on CUDA after an uncounted first call (library workspaces)."""
    device = torch.device(job['device'])
    if job['threads']:
        torch.set_num_threads(job['threads'])
    spec, implementation = parse_entry(job['spec'])
    return worker_memory(lambda: make_step(spec, tuple(job['size']), job['batch'], job['mode'], device,
                                           implementation, job['release_file'], job['amp']),
                         device, warmup=1 if device.type == 'cuda' else 0, extra_since='build')


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


def release_twins(models: List[str], release_file: Optional[Path]) -> List[str]:
    """What ``--release-file`` adds to ``models``: 'release:<m>' for each plain NaLaFormer entry, none when a
    'release:' model is named (the user chose which)."""
    entries = [parse_entry(m) for m in models]
    if release_file is None or any(implementation == 'release' for _, implementation in entries):
        return []
    twins = [f'release:{m}' for m, (spec, implementation) in zip(models, entries)
             if implementation is None and has_release(spec)]
    if not twins:
        raise ConfigError(f"--release-file: the release defines nalaformer_* models only, and none of {models} is one; "
                          "add one (e.g. --models nalaformer_t ...) or leave out --release-file")
    return twins


def run(args: argparse.Namespace) -> Dict:
    device = check_device(args.device)
    models = list(PEERS[args.peers] if args.peers else args.models)
    models += release_twins(models, args.release_file)
    twins = [twin for twin, asked in zip(TWINS, (args.compile, args.freeze, args.onnx, args.deploy)) if asked]
    entries = models + [f'{twin}:{m}' for twin in twins for m in models if parse_entry(m)[1] is None]
    specs = [parse_entry(m) for m in entries]
    if any(implementation == 'onnx' for _, implementation in specs) and (args.mode, device.type) != ('infer', 'cpu'):
        raise ConfigError("ONNX Runtime ('onnx:' models, --onnx) times inference on the CPU: use --mode infer "
                          '--device cpu')
    for twin, flag, what in (('deploy', '--deploy', 'a reparameterized model'), ('frozen', '--freeze', 'a frozen model')):
        if any(implementation == twin for _, implementation in specs) and args.mode != 'infer':
            raise ConfigError(f"{what} ('{twin}:' models, {flag}) is for inference: use --mode infer")
    if any(implementation == 'release' for _, implementation in specs):
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
    release_file = args.release_file and str(args.release_file)
    meta = start_meta(
        device, args, mode=args.mode, amp=args.amp, peers=args.peers, compile=args.compile, onnx=args.onnx,
        deploy=args.deploy, freeze=args.freeze, profile=args.profile,
        baseline=baseline, release_file=release_file,
        nala_backend=nala_backend(),
        malloc_timing=malloc_setting(device.type == 'cpu' and not args.no_malloc_tuning and tune_malloc()),
        memory=('torch.cuda.max_memory_allocated, iterations 2-3' if device.type == 'cuda' else
                'peak RSS (VmHWM) above the post-import baseline, fresh process, '
                + mmap_setting(args.memory_mmap_threshold)),
        extra_memory=('max_memory_allocated - memory_allocated after the build' if device.type == 'cuda' else
                      'VmHWM (reset by /proc/self/clear_refs after the build) - VmRSS after the build'))
    results = []
    for size, batch in zip(sizes, batches):
        builders = {spec.label: (lambda spec=spec, implementation=implementation: make_step(
            spec, size, batch, args.mode, device, implementation, args.release_file, args.amp, args.profile))
            for spec, implementation in specs}
        timing = time_steps(builders, device, args.warmup, args.repeats, args.keep_going,
                            f'{size[0]}x{size[1]} b{batch}')
        for spec, _ in specs:
            row = dict(model=spec.label, size=list(size), batch=batch, **timing.contention,
                       **timing.row(spec.label, batch), peak_mb=None, extra_mb=None)
            if row['status'] == 'ok':
                row.update(loss_summary(timing.steps[spec.label].losses))
                if args.profile:
                    row['profile_ms'] = class_times(timing.steps[spec.label], device)
                    row['gmacs'] = model_flops(spec, size, batch).macs / 1e9
                    row['gmacs_per_s'] = row['gmacs'] / (row['median_ms'] / 1000)
            results.append(row)
        del timing  # its steps: the models
        free_memory(device)
    if not args.no_memory:
        add_worker_memory(
            [r for r in results if r['status'] == 'ok'], memory_worker,
            lambda row: dict(spec=row['model'], size=row['size'], batch=row['batch'], mode=args.mode,
                             device=args.device, threads=args.threads, release_file=release_file, amp=args.amp),
            memory_env(args.memory_mmap_threshold), args.keep_going,
            lambda row: f"peak memory of {row['model']} at {row['size'][0]}x{row['size'][1]}", ('peak_mb', 'extra_mb'))
    add_ratios(results, lambda r: r['model'] == baseline, lambda r: (tuple(r['size']), r['batch']),
               dict(latency_ratio='median_ms', memory_ratio='peak_mb', extra_ratio='extra_mb'))
    return dict(meta=finish_meta(meta), results=results, growth=growth(results),
                crossover=crossover(results, baseline))


def crossover(results: List[Dict], baseline: str) -> Dict[str, Dict]:
    """Per model: the smallest size from which ``baseline`` (its 'compiled:' / 'onnx:' twin for such a model) takes
    at most the model's time per image at that and every larger size measured (``overtakes_at``; None where it is
    slower at the largest), with the per-image latency ratio (baseline / model) at each size both were timed."""
    per_image = {(r['model'], tuple(r['size'])): r['median_ms'] / r['batch'] for r in results
                 if r.get('median_ms') is not None}
    table = {}
    for model in dict.fromkeys(r['model'] for r in results):
        prefix = model.partition(':')[0]
        base = f'{prefix}:{baseline}' if prefix in TWINS else baseline
        sizes = sorted({size for name, size in per_image if name == model and (base, size) in per_image},
                       key=lambda size: size[0] * size[1])
        if model == base or not sizes:
            continue
        ratios = {size: per_image[base, size] / per_image[model, size] for size in sizes}
        overtakes = None
        for size in reversed(sizes):
            if ratios[size] > 1:
                break
            overtakes = list(size)
        table[model] = dict(baseline=base, overtakes_at=overtakes,
                            latency_ratio={f'{h}x{w}': ratio for (h, w), ratio in ratios.items()})
    return table


def crossover_sentence(model: str, cross: Dict) -> str:
    """One entry of :func:`crossover` in words, with the per-image latency ratio at each size."""
    where = (f"from {cross['overtakes_at'][0]}x{cross['overtakes_at'][1]} on" if cross['overtakes_at'] else
             'not at the largest size measured')
    ratios = ', '.join(f'{size}: {ratio:.2f}x' for size, ratio in cross['latency_ratio'].items())
    return f"{cross['baseline']} takes at most {model}'s time per image {where} ({ratios})"


def table(report: Dict) -> str:
    train, fmt = report['meta']['mode'] == 'train', format_optional
    header = ['model', 'size', 'batch', 'latency ms, median (IQR)', 'img/s', f"x {report['meta']['baseline']} latency",
              'peak MB', 'x memory', 'extra MB', 'x extra'] + (['final loss', 'finite'] if train else [])
    rows = []
    for r in report['results']:
        cells = [r['model'], f"{r['size'][0]}x{r['size'][1]}", str(r['batch'])]
        if r['status'] != 'ok':
            rows.append(cells + [f"{r['status']}: {r['error']}"] + [''] * (len(header) - 4))
            continue
        cells += [f"{r['median_ms']:.1f} ({r['q1_ms']:.1f}-{r['q3_ms']:.1f})", fmt(r.get('throughput'), '.1f'),
                  fmt(r['latency_ratio'], '.2f'), fmt(r['peak_mb'], '.0f'), fmt(r['memory_ratio'], '.2f'),
                  fmt(r.get('extra_mb'), '.0f'), fmt(r.get('extra_ratio'), '.2f')]
        if train:
            finite = r.get('losses_finite')
            cells += [fmt(r.get('final_loss'), '.4f'), 'n/a' if finite is None else 'yes' if finite else 'NO']
        rows.append(cells)
    return markdown_table(header, rows)


def profile_table(report: Dict) -> str:
    """Per profiled row: milliseconds (and share of the total) per operator class, the classes as columns."""
    rows = [r for r in report['results'] if 'profile_ms' in r]
    classes = list(dict.fromkeys(c for r in rows for c in r['profile_ms'] if c != 'total'))
    header = ['model', 'size', 'batch', 'GMACs', 'GMACs/s', 'profiled ms'] + classes
    return markdown_table(header, [
        [r['model'], 'x'.join(map(str, r['size'])), str(r['batch']), f"{r['gmacs']:.1f}", f"{r['gmacs_per_s']:.1f}",
         f"{r['profile_ms']['total']:.1f}"]
        + [f"{r['profile_ms'][c]:.1f} ({100 * r['profile_ms'][c] / r['profile_ms']['total']:.0f}%)"
           if c in r['profile_ms'] else '—' for c in classes] for r in rows])


def plot(report: Dict, out: Path):
    """Per-image latency and peak memory (where measured: not with ``--no-memory``) against pixels per image,
    log-log, with slope-1 and slope-2 guides."""
    results, meta = report['results'], report['meta']
    values = measured([(lambda r: None if r['median_ms'] is None else r['median_ms'] / r['batch'],
                        'latency per image (ms)'), (lambda r: r.get('peak_mb'), 'peak memory (MB)')],
                      results, lambda quantity, r: quantity[0](r))
    fig, axes = panels(1, max(1, len(values)), 6, 4.6)
    sizes = {r['size'][0] * r['size'][1] / 1e6: r['size'] for r in results}  # megapixels -> (H, W)
    largest = max(sizes)
    for ax, (value, ylabel) in zip(axes[0], values):
        points = {}
        for r in results:
            if value(r) is not None:
                points.setdefault(r['model'], []).append((r['size'][0] * r['size'][1] / 1e6, value(r)))
        for model, xy in points.items():
            ax.plot(*zip(*xy), marker='o', label=model)
        anchor = next(iter(points.values()), [None])[0]  # guides start at the first model's first point
        if anchor and largest > anchor[0]:
            for slope, style in ((1, ':'), (2, '--')):
                ax.plot([anchor[0], largest], [anchor[1], anchor[1] * (largest / anchor[0]) ** slope],
                        color='gray', ls=style, lw=1, label=f'∝ pixels^{slope}')
        ax.set(xscale='log', yscale='log', xlabel='input size (log pixels per image)', ylabel=ylabel)
        ax.set_xticks(list(sizes), [f'{h}x{w}' for h, w in sizes.values()], minor=False)
        ax.set_xticks([], minor=True)
        ax.grid(True, which='both', alpha=0.3)
    axes[0][0].legend(fontsize=7)
    others = [r['other_busy_cores'] for r in results if r.get('other_busy_cores') is not None]
    wrapped_title(fig, f"{meta['mode']} on {meta['device_name']}, {meta['threads']} thread(s), batch "
                       f"{sorted({r['batch'] for r in results})}, median of {meta['repeats']}; load "
                       f"{meta['load_at_start']} -> {meta['load_at_end']}"
                       + (f'; other processes busy: up to {max(others):.2f} cores' if others else ''))
    save_figure(fig, out)


def main(args: argparse.Namespace) -> int:
    report = run(args)
    written = write_report(report, args.out_json, plot, args.out_png)
    print(table(report))
    if any('profile_ms' in r for r in report['results']):
        print(profile_table(report))
    for model, cross in report['crossover'].items():
        print(crossover_sentence(model, cross))
    for model, steps in report['growth'].items():
        for g in steps:
            print(f"{model}: {g['sizes'][0]} -> {g['sizes'][1]}: per 4x pixels, latency/image x"
                  f"{g['latency_per_image_per_4x_pixels']:.2f}, memory x"
                  f"{format_optional(g['peak_memory_per_4x_pixels'], '.2f')}")
    print(written)
    return 0
