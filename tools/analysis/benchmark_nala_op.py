"""Time and peak memory of the NaLa attention op (fast vs reference), and of one attention block vs softmax.

Two measurements, each timed with the methods alternating in one loop (A B A B ...), reported as
medians with IQR and min/max and ratios to the first method of the run; peak memory is measured in a
fresh process per (method, size, mode): peak RSS (VmHWM, reset by /proc/self/clear_refs after the
inputs are built) minus the RSS then, i.e. what one call adds (glibc defaults). Load averages and the
cores other processes kept busy during each timing loop are recorded (see tools/analysis/benchmark.py).

``--what op`` (default): the ``nala`` / ``nala_cos`` computation alone on q, k, v of shape
(batch, heads, side^2, head_dim) with the RoPE table of the side x side grid:
    reference  nala.py's plain-PyTorch chain, ``linear_attention(*nala_feature_maps(q, k), v, rope)``
    fast       ``nalaformer.ops.nala_fast.nala_attention`` (the default of the ``nala`` kernel)
in two modes: forward (under inference_mode) and forward + backward (gradients of q, k, v).

``--what block``: one NaLaFormer attention block (qkvg projection, LePE, gate, out_proj; ``NaLaAttention``)
of width ``--dim`` on a (1, dim, H, W) map with H * W = ``--tokens``, forward under inference_mode:
    nala          the block with the ``nala`` kernel (fast op)
    nala_reference  the same block on nala.py's reference chain
    sdpa          the same block with the ``softmax`` kernel (``F.scaled_dot_product_attention``, fused)
    softmax       the same block with the ``softmax_explicit`` kernel (the N x N matrix stored)
A method whose working set would not fit in the available memory (the explicit N x N matrix) is
skipped and reported with the reason instead of being run.

Examples::

    python tools/analysis/benchmark_nala_op.py --threads 1 --sides 112 --batch 2 --out-json docs/nala_op_cpu.json
    python tools/analysis/benchmark_nala_op.py --what block --threads 2 --tokens 16384 32768 73728 \\
        --out-json docs/nala_block_vs_softmax_cpu.json
"""
import argparse
import gc
import importlib.util
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import torch

from nalaformer.analysis.cli import run_cli
from nalaformer.analysis.measure import (
    device_name, format_optional, peak_rss_mb, reset_peak_rss, rss_mb, summarize, timed,
)
from nalaformer.models import NaLaAttention
from nalaformer.ops import nala_fast
from nalaformer.ops.nala import (
    linear_attention, nala_cos_feature_maps, nala_feature_maps, rope_angles, rope_table,
)

_spec = importlib.util.spec_from_file_location('benchmark_tool', Path(__file__).with_name('benchmark.py'))
bench = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench)

OP_METHODS = ('reference', 'fast')
BLOCK_METHODS = ('nala', 'nala_reference', 'sdpa', 'softmax')
MODES = ('forward', 'forward_backward')


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--what', choices=('op', 'block'), default='op')
    parser.add_argument('--kind', choices=('nala', 'nala_cos'), default='nala', help='op: the kernel')
    parser.add_argument('--alpha', type=float, default=20.0, help='op: nala_cos sharpness')
    parser.add_argument('--sides', type=int, nargs='+', default=[112], help='op: token grid sides (N = side^2)')
    parser.add_argument('--batch', type=int, default=2, help='op: batch')
    parser.add_argument('--heads', type=int, default=1, help='op: heads; block: heads of the block')
    parser.add_argument('--head-dim', type=int, default=64, help='op: head dim')
    parser.add_argument('--modes', nargs='+', choices=MODES, default=list(MODES), help='op: modes')
    parser.add_argument('--tokens', type=int, nargs='+', default=[16384, 32768, 73728],
                        help='block: tokens per image (a grid as square as the number allows)')
    parser.add_argument('--dim', type=int, default=64, help='block: channels')
    parser.add_argument('--methods', nargs='+', default=None, help='subset of the methods, in this order')
    parser.add_argument('--threads', type=int, default=1)
    parser.add_argument('--warmup', type=int, default=2)
    parser.add_argument('--repeats', type=int, default=10)
    parser.add_argument('--no-memory', action='store_true')
    parser.add_argument('--memory-mmap-threshold', type=int, default=None, metavar='BYTES',
                        help='as in tools/analysis/benchmark.py (default: glibc defaults)')
    parser.add_argument('--out-json', type=Path, default=Path('benchmark_nala_op.json'))
    parser.add_argument('--memory-worker', default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    known = OP_METHODS if args.what == 'op' else BLOCK_METHODS
    args.methods = args.methods or list(known)
    unknown = [m for m in args.methods if m not in known]
    if unknown:
        raise ValueError(f'--methods {unknown} are not methods of --what {args.what}: choose from {list(known)}')
    return args


# ----------------------------------------------------------------------------------------------
# The op
# ----------------------------------------------------------------------------------------------
def op_inputs(args: argparse.Namespace, side: int):
    g = torch.Generator().manual_seed(0)
    shape = (args.batch, args.heads, side * side, args.head_dim)
    # |q| spread over tanh's range, as in a trained block
    q = torch.randn(*shape, generator=g) * torch.linspace(0.1, 3.0, side * side)[:, None] / args.head_dim ** 0.5
    k, v, dout = (torch.randn(*shape, generator=g) * s for s in (0.7, 1.0, 1.0))
    return q, k, v, dout, rope_table(rope_angles(args.head_dim), side, side)


def op_function(method: str, args: argparse.Namespace) -> Callable:
    alpha = None if args.kind == 'nala' else args.alpha
    if method == 'fast':
        return lambda q, k, v, rope: nala_fast._forward_op(q, k, v, rope, alpha)[0]

    def reference(q, k, v, rope):
        features = nala_feature_maps(q, k) if alpha is None else nala_cos_feature_maps(q, k, alpha)
        return linear_attention(*features, v, rope)
    return reference


def op_step(method: str, args: argparse.Namespace, side: int, mode: str) -> Callable[[], None]:
    q, k, v, dout, rope = op_inputs(args, side)
    fn = op_function(method, args)
    if mode == 'forward':
        def step():
            with torch.inference_mode():
                fn(q, k, v, rope)
        return step
    leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]

    def step():
        torch.autograd.grad(fn(*leaves, rope), leaves, dout)
    return step


# ----------------------------------------------------------------------------------------------
# One attention block
# ----------------------------------------------------------------------------------------------
def grid_of(tokens: int) -> Tuple[int, int]:
    """(H, W) with H * W = tokens and H as close to sqrt(tokens) as divides it."""
    h = int(tokens ** 0.5)
    while tokens % h:
        h -= 1
    return h, tokens // h


def block_model(method: str, args: argparse.Namespace) -> torch.nn.Module:
    torch.manual_seed(0)
    attn_type = {'sdpa': 'softmax', 'softmax': 'softmax_explicit'}.get(method, 'nala')
    return NaLaAttention(args.dim, args.heads, attn_type=attn_type).eval()


def block_step(method: str, args: argparse.Namespace, tokens: int, mode: str = 'forward') -> Callable[[], None]:
    block = block_model(method, args)
    x = torch.randn(1, args.dim, *grid_of(tokens), generator=torch.Generator().manual_seed(0))
    ops = bench.backend_context('reference' if method == 'nala_reference' else None)

    def step():
        with torch.inference_mode(), ops():
            block(x)
    return step


def block_skip_reason(method: str, args: argparse.Namespace, tokens: int) -> Optional[str]:
    """Why the explicit softmax cannot run here: its scores and their softmax (2 N x N x heads floats)."""
    if method != 'softmax':
        return None
    need = 2 * tokens * tokens * args.heads * 4
    available = _available_bytes()
    if available is not None and need > 0.8 * available:
        return (f'skipped: the explicit N x N softmax needs ~{need / 2 ** 30:.1f} GiB, '
                f'{available / 2 ** 30:.1f} GiB available')
    return None


def _available_bytes() -> Optional[int]:
    try:
        with open('/proc/meminfo') as f:
            return next(int(line.split()[1]) * 1024 for line in f if line.startswith('MemAvailable'))
    except (OSError, StopIteration):
        return None


# ----------------------------------------------------------------------------------------------
# Running
# ----------------------------------------------------------------------------------------------
def make(job: Dict, args: argparse.Namespace) -> Callable[[], None]:
    if args.what == 'op':
        return op_step(job['method'], args, job['size'], job['mode'])
    return block_step(job['method'], args, job['size'])


def memory_worker(payload: str) -> Dict:
    """In a fresh process: what two calls add to the RSS after the inputs are built (MiB)."""
    job = json.loads(payload)
    args = parse_args(job['argv'])
    torch.set_num_threads(args.threads)
    try:
        make({**job, 'size': 4 if args.what == 'op' else 16}, args)()  # libraries' one-off set-up, not counted
        step = make(job, args)
        gc.collect()
        built = rss_mb() if reset_peak_rss() else None
        for _ in range(2):
            step()
    except Exception as e:  # reported, not fatal
        return dict(error=f'{type(e).__name__}: {e}'[:300])
    return dict(extra_mb=None if built is None else peak_rss_mb() - built)


def measure_memory(job: Dict, argv: Sequence[str], mmap_threshold: Optional[int]) -> Dict:
    payload = json.dumps({**job, 'argv': list(argv)})
    env = bench.memory_env(mmap_threshold)
    proc = subprocess.run([sys.executable, __file__, '--memory-worker', payload], capture_output=True, text=True,
                          env=env)
    lines = proc.stdout.strip().splitlines()
    if proc.returncode or not lines:
        return dict(error=f'memory worker failed (exit {proc.returncode}): {proc.stderr.strip()[-300:]}')
    return json.loads(lines[-1])


def run(args: argparse.Namespace, argv: Sequence[str]) -> Dict:
    torch.set_num_threads(args.threads)
    malloc_tuned = bench.tune_malloc()
    sizes = args.sides if args.what == 'op' else args.tokens
    modes = args.modes if args.what == 'op' else ['forward']
    meta = dict(what=args.what, argv=list(argv), device='cpu', device_name=device_name(torch.device('cpu')),
                threads=torch.get_num_threads(), torch=torch.__version__, warmup=args.warmup, repeats=args.repeats,
                malloc_timing='mallopt M_MMAP_MAX=0, M_TRIM_THRESHOLD=-1' if malloc_tuned else 'glibc defaults',
                memory='VmHWM (reset after building the inputs) - VmRSS then, fresh process, ' +
                ('glibc defaults' if args.memory_mmap_threshold is None else
                 f'MALLOC_MMAP_THRESHOLD_={args.memory_mmap_threshold}'),
                started=time.strftime('%Y-%m-%d %H:%M:%S'), load_at_start=[round(v, 2) for v in os.getloadavg()])
    if args.what == 'op':
        meta.update(kind=args.kind, batch=args.batch, heads=args.heads, head_dim=args.head_dim)
    else:
        meta.update(dim=args.dim, heads=args.heads, grids={t: grid_of(t) for t in sizes})
    results: List[Dict] = []
    for size in sizes:
        for mode in modes:
            steps, rows = {}, {}
            for method in args.methods:
                row = dict(method=method, size=size, mode=mode)
                reason = block_skip_reason(method, args, size) if args.what == 'block' else None
                if reason is None:
                    try:
                        step = make(dict(method=method, size=size, mode=mode), args)
                        for _ in range(args.warmup):
                            step()
                        steps[method] = step
                    except Exception as e:  # reported, not fatal
                        reason = f'{type(e).__name__}: {e}'[:300]
                if reason is not None:
                    row.update(status='n/a', reason=reason, median_ms=None)
                rows[method] = row
            samples = {m: [] for m in steps}
            with bench.Contention() as contention:
                for _ in range(args.repeats):
                    for method, step in steps.items():
                        samples[method].append(timed(step, torch.device('cpu')))
            steps.clear()
            gc.collect()
            for method in args.methods:
                row = rows[method]
                if method in samples:
                    row.update(status='ok', **summarize(samples[method], 1))
                    row.pop('throughput')
                row.update(contention.as_dict())
                results.append(row)
            if contention.other_busy_cores is not None and contention.other_busy_cores > bench.CONTENTION_CORES:
                print(f'warning: other processes kept {contention.other_busy_cores:.2f} cores busy while timing '
                      f'{size} {mode}', file=sys.stderr)
    if not args.no_memory:
        for row in results:
            if row['status'] == 'ok':
                memory = measure_memory(dict(method=row['method'], size=row['size'], mode=row['mode']), argv,
                                        args.memory_mmap_threshold)
                row['extra_mb'] = memory.get('extra_mb')
                if 'error' in memory:
                    row['memory_error'] = memory['error']
    first = args.methods[0]
    for row in results:
        base = next((r for r in results if r['method'] == first and r['size'] == row['size']
                     and r['mode'] == row['mode']), None)
        for key, value in (('latency_ratio', 'median_ms'), ('memory_ratio', 'extra_mb')):
            ok = base is not None and row.get(value) is not None and base.get(value)
            row[key] = row[value] / base[value] if ok else None
    meta.update(finished=time.strftime('%Y-%m-%d %H:%M:%S'), load_at_end=[round(v, 2) for v in os.getloadavg()],
                baseline=first)
    return dict(meta=meta, results=results)


def markdown_table(report: Dict) -> str:
    fmt = format_optional
    size_name = 'N' if report['meta']['what'] == 'block' else 'side'
    lines = [f"| method | {size_name} | mode | ms, median (IQR) | min ms | x {report['meta']['baseline']} | "
             f"extra MB | x memory |", '|---|---|---|---|---|---|---|---|']
    for r in report['results']:
        if r['median_ms'] is None:
            lines.append(f"| {r['method']} | {r['size']} | {r['mode']} | {r['reason']} | | | | |")
            continue
        lines.append(f"| {r['method']} | {r['size']} | {r['mode']} | {r['median_ms']:.1f} ({r['q1_ms']:.1f}-"
                     f"{r['q3_ms']:.1f}) | {r['min_ms']:.1f} | {fmt(r['latency_ratio'], '.2f')} | "
                     f"{fmt(r.get('extra_mb'), '.0f')} | {fmt(r.get('memory_ratio'), '.2f')} |")
    return '\n'.join(lines)


def main(argv: Optional[Sequence[str]] = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parse_args(argv)
    if args.memory_worker:
        print(json.dumps(memory_worker(args.memory_worker)))
        return 0
    report = run(args, [a for a in argv])
    args.out_json.parent.mkdir(parents=True, exist_ok=True)
    args.out_json.write_text(json.dumps(report, indent=2) + '\n')
    print(markdown_table(report))
    others = [r['other_busy_cores'] for r in report['results'] if r.get('other_busy_cores') is not None]
    print(f"load {report['meta']['load_at_start']} -> {report['meta']['load_at_end']}; other processes busy: "
          f"up to {max(others) if others else float('nan'):.2f} cores; wrote {args.out_json}")
    return 0


if __name__ == '__main__':
    sys.exit(run_cli(main))
