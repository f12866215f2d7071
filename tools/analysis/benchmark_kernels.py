"""Time and memory of the fused Triton NaLa kernel vs the PyTorch reference vs softmax SDPA.

For each square token grid (N = side^2) it measures, on the same q, k, v of shape
(batch, heads, N, head_dim):
    nala_triton  the fused kernel (``nalaformer.kernels.nala_triton``), RoPE included
    nala         the PyTorch reference kernel (``nala_feature_maps`` + ``linear_attention``)
    sdpa         ``torch.nn.functional.scaled_dot_product_attention(q, k, v)`` (no RoPE)
in two modes, forward and forward + backward (gradients of q, k, v), as the median of
``--repeats`` timed runs after ``--warmup`` untimed ones. Writes ``benchmark_kernels.json``
and a log-log ``benchmark_kernels.png`` to ``--out-dir``.

Peak memory: on CUDA, ``torch.cuda.max_memory_allocated`` during one extra call minus what was
allocated before it (the inputs). On CPU memory is not measured and reported as null ('n/a').
Achieved bandwidth: (bytes of q, k, v read + out written; for forward + backward also dout read
and dq, dk, dv written) / median time, and its fraction of the device's peak where known.

The bandwidth bound is those bytes over the peak: ``x_bound`` = time / bound (1.0 would be
running at the device's peak DRAM bandwidth).

The fused kernel runs with the tuning given by ``--block-n --num-warps --num-stages --dot
--programs`` (defaults: ``nalaformer.kernels.tuning.Tuning``). Two diagnostics on top:
    --breakdown  times each of the four launchers (kernels + their small reductions) alone
    --sweep      forward and forward + backward time of the fused kernel for every combination
                 of --sweep-block-n x --sweep-warps x --sweep-dot x --sweep-programs (a compile
                 failure is recorded)
Results are printed as tables (ratios to the PyTorch reference of the same run) and saved.

On CPU the Triton kernels run in the interpreter (``TRITON_INTERPRET=1`` is set here): only
useful as a smoke test, with ``--tiny``. Examples:

    python tools/analysis/benchmark_kernels.py --device cuda --dtype bfloat16 --out-dir runs/bench
    python tools/analysis/benchmark_kernels.py --device cuda --dtype bfloat16 --sides 56 256 --sweep --breakdown
    python tools/analysis/benchmark_kernels.py --tiny --out-dir /tmp/bench
"""
import argparse
import dataclasses
import itertools
import json
import os
import statistics
import time
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence

import torch
import torch.nn.functional as F

METHODS = ('nala_triton', 'nala', 'sdpa')
MODES = ('forward', 'forward_backward')
DTYPES = {'float32': torch.float32, 'float16': torch.float16, 'bfloat16': torch.bfloat16}
DEFAULT_SIDES = (56, 80, 112, 160, 224, 256, 288)  # N = 3,136 ... 82,944 tokens
TINY_SIDES = (3, 5)
# Peak DRAM bandwidth in GB/s by device-name substring (vendor datasheets), first match wins.
PEAK_BANDWIDTH_GBPS = (
    ('H200', 4800.0), ('H100 PCIe', 2000.0), ('H100', 3350.0), ('A100-SXM4-80GB', 2039.0),
    ('A100 80GB PCIe', 1935.0), ('A100', 1555.0), ('L40S', 864.0), ('A10G', 600.0), ('L4', 300.0),
    ('RTX 4090', 1008.0), ('RTX 3090', 936.0), ('V100', 900.0), ('T4', 320.0),
)


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--device', default=None, help='default: cuda if available (cpu with --tiny)')
    parser.add_argument('--dtype', default='float32', choices=sorted(DTYPES))
    parser.add_argument('--batch', type=int, default=1)
    parser.add_argument('--heads', type=int, default=2)
    parser.add_argument('--head-dim', type=int, default=64)
    parser.add_argument('--sides', type=int, nargs='+', default=list(DEFAULT_SIDES),
                        help='square token grids to run, N = side^2 tokens')
    parser.add_argument('--methods', nargs='+', default=list(METHODS), choices=METHODS)
    parser.add_argument('--warmup', type=int, default=3)
    parser.add_argument('--repeats', type=int, default=10)
    parser.add_argument('--out-dir', type=Path, default=Path('benchmark_kernels'))
    parser.add_argument('--check', action='store_true',
                        help='also record the fused kernel errors (out, dq, dk, dv) vs the reference at each size')
    parser.add_argument('--tiny', action='store_true',
                        help='smoke run: sides 3 and 5, head dim 32, one repeat (on CPU unless --device is given)')
    tuning = parser.add_argument_group('tuning of the fused kernel (default: nalaformer.kernels.tuning.Tuning)')
    tuning.add_argument('--block-n', type=int, help='tokens per tile')
    tuning.add_argument('--num-warps', type=int)
    tuning.add_argument('--num-stages', type=int)
    tuning.add_argument('--dot', help="operands of the tile products: 'auto' (as PyTorch's matmul would for "
                        "--dtype), 'ieee', 'tf32x3', 'tf32' or 'bf16'")
    tuning.add_argument('--programs', type=int, help='programs per kernel launch (default: two per SM)')
    parser.add_argument('--breakdown', action='store_true', help='also time each fused launcher alone')
    parser.add_argument('--sweep', action='store_true', help='also time the fused kernel over a tuning grid')
    parser.add_argument('--sweep-block-n', type=int, nargs='+', default=[16, 32])
    parser.add_argument('--sweep-warps', type=int, nargs='+', default=[4, 8])
    parser.add_argument('--sweep-dot', nargs='+', help='default: every dot mode')
    parser.add_argument('--sweep-programs', type=int, nargs='+', help="default: the tuning's (two per SM)")
    args = parser.parse_args(argv)
    if args.tiny:
        args.sides, args.head_dim, args.warmup, args.repeats = list(TINY_SIDES), 32, 0, 1
    if args.device is None:
        args.device = 'cuda' if torch.cuda.is_available() and not args.tiny else 'cpu'
    return args


def peak_bandwidth(device: torch.device) -> Dict[str, object]:
    """Device name and its peak DRAM bandwidth in GB/s ('unknown' when not in the table)."""
    if device.type != 'cuda':
        return {'name': 'cpu', 'peak_gbps': 'unknown'}
    name = torch.cuda.get_device_name(device)
    peak = next((gbps for key, gbps in PEAK_BANDWIDTH_GBPS if key in name), 'unknown')
    return {'name': name, 'peak_gbps': peak}


def make_inputs(args: argparse.Namespace, side: int):
    """q, k, v (batch, heads, side^2, head_dim) in --dtype, needing grad, and the (2, N, d) RoPE table."""
    from nalaformer.ops import rope_angles, rope_table
    device, dtype = torch.device(args.device), DTYPES[args.dtype]
    shape = (args.batch, args.heads, side * side, args.head_dim)
    q, k, v = (torch.randn(shape, device=device).to(dtype).requires_grad_() for _ in range(3))
    return q, k, v, rope_table(rope_angles(args.head_dim, device=device), side, side)


def build_method(name: str, side: int) -> Callable:
    """(q, k, v, rope) -> out for a method name, on a side x side token grid (given to the kernels as in the models)."""
    if name == 'sdpa':
        return lambda q, k, v, rope: F.scaled_dot_product_attention(q, k, v)
    from nalaformer.ops import build_attention_kernel
    kernel = build_attention_kernel(name)
    return lambda q, k, v, rope: kernel(q, k, v, rope, grid=(side, side))


def io_bytes(q: torch.Tensor, out: torch.Tensor, mode: str) -> int:
    """Bytes that must cross DRAM at least once: q, k, v in and out out (plus dout in, dq, dk, dv out)."""
    inputs = 3 * q.numel() * q.element_size()
    output = out.numel() * out.element_size()
    if mode == 'forward':
        return inputs + output
    return 2 * inputs + 2 * output


def _sync(device: torch.device):
    if device.type == 'cuda':
        torch.cuda.synchronize(device)


def _call(fn: Callable, inputs, mode: str, grad: Optional[torch.Tensor]):
    out = fn(*inputs)
    if mode == 'forward_backward':
        torch.autograd.grad(out, inputs[:3], grad)
    return out


def wall_times_ms(fn: Callable[[], object], device: torch.device, warmup: int, repeats: int) -> List[float]:
    """Wall times in ms of ``repeats`` calls of ``fn()`` after ``warmup`` untimed ones (device synchronised)."""
    times = []
    for i in range(warmup + repeats):
        _sync(device)
        start = time.perf_counter()
        fn()
        _sync(device)
        if i >= warmup:
            times.append(1e3 * (time.perf_counter() - start))
    return times


def time_ms(fn: Callable, inputs, mode: str, grad, warmup: int, repeats: int) -> List[float]:
    """Wall times in ms of one method in one mode (see :func:`wall_times_ms`)."""
    with torch.no_grad() if mode == 'forward' else torch.enable_grad():
        return wall_times_ms(lambda: _call(fn, inputs, mode, grad), inputs[0].device, warmup, repeats)


def peak_memory_mb(fn: Callable, inputs, mode: str, grad) -> Optional[float]:
    """Peak CUDA memory of one call beyond what was allocated before it, in MiB; None on CPU."""
    device = inputs[0].device
    if device.type != 'cuda':
        return None
    _sync(device)
    torch.cuda.reset_peak_memory_stats(device)
    before = torch.cuda.memory_allocated(device)
    with torch.no_grad() if mode == 'forward' else torch.enable_grad():
        _call(fn, inputs, mode, grad)
    _sync(device)
    return (torch.cuda.max_memory_allocated(device) - before) / 2 ** 20


def measure(args: argparse.Namespace, method: str, side: int, mode: str, peak_gbps) -> Dict[str, object]:
    """One result row; out of memory (and, for the fused kernel, a failed compile) is recorded in 'status'."""
    from nalaformer.kernels.nala_triton import triton_supported
    row = {'method': method, 'mode': mode, 'side': side, 'n': side * side}
    try:
        inputs = make_inputs(args, side)
        fn = build_method(method, side)
        out = fn(*inputs)
        grad = torch.randn_like(out)
        times = time_ms(fn, inputs, mode, grad, args.warmup, args.repeats)
        median = statistics.median(times)
        io = io_bytes(inputs[0], out, mode)
        gbps = io / (median * 1e-3) / 1e9
        known = isinstance(peak_gbps, float)
        row.update(
            status='ok', time_ms=median, times_ms=times, peak_mem_mb=peak_memory_mb(fn, inputs, mode, grad),
            io_bytes=io, bandwidth_gbps=gbps, bandwidth_fraction=gbps / peak_gbps if known else 'unknown',
            bound_ms=io / (peak_gbps * 1e9) * 1e3 if known else 'unknown',
            x_bound=peak_gbps / gbps if known else 'unknown',
            fused=method == 'nala_triton' and triton_supported(*inputs))
    except torch.cuda.OutOfMemoryError:
        row['status'] = 'out of memory'
    except Exception as err:  # noqa: BLE001 - a tuning the compiler rejects is a result of a sweep
        if method != 'nala_triton' or not type(err).__module__.startswith('triton'):
            raise
        row['status'] = f'{type(err).__name__}: {str(err)[:300]}'
    finally:
        if args.device.startswith('cuda'):
            torch.cuda.empty_cache()
    return row


def kernel_breakdown(args: argparse.Namespace, side: int) -> Dict[str, object]:
    """Median ms of each fused launcher (its kernel and the small PyTorch sum after it) on one size."""
    from nalaformer.kernels import nala_jit
    from nalaformer.kernels.tuning import current_tuning
    tune = current_tuning()
    q, k, v, rope = (x.detach() for x in make_inputs(args, side))
    rope = rope.float().contiguous()
    state, mean = nala_jit.forward_state(k, v, rope, side, None, tune)
    dout = torch.randn_like(nala_jit.forward_output(q, rope, side, state, mean, None, tune))
    dq, dmean, dstate = nala_jit.backward_query(q, dout, rope, side, state, mean, None, tune)
    launchers = {
        'forward_state': lambda: nala_jit.forward_state(k, v, rope, side, None, tune),
        'forward_output': lambda: nala_jit.forward_output(q, rope, side, state, mean, None, tune),
        'backward_query': lambda: nala_jit.backward_query(q, dout, rope, side, state, mean, None, tune),
        'backward_key': lambda: nala_jit.backward_key(k, v, rope, side, dstate, dmean, None, tune),
    }
    times = {name: statistics.median(wall_times_ms(fn, q.device, args.warmup, args.repeats))
             for name, fn in launchers.items()}
    return {'side': side, 'n': side * side, 'time_ms': times}


def tuning_sweep(args: argparse.Namespace, side: int, peak_gbps) -> List[Dict[str, object]]:
    """Fused-kernel rows for every tuning of the sweep grid, each row tagged with its tuning."""
    from nalaformer.kernels.tuning import DOT_MODES, current_tuning, use_tuning
    rows = []
    grid = itertools.product(args.sweep_block_n, args.sweep_warps, args.sweep_dot or DOT_MODES,
                             args.sweep_programs or [current_tuning().programs])
    for block_n, warps, dot, programs in grid:
        with use_tuning(block_n=block_n, num_warps=warps, dot=dot, programs=programs) as tune:
            for mode in MODES:
                row = measure(args, 'nala_triton', side, mode, peak_gbps)
                row['tuning'] = dataclasses.asdict(tune)
                rows.append(row)
    return rows


def summary(results: Dict[str, object]) -> str:
    """Plain-text tables of the results: time, speed-up over the reference, memory ratio, x bound."""
    lines = []
    for mode in MODES:
        lines.append(f'{mode}: ms (speed-up over nala) | peak MiB (ratio to nala) | x bandwidth bound')
        for n in sorted({r['n'] for r in results['rows']}):
            rows = {r['method']: r for r in results['rows'] if r['n'] == n and r['mode'] == mode}
            base = rows.get('nala', {})
            cells = []
            for method, row in rows.items():
                if row['status'] != 'ok':
                    cells.append(f"{method} {row['status']}")
                    continue
                cell = f"{method} {row['time_ms']:.3f}"
                if base.get('status') == 'ok':
                    cell += f" ({base['time_ms'] / row['time_ms']:.2f}x)"
                if row['peak_mem_mb'] is not None:
                    cell += f" | {row['peak_mem_mb']:.0f}"
                    if base.get('peak_mem_mb'):
                        cell += f" ({row['peak_mem_mb'] / base['peak_mem_mb']:.2f})"
                if isinstance(row['x_bound'], float):
                    cell += f" | {row['x_bound']:.1f}x"
                cells.append(cell)
            lines.append(f'  N={n:>7}: ' + '; '.join(cells))
    for entry in results.get('breakdown', []):
        total = sum(entry['time_ms'].values())
        parts = ', '.join(f'{name} {ms:.3f} ({ms / total:.0%})' for name, ms in entry['time_ms'].items())
        lines.append(f"breakdown N={entry['n']}: {parts}")
    sweep = [r for r in results.get('sweep', []) if r['status'] == 'ok' and r['mode'] == 'forward_backward']
    for n in sorted({r['n'] for r in sweep}):
        best = sorted((r for r in sweep if r['n'] == n), key=lambda r: r['time_ms'])[:5]
        lines.append(f'sweep N={n}, fastest forward + backward: ' + '; '.join(
            f"{r['time_ms']:.3f} ms (block_n {r['tuning']['block_n']}, warps {r['tuning']['num_warps']}, "
            f"{r['tuning']['dot']}, programs {r['tuning']['programs'] or 'default'})" for r in best))
    return '\n'.join(lines)


def check_errors(args: argparse.Namespace, side: int) -> Dict[str, object]:
    """Max |fused - reference| / max |reference| of out, dq, dk, dv on the same inputs and dout."""
    inputs = make_inputs(args, side)
    outs = [build_method(name, side)(*inputs) for name in ('nala_triton', 'nala')]
    dout = torch.randn_like(outs[1])
    fused, ref = ([out] + list(torch.autograd.grad(out, inputs[:3], dout)) for out in outs)
    errors = {name: ((a.float() - b.float()).abs().max() / b.float().abs().max()).item()
              for name, a, b in zip(('out', 'dq', 'dk', 'dv'), fused, ref)}
    return {'side': side, 'n': side * side, 'relative_max_error': errors}


def plot(results: Dict[str, object], path: Path):
    """Log-log time (forward, forward + backward) and peak memory against N, one line per method."""
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, 3, figsize=(16, 4.5))
    panels = [('forward', 'time_ms', 'forward time (ms)'), ('forward_backward', 'time_ms', 'forward + backward (ms)'),
              ('forward_backward', 'peak_mem_mb', 'forward + backward peak memory (MiB)')]
    for ax, (mode, key, title) in zip(axes, panels):
        for method in results['config']['methods']:
            rows = [r for r in results['rows'] if r['method'] == method and r['mode'] == mode
                    and r.get(key) is not None and r['status'] == 'ok']
            if rows:
                ax.loglog([r['n'] for r in rows], [r[key] for r in rows], marker='o', label=method)
        if not ax.lines:
            ax.text(0.5, 0.5, 'n/a on this device', ha='center', va='center', transform=ax.transAxes)
        ax.set_xlabel('tokens N')
        ax.set_title(title)
        ax.grid(True, which='both', alpha=0.3)
        if ax.lines:
            ax.legend()
    cfg = results['config']
    fig.suptitle(f"{results['device']['name']}  {cfg['dtype']}  batch {cfg['batch']}  heads {cfg['heads']}  "
                 f"head dim {cfg['head_dim']}  (median of {cfg['repeats']})")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: Optional[Sequence[str]] = None) -> Dict[str, object]:
    args = parse_args(argv)
    if args.device == 'cpu':
        os.environ.setdefault('TRITON_INTERPRET', '1')  # read when the kernels are first imported
    from tqdm import tqdm

    from nalaformer.kernels.nala_triton import interpreting  # importing nalaformer registers the kernels
    from nalaformer.kernels.tuning import resolve_dot, use_tuning
    device_info = peak_bandwidth(torch.device(args.device))
    peak = device_info['peak_gbps']
    changes = {name: getattr(args, name) for name in ('block_n', 'num_warps', 'num_stages', 'dot', 'programs')
               if getattr(args, name) is not None}
    with use_tuning(**changes) as tune:
        config = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}
        config['tuning'] = dataclasses.asdict(tune)
        on_gpu = args.device.startswith('cuda') and not interpreting()
        config['dot_resolved'] = resolve_dot(
            tune.dot, DTYPES[args.dtype], torch.cuda.get_device_capability(args.device) if on_gpu else None)
        jobs = [(side, method, mode) for side in args.sides for method in args.methods for mode in MODES]
        rows = [measure(args, method, side, mode, peak)
                for side, method, mode in tqdm(jobs, desc='benchmark', unit='run')]
        results = {'config': config, 'device': device_info, 'triton_interpreter': interpreting(),
                   'peak_memory': 'torch.cuda.max_memory_allocated minus allocated before the call'
                   if args.device.startswith('cuda') else 'n/a (not measured on CPU)', 'rows': rows}
        if args.check:
            results['checks'] = [check_errors(args, side) for side in tqdm(args.sides, desc='check', unit='size')]
        if args.breakdown:
            results['breakdown'] = [kernel_breakdown(args, side) for side in tqdm(args.sides, desc='breakdown')]
    if args.sweep:
        results['sweep'] = [row for side in tqdm(args.sides, desc='sweep', unit='size')
                            for row in tuning_sweep(args, side, peak)]
    args.out_dir.mkdir(parents=True, exist_ok=True)
    (args.out_dir / 'benchmark_kernels.json').write_text(json.dumps(results, indent=2))
    plot(results, args.out_dir / 'benchmark_kernels.png')
    print(f"{device_info['name']} {args.dtype} batch {args.batch} heads {args.heads} head dim {args.head_dim}, "
          f"tuning {config['tuning']} (products: {config['dot_resolved']!r}), median of {args.repeats}")
    print(summary(results))
    return results


if __name__ == '__main__':
    main()
