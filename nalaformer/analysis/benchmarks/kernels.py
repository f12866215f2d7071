"""Time and memory of the NaLa attention implementations vs softmax SDPA, forward and forward + backward.

Per shape (batch, heads, tokens, head dim): the ``nala`` kernel on each NaLa backend and ``sdpa``, median time, CUDA
peak of one call, ``bandwidth_gbs`` and ``x_bound`` (time over that at peak DRAM bandwidth); ``--check``: the fused
kernel's errors against the PyTorch operator. On CPU the fused kernels need Triton's interpreter. Examples::

    python3 tools/analysis/benchmark.py kernels --device cuda --dtype bfloat16 --check \\
        --shapes 64x1x3136x64 8x1x16384x64 2x1x65536x64 --out-dir runs/bench
    TRITON_INTERPRET=1 python3 tools/analysis/benchmark.py kernels --tiny --out-dir /tmp/bench
"""
import argparse
import re
import statistics
from functools import partial
from pathlib import Path
from typing import Callable, Dict, List, Optional, Tuple

import torch
import torch.nn.functional as F
from tqdm import tqdm

from ...ops import build_attention_kernel, rope_angles, rope_table, use_nala_backend
from ..grids import token_grid
from ..machine import device_name, peak_bandwidth
from ..memory import call_peak_mb, free_memory
from ..plots import grouped_bars, measured, panels, save_figure, wrapped_title
from ..results import add_ratios, format_optional, markdown_table, write_report
from ..timing import time_repeats
from .common import add_keep_going_arg, attempt_row, attention_call, check_device

METHODS = ('fused', 'torch', 'reference', 'sdpa')
MODES = ('forward', 'forward_backward')
DTYPES = ('bfloat16', 'float16', 'float32')
# Stage 1 of NaLaFormer-T at 224 (batch 64: one head of 64), then 16K and 65K tokens with the same head.
DEFAULT_SHAPES = ('64x1x3136x64', '8x1x16384x64', '2x1x65536x64')
TINY_SHAPES = ('1x2x9x32', '2x1x25x32')
SHAPE_KEYS = ('batch', 'heads', 'tokens', 'head_dim')
Shape = Tuple[int, int, int, int]


def parse_shape(text: str) -> Shape:
    """'BxHxNxD' -> (batch, heads, tokens, head dim)."""
    if not re.fullmatch(r'0*[1-9]\d*(x0*[1-9]\d*){3}', text.lower()):
        raise argparse.ArgumentTypeError(f'shape {text!r} must be BATCHxHEADSxTOKENSxHEAD_DIM, e.g. 64x1x3136x64')
    return tuple(map(int, text.lower().split('x')))


def add_arguments(parser: argparse.ArgumentParser):
    parser.add_argument('--device', default=None, choices=('cpu', 'cuda'),
                        help='default: cuda if available (cpu with --tiny)')
    parser.add_argument('--dtype', default='bfloat16', choices=DTYPES, help='dtype of q, k, v')
    parser.add_argument('--shapes', type=parse_shape, nargs='+', default=[parse_shape(s) for s in DEFAULT_SHAPES],
                        metavar='BxHxNxD')
    parser.add_argument('--methods', nargs='+', default=list(METHODS), choices=METHODS,
                        help='NaLa backends of the nala kernel, and sdpa')
    parser.add_argument('--warmup', type=int, default=3)
    parser.add_argument('--repeats', type=int, default=10)
    parser.add_argument('--out-dir', type=Path, default=Path('benchmark_kernels'))
    parser.add_argument('--check', action='store_true',
                        help="also record the fused kernel's errors (out, dq, dk, dv) against the PyTorch operator")
    parser.add_argument('--tiny', action='store_true', help='smoke run: two tiny shapes, float32, one repeat (CPU)')
    add_keep_going_arg(parser)


def make_inputs(shape: Shape, dtype: str, device: torch.device):
    """q, k, v (B, H, N, d) in ``dtype`` needing grad, and the (2, N, d) RoPE table of N's token grid."""
    torch.manual_seed(0)
    q, k, v = (torch.randn(shape, device=device).to(getattr(torch, dtype)).requires_grad_() for _ in range(3))
    return q, k, v, rope_table(rope_angles(shape[-1], device=device), *token_grid(shape[2]))


def build_method(name: str) -> Callable:
    """(q, k, v, rope) -> out for a method name: SDPA, or the nala kernel, each call on the NaLa backend ``name``."""
    if name == 'sdpa':
        return lambda q, k, v, rope: F.scaled_dot_product_attention(q, k, v)
    return use_nala_backend(name)(build_attention_kernel('nala'))  # (a decorator: a fresh context per call)


def io_bytes(q: torch.Tensor, out: torch.Tensor, mode: str) -> int:
    """Bytes that must cross DRAM at least once: q, k, v in and out out (plus dout in, dq, dk, dv out)."""
    moved = 3 * q.numel() * q.element_size() + out.numel() * out.element_size()
    return moved if mode == 'forward' else 2 * moved


def measure(args: argparse.Namespace, method: str, shape: Shape, mode: str, peak: Optional[float]) -> Dict:
    """One result row: the median time and its figures, or (out of memory, or failing with ``--keep-going``) the
    status and error."""
    device = torch.device(args.device)

    def timed_row() -> Dict:
        inputs = make_inputs(shape, args.dtype, device)
        fn = build_method(method)
        out = attention_call(fn, inputs, 'forward')
        call = partial(attention_call, fn, inputs, mode, torch.randn_like(out))
        times = time_repeats(call, device, args.warmup, args.repeats)
        median, moved = statistics.median(times), io_bytes(inputs[0], out, mode)
        gbs = moved / (median * 1e-3) / 1e9
        return dict(status='ok', ms=median, times_ms=times, peak_mib=call_peak_mb(call, device), io_bytes=moved,
                    bandwidth_gbs=gbs, x_bound=peak / gbs if peak else None)

    row = dict(zip(SHAPE_KEYS, shape), method=method, mode=mode)
    row.update(attempt_row(timed_row, args.keep_going, f'{method} {mode} at {shape_label(row)}'))
    free_memory(device)
    return row


def check_errors(args: argparse.Namespace, shape: Shape) -> Dict:
    """Max |fused - torch| / max |torch| of out, dq, dk, dv on the same inputs and dout (or the failure)."""
    def errors() -> Dict:
        inputs = make_inputs(shape, args.dtype, torch.device(args.device))
        outs = [build_method(name)(*inputs) for name in ('fused', 'torch')]
        dout = torch.randn_like(outs[1])
        fused, ref = ([out, *torch.autograd.grad(out, inputs[:3], dout)] for out in outs)
        return dict(relative_max_error={name: ((a.float() - b.float()).abs().max() / b.float().abs().max()).item()
                                        for name, a, b in zip(('out', 'dq', 'dk', 'dv'), fused, ref)})
    row = dict(zip(SHAPE_KEYS, shape))
    return dict(row, **attempt_row(errors, args.keep_going, f'check at {shape_label(row)}'))


def shape_label(row: Dict) -> str:
    return 'x'.join(str(row[key]) for key in SHAPE_KEYS)


def figures(row: Dict) -> List[str]:
    """A row's cells after its shape and method: ms, x faster than torch, peak MiB, x torch memory, x bandwidth
    bound (the ratios of :func:`summary`)."""
    if row['status'] != 'ok':
        return [f"{row['status']}: {row['error']}", '', '', '', '']
    speedup = 1 / row['time_ratio'] if row['time_ratio'] else None
    return [f"{row['ms']:.3f}", format_optional(speedup, '.2f'), format_optional(row['peak_mib'], '.0f'),
            format_optional(row['memory_ratio'], '.2f'), format_optional(row['x_bound'], '.1f')]


def summary(results: Dict) -> str:
    """A table per mode (:func:`figures`, ratios to ``torch`` on the same shape); then the fused kernel's errors."""
    rows, tables = [dict(r) for r in results['rows']], []
    add_ratios(rows, lambda r: r['method'] == 'torch', lambda r: (shape_label(r), r['mode']),
               dict(time_ratio='ms', memory_ratio='peak_mib'))
    for mode in MODES:
        cells = [[shape_label(r), r['method'], *figures(r)] for r in rows if r['mode'] == mode]
        tables.append(f'{mode}:\n' + markdown_table(['B x H x N x D', 'method', 'ms', 'x faster than torch', 'peak MiB',
                                                     'x torch memory', 'x bandwidth bound'], cells))
    for check in results.get('checks', []):
        errors = check.get('relative_max_error')
        found = (', '.join(f'{name} {err:.1e}' for name, err in errors.items()) if errors else
                 f"{check['status']}: {check['error']}")
        tables.append(f'fused vs torch, {shape_label(check)}: {found}')
    return '\n'.join(tables)


def plot(results: Dict, path: Path):
    """Bars per shape: forward and forward + backward time and peak memory (where measured: CUDA), one bar per
    method."""
    rows = [r for r in results['rows'] if r['status'] == 'ok']
    labels = list(dict.fromkeys(shape_label(r) for r in results['rows']))
    methods = list(dict.fromkeys(r['method'] for r in results['rows']))
    quantities = measured([('forward', 'ms', 'forward (ms)'), ('forward_backward', 'ms', 'forward + backward (ms)'),
                           ('forward_backward', 'peak_mib', 'forward + backward peak memory (MiB)')],
                          rows, lambda quantity, r: r[quantity[1]] if r['mode'] == quantity[0] else None)
    fig, axes = panels(1, max(1, len(quantities)), 5.3, 4.5)
    for ax, (mode, key, title) in zip(axes[0], quantities):
        found = {(shape_label(r), r['method']): r[key] for r in rows if r['mode'] == mode}
        grouped_bars(ax, labels, {m: [found.get((label, m)) for label in labels] for m in methods})
        ax.set_yscale('symlog')
        ax.set_title(title)
    wrapped_title(fig, f"{results['device']}  {results['dtype']}  (median of {results['repeats']})", fontsize=12)
    save_figure(fig, path, dpi=120)


def main(args: argparse.Namespace) -> int:
    if args.tiny:
        args.shapes, args.dtype, args.warmup, args.repeats = [parse_shape(s) for s in TINY_SHAPES], 'float32', 0, 1
    args.device = args.device or ('cuda' if torch.cuda.is_available() and not args.tiny else 'cpu')
    from nalaformer.kernels.nala_triton import interpreting
    device = check_device(args.device)
    name, peak = device_name(device), peak_bandwidth(device)
    jobs = [(shape, method, mode) for shape in args.shapes for method in args.methods for mode in MODES]
    rows = [measure(args, method, shape, mode, peak) for shape, method, mode in tqdm(jobs, desc='benchmark')]
    results = dict(device=name, dtype=args.dtype, peak_bandwidth_gbs=peak, triton_interpreter=interpreting(),
                   warmup=args.warmup, repeats=args.repeats, rows=rows)
    if args.check:
        results['checks'] = [check_errors(args, shape) for shape in tqdm(args.shapes, desc='check')]
    written = write_report(results, args.out_dir / 'benchmark_kernels.json', plot,
                           args.out_dir / 'benchmark_kernels.png')
    print(f'{name} {args.dtype}, median of {args.repeats} after {args.warmup} warm-up runs')
    print(summary(results))
    print(written)
    return 0
