"""Time and memory of the NaLa attention implementations vs softmax SDPA, forward and forward + backward.

For each shape (batch, heads, tokens, head dim) it measures, on the same q, k, v:
    fused      the ``nala`` kernel on the fused Triton backend (``nalaformer.kernels``)
    torch      the ``nala`` kernel on the PyTorch operator (``nalaformer.ops.nala_fast``, the default)
    reference  the ``nala`` kernel on nala.py's plain-PyTorch chain
    sdpa       ``torch.nn.functional.scaled_dot_product_attention(q, k, v)`` (no RoPE)
as the median of ``--repeats`` timed runs after ``--warmup`` untimed ones (CUDA events on a GPU).
The tokens of a shape form the most nearly square grid H x W = N for the RoPE table.

Peak memory: on CUDA, ``torch.cuda.max_memory_allocated`` during one extra call minus what was
allocated before it (the inputs); on CPU not measured (null). Achieved bandwidth: the bytes that
must move (q, k, v read, out written; for forward + backward also dout read and dq, dk, dv
written) over the median time; ``x_bound`` = time / (those bytes at the device's peak DRAM
bandwidth), 1.0 being the bound. ``--check`` records the fused kernel's largest errors against the
PyTorch operator (relative to each tensor's largest magnitude). Writes ``benchmark_kernels.json``
and ``benchmark_kernels.png`` to ``--out-dir`` and prints a table with ratios to ``torch``. A run that
fails stops the benchmark with its error (with ``--keep-going`` its row records it, status 'error'); one that
runs out of GPU memory is recorded (status 'out of memory').

On CPU the Triton kernels run in the interpreter (``TRITON_INTERPRET=1`` is set here): only a
smoke test, with ``--tiny``. Examples:

    python3 tools/analysis/benchmark_kernels.py --device cuda --dtype bfloat16 --check \\
        --shapes 64x1x3136x64 8x1x16384x64 2x1x65536x64 --out-dir runs/bench
    python3 tools/analysis/benchmark_kernels.py --tiny --out-dir /tmp/bench
"""
import argparse
import os
import statistics
import sys
from pathlib import Path
from typing import Callable, Dict, Optional, Sequence, Tuple

import torch
import torch.nn.functional as F

from nalaformer.analysis.grids import token_grid
from nalaformer.analysis.machine import device_name, peak_bandwidth
from nalaformer.analysis.memory import call_peak_mb, free_memory
from nalaformer.analysis.results import Failure, add_keep_going_arg, attempt, save_figure, write_json
from nalaformer.analysis.timing import time_repeats
from nalaformer.errors import run_tool

METHODS = ('fused', 'torch', 'reference', 'sdpa')
MODES = ('forward', 'forward_backward')
DTYPES = {'float32': torch.float32, 'float16': torch.float16, 'bfloat16': torch.bfloat16}
# Stage 1 of NaLaFormer-T at 224 (batch 64: one head of 64), then 16K and 65K tokens with the same head.
DEFAULT_SHAPES = ('64x1x3136x64', '8x1x16384x64', '2x1x65536x64')
TINY_SHAPES = ('1x2x9x32', '2x1x25x32')
Shape = Tuple[int, int, int, int]


def parse_shape(text: str) -> Shape:
    """'BxHxNxD' -> (batch, heads, tokens, head dim)."""
    try:
        shape = tuple(int(part) for part in text.lower().split('x'))
    except ValueError:
        shape = ()
    if len(shape) != 4 or min(shape) < 1:
        raise argparse.ArgumentTypeError(f'shape {text!r} must be BATCHxHEADSxTOKENSxHEAD_DIM, e.g. 64x1x3136x64')
    return shape


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--device', default=None, help='default: cuda if available (cpu with --tiny)')
    parser.add_argument('--dtype', default='bfloat16', choices=sorted(DTYPES), help='dtype of q, k, v')
    parser.add_argument('--shapes', type=parse_shape, nargs='+', default=[parse_shape(s) for s in DEFAULT_SHAPES],
                        metavar='BxHxNxD')
    parser.add_argument('--methods', nargs='+', default=list(METHODS), choices=METHODS)
    parser.add_argument('--warmup', type=int, default=3)
    parser.add_argument('--repeats', type=int, default=10)
    parser.add_argument('--out-dir', type=Path, default=Path('benchmark_kernels'))
    parser.add_argument('--check', action='store_true',
                        help="also record the fused kernel's errors (out, dq, dk, dv) against the PyTorch operator")
    parser.add_argument('--tiny', action='store_true', help='smoke run: two tiny shapes, float32, one repeat (CPU)')
    add_keep_going_arg(parser)
    args = parser.parse_args(argv)
    if args.tiny:
        args.shapes, args.dtype, args.warmup, args.repeats = [parse_shape(s) for s in TINY_SHAPES], 'float32', 0, 1
    if args.device is None:
        args.device = 'cuda' if torch.cuda.is_available() and not args.tiny else 'cpu'
    return args


def make_inputs(shape: Shape, dtype: torch.dtype, device: torch.device, seed: int = 0):
    """q, k, v (B, H, N, d) in ``dtype`` needing grad, and the (2, N, d) RoPE table of N's token grid."""
    from nalaformer.ops import rope_angles, rope_table
    torch.manual_seed(seed)
    q, k, v = (torch.randn(shape, device=device).to(dtype).requires_grad_() for _ in range(3))
    return q, k, v, rope_table(rope_angles(shape[-1], device=device), *token_grid(shape[2]))


def build_method(name: str) -> Callable:
    """(q, k, v, rope) -> out for a method name."""
    if name == 'sdpa':
        return lambda q, k, v, rope: F.scaled_dot_product_attention(q, k, v)
    from nalaformer.ops import build_attention_kernel, use_nala_backend
    kernel = build_attention_kernel('nala')

    def run(q, k, v, rope):
        with use_nala_backend(name):
            return kernel(q, k, v, rope)
    return run


def io_bytes(q: torch.Tensor, out: torch.Tensor, mode: str) -> int:
    """Bytes that must cross DRAM at least once: q, k, v in and out out (plus dout in, dq, dk, dv out)."""
    inputs = 3 * q.numel() * q.element_size()
    output = out.numel() * out.element_size()
    return inputs + output if mode == 'forward' else 2 * (inputs + output)


def _call(fn: Callable, inputs, mode: str, grad: Optional[torch.Tensor]):
    with torch.no_grad() if mode == 'forward' else torch.enable_grad():
        out = fn(*inputs)
        if mode == 'forward_backward':
            torch.autograd.grad(out, inputs[:3], grad)
    return out


def measure(args: argparse.Namespace, method: str, shape: Shape, mode: str, peak: Optional[float]) -> Dict:
    """One result row: the median time and its figures; or, running out of memory (or failing with
    ``--keep-going``), the status and error."""
    batch, heads, tokens, head_dim = shape
    row = dict(batch=batch, heads=heads, tokens=tokens, head_dim=head_dim, method=method, mode=mode)
    device = torch.device(args.device)

    def timed_row() -> Dict:
        inputs = make_inputs(shape, DTYPES[args.dtype], device)
        fn = build_method(method)
        out = _call(fn, inputs, 'forward', None)
        grad = torch.randn_like(out)
        times = time_repeats(lambda: _call(fn, inputs, mode, grad), device, args.warmup, args.repeats)
        median = statistics.median(times)
        moved = io_bytes(inputs[0], out, mode)
        gbs = moved / (median * 1e-3) / 1e9
        return dict(status='ok', ms=median, times_ms=times,
                    peak_mib=call_peak_mb(lambda: _call(fn, inputs, mode, grad), device), io_bytes=moved,
                    bandwidth_gbs=gbs, x_bound=peak / gbs if peak else None)

    result = attempt(timed_row, args.keep_going, f'{method} {mode} at {shape_label(row)}')
    row.update(result.as_row() if isinstance(result, Failure) else result)
    free_memory(device)
    return row


def check_errors(args: argparse.Namespace, shape: Shape) -> Dict:
    """Max |fused - torch| / max |torch| of out, dq, dk, dv on the same inputs and dout."""
    inputs = make_inputs(shape, DTYPES[args.dtype], torch.device(args.device))
    outs = [build_method(name)(*inputs) for name in ('fused', 'torch')]
    dout = torch.randn_like(outs[1])
    fused, ref = ([out, *torch.autograd.grad(out, inputs[:3], dout)] for out in outs)
    errors = {name: ((a.float() - b.float()).abs().max() / b.float().abs().max()).item()
              for name, a, b in zip(('out', 'dq', 'dk', 'dv'), fused, ref)}
    return dict(zip(('batch', 'heads', 'tokens', 'head_dim'), shape), relative_max_error=errors)


def checked(args: argparse.Namespace, shape: Shape) -> Dict:
    """:func:`check_errors`, or its failure (running out of memory, or failing with ``--keep-going``)."""
    result = attempt(lambda: check_errors(args, shape), args.keep_going, f'check at {"x".join(map(str, shape))}')
    if isinstance(result, Failure):
        return dict(zip(('batch', 'heads', 'tokens', 'head_dim'), shape), **result.as_row())
    return result


def shape_label(row: Dict) -> str:
    return f"{row['batch']}x{row['heads']}x{row['tokens']}x{row['head_dim']}"


def summary(results: Dict) -> str:
    """Plain-text tables: ms (speed-up over torch) | peak MiB (ratio to torch) | x bandwidth bound."""
    lines = []
    for mode in MODES:
        lines.append(f'{mode}: ms (speed-up over torch) | peak MiB (ratio to torch) | x bandwidth bound')
        for label in dict.fromkeys(shape_label(r) for r in results['rows']):
            rows = {r['method']: r for r in results['rows'] if shape_label(r) == label and r['mode'] == mode}
            base = rows.get('torch', {})
            cells = []
            for method, row in rows.items():
                if row['status'] != 'ok':
                    cells.append(f"{method} {row['status']}: {row['error']}")
                    continue
                cell = f"{method} {row['ms']:.3f}"
                if base.get('status') == 'ok':
                    cell += f" ({base['ms'] / row['ms']:.2f}x)"
                if row['peak_mib'] is not None:
                    cell += f" | {row['peak_mib']:.0f}"
                    if base.get('peak_mib'):
                        cell += f" ({row['peak_mib'] / base['peak_mib']:.2f})"
                if row['x_bound'] is not None:
                    cell += f" | {row['x_bound']:.1f}x"
                cells.append(cell)
            lines.append(f'  {label:>16}: ' + '; '.join(cells))
    for check in results.get('checks', []):
        if 'relative_max_error' not in check:
            lines.append(f"fused vs torch, {shape_label(check)}: {check['status']}: {check['error']}")
            continue
        errors = ', '.join(f'{name} {err:.1e}' for name, err in check['relative_max_error'].items())
        lines.append(f'fused vs torch, {shape_label(check)}: {errors}')
    return '\n'.join(lines)


def plot(results: Dict, path: Path):
    """Bars per shape: forward and forward + backward time and peak memory, one bar per method."""
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    labels = list(dict.fromkeys(shape_label(r) for r in results['rows']))
    methods = list(dict.fromkeys(r['method'] for r in results['rows']))
    panels = [('forward', 'ms', 'forward (ms)'), ('forward_backward', 'ms', 'forward + backward (ms)'),
              ('forward_backward', 'peak_mib', 'forward + backward peak memory (MiB)')]
    fig, axes = plt.subplots(1, 3, figsize=(16, 4.5))
    width = 0.8 / max(1, len(methods))
    for ax, (mode, key, title) in zip(axes, panels):
        for i, method in enumerate(methods):
            values = []
            for label in labels:
                row = next((r for r in results['rows'] if shape_label(r) == label and r['method'] == method
                            and r['mode'] == mode), None)
                values.append(row[key] if row and row['status'] == 'ok' and row.get(key) is not None else 0.0)
            ax.bar([x + i * width for x in range(len(labels))], values, width, label=method)
        ax.set_xticks([x + 0.4 - width / 2 for x in range(len(labels))], labels, fontsize=8)
        ax.set_yscale('symlog')
        ax.set_title(title)
        ax.legend(fontsize=8)
    fig.suptitle(f"{results['device']}  {results['dtype']}  (median of {results['repeats']})")
    save_figure(fig, path, dpi=120)


def main(argv: Optional[Sequence[str]] = None) -> Dict:
    args = parse_args(argv)
    if args.device == 'cpu':
        os.environ.setdefault('TRITON_INTERPRET', '1')  # read when the kernels are first imported
    from tqdm import tqdm

    from nalaformer.kernels.nala_triton import interpreting  # importing nalaformer registers the kernels
    device = torch.device(args.device)
    name, peak = device_name(device), peak_bandwidth(device)
    jobs = [(shape, method, mode) for shape in args.shapes for method in args.methods for mode in MODES]
    rows = [measure(args, method, shape, mode, peak)
            for shape, method, mode in tqdm(jobs, desc='benchmark', unit='run')]
    results = dict(device=name, dtype=args.dtype, peak_bandwidth_gbs=peak, triton_interpreter=interpreting(),
                   warmup=args.warmup, repeats=args.repeats, rows=rows)
    if args.check:
        results['checks'] = [checked(args, shape) for shape in tqdm(args.shapes, desc='check', unit='shape')]
    write_json(args.out_dir / 'benchmark_kernels.json', results)
    plot(results, args.out_dir / 'benchmark_kernels.png')
    print(f'{name} {args.dtype}, median of {args.repeats} after {args.warmup} warm-up runs')
    print(summary(results))
    return results


if __name__ == '__main__':
    sys.exit(run_tool(main))
