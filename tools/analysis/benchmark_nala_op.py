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
skipped (status 'skipped', with the reason) instead of being run.

A method that fails stops the benchmark with its error; with ``--keep-going`` its row records the error (status
'error') and the others go on.

Examples::

    python3 tools/analysis/benchmark_nala_op.py --threads 1 --sides 112 --batch 2 --out-json docs/nala_op_cpu.json
    python3 tools/analysis/benchmark_nala_op.py --what block --threads 2 --tokens 16384 32768 73728 \\
        --out-json docs/nala_block_vs_softmax_cpu.json
"""
import argparse
import sys
import time
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence

import torch

from nalaformer.analysis.grids import token_grid
from nalaformer.analysis.machine import device_name, load_average
from nalaformer.analysis.memory import (
    add_memory_worker_arg, answer_memory_worker, available_memory_mb, malloc_setting, memory_env, run_memory_worker,
    tune_malloc, worker_memory,
)
from nalaformer.analysis.results import (
    Failure, add_keep_going_arg, add_ratios, attempt, format_optional, outputs_line, write_json,
)
from nalaformer.analysis.steps import ModelStep, backend_context
from nalaformer.analysis.timing import summarize, time_steps
from nalaformer.errors import ConfigError, run_tool
from nalaformer.models import NaLaAttention
from nalaformer.ops import linear_attention, nala_cos_feature_maps, nala_feature_maps, rope_angles, rope_table
from nalaformer.ops.nala_fast import nala_attention, nala_cos_attention

OP_METHODS = ('reference', 'fast')
BLOCK_METHODS = ('nala', 'nala_reference', 'sdpa', 'softmax')
MODES = ('forward', 'forward_backward')
CPU = torch.device('cpu')


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
    add_keep_going_arg(parser)
    parser.add_argument('--out-json', type=Path, default=Path('benchmark_nala_op.json'))
    add_memory_worker_arg(parser)
    args = parser.parse_args(argv)
    known = OP_METHODS if args.what == 'op' else BLOCK_METHODS
    args.methods = args.methods or list(known)
    unknown = [m for m in args.methods if m not in known]
    if unknown:
        raise ConfigError(f'--methods {unknown} are not methods of --what {args.what}: choose from {list(known)}')
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
    if method == 'fast':
        if args.kind == 'nala':
            return nala_attention
        return lambda q, k, v, rope: nala_cos_attention(q, k, v, rope, args.alpha)

    def reference(q, k, v, rope):
        features = nala_feature_maps(q, k) if args.kind == 'nala' else nala_cos_feature_maps(q, k, args.alpha)
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
def block_step(method: str, args: argparse.Namespace, tokens: int) -> ModelStep:
    """The block of ``method`` on a (1, dim, H, W) map of ``tokens`` tokens, forward under inference_mode."""
    torch.manual_seed(0)
    attn_type = {'sdpa': 'softmax', 'softmax': 'softmax_explicit'}.get(method, 'nala')
    block = NaLaAttention(args.dim, args.heads, attn_type=attn_type)
    x = torch.randn(1, args.dim, *token_grid(tokens), generator=torch.Generator().manual_seed(0))
    return ModelStep(block, x, 'infer', CPU, context=backend_context('reference' if method == 'nala_reference'
                                                                        else None))


def block_skip_reason(method: str, args: argparse.Namespace, tokens: int) -> Optional[str]:
    """Why the explicit softmax cannot run here: its scores and their softmax (2 N x N x heads floats)."""
    if method != 'softmax':
        return None
    need = 2 * tokens * tokens * args.heads * 4 / 2 ** 20
    available = available_memory_mb()
    if available is not None and need > 0.8 * available:
        return (f'skipped: the explicit N x N softmax needs ~{need / 1024:.1f} GiB, '
                f'{available / 1024:.1f} GiB available')
    return None


# ----------------------------------------------------------------------------------------------
# Running
# ----------------------------------------------------------------------------------------------
def make(job: Dict, args: argparse.Namespace) -> Callable[[], None]:
    if args.what == 'op':
        return op_step(job['method'], args, job['size'], job['mode'])
    return block_step(job['method'], args, job['size'])


def memory_worker(job: Dict) -> Dict:
    """In a fresh process: what two calls add to the RSS after the inputs are built (MiB)."""
    args = parse_args(job['argv'])
    torch.set_num_threads(args.threads)

    def build():
        make({**job, 'size': 4 if args.what == 'op' else 16}, args)()  # libraries' one-off set-up, not counted
        return make(job, args)
    return dict(extra_mb=worker_memory(build, CPU, warmup=0)['extra_mb'])


def measure_memory(job: Dict, argv: Sequence[str], mmap_threshold: Optional[int]) -> Dict:
    return run_memory_worker(Path(__file__), {**job, 'argv': list(argv)}, memory_env(mmap_threshold))


def run(args: argparse.Namespace, argv: Sequence[str]) -> Dict:
    torch.set_num_threads(args.threads)
    malloc_tuned = tune_malloc()
    sizes = args.sides if args.what == 'op' else args.tokens
    modes = args.modes if args.what == 'op' else ['forward']
    meta = dict(what=args.what, argv=list(argv), device='cpu', device_name=device_name(CPU),
                threads=torch.get_num_threads(), torch=torch.__version__, warmup=args.warmup, repeats=args.repeats,
                malloc_timing=malloc_setting(malloc_tuned),
                memory='VmHWM (reset after building the inputs) - VmRSS then, fresh process, ' +
                ('glibc defaults' if args.memory_mmap_threshold is None else
                 f'MALLOC_MMAP_THRESHOLD_={args.memory_mmap_threshold}'),
                started=time.strftime('%Y-%m-%d %H:%M:%S'), load_at_start=load_average())
    if args.what == 'op':
        meta.update(kind=args.kind, batch=args.batch, heads=args.heads, head_dim=args.head_dim)
    else:
        meta.update(dim=args.dim, heads=args.heads, grids={t: token_grid(t) for t in sizes})
    results: List[Dict] = []
    for size in sizes:
        for mode in modes:
            skipped = {m: block_skip_reason(m, args, size) for m in args.methods} if args.what == 'block' else {}
            builders = {m: (lambda m=m: make(dict(method=m, size=size, mode=mode), args))
                        for m in args.methods if not skipped.get(m)}
            timing = time_steps(builders, CPU, args.warmup, args.repeats, args.keep_going, f'{size} {mode}')
            for method in args.methods:
                row = dict(method=method, size=size, mode=mode)
                if skipped.get(method):
                    row.update(status='skipped', reason=skipped[method], median_ms=None)
                elif method in timing.failures:
                    row.update(timing.failures[method].as_row(), median_ms=None)
                else:
                    row.update(status='ok', **summarize(timing.samples[method]))
                row.update(timing.contention)
                results.append(row)
    if not args.no_memory:
        for row in results:
            if row['status'] == 'ok':
                job = dict(method=row['method'], size=row['size'], mode=row['mode'])
                memory = attempt(lambda: measure_memory(job, argv, args.memory_mmap_threshold), args.keep_going,
                                 f"memory of {row['method']} at {row['size']} {row['mode']}")
                if isinstance(memory, Failure):
                    row.update(extra_mb=None, memory_error=f'{memory.status}: {memory.error}')
                else:
                    row['extra_mb'] = memory['extra_mb']
    first = args.methods[0]
    add_ratios(results, lambda r: r['method'] == first, lambda r: (r['size'], r['mode']),
               dict(latency_ratio='median_ms', memory_ratio='extra_mb'))
    meta.update(finished=time.strftime('%Y-%m-%d %H:%M:%S'), load_at_end=load_average(), baseline=first)
    return dict(meta=meta, results=results)


def markdown_table(report: Dict) -> str:
    fmt = format_optional
    size_name = 'N' if report['meta']['what'] == 'block' else 'side'
    lines = [f"| method | {size_name} | mode | ms, median (IQR) | min ms | x {report['meta']['baseline']} | "
             f"extra MB | x memory |", '|---|---|---|---|---|---|---|---|']
    for r in report['results']:
        if r['median_ms'] is None:
            why = r['reason'] if r['status'] == 'skipped' else f"{r['status']}: {r['error']}"
            lines.append(f"| {r['method']} | {r['size']} | {r['mode']} | {why} | | | | |")
            continue
        lines.append(f"| {r['method']} | {r['size']} | {r['mode']} | {r['median_ms']:.1f} ({r['q1_ms']:.1f}-"
                     f"{r['q3_ms']:.1f}) | {r['min_ms']:.1f} | {fmt(r['latency_ratio'], '.2f')} | "
                     f"{fmt(r.get('extra_mb'), '.0f')} | {fmt(r.get('memory_ratio'), '.2f')} |")
    return '\n'.join(lines)


def main(argv: Optional[Sequence[str]] = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parse_args(argv)
    if args.memory_worker:
        return answer_memory_worker(memory_worker, args.memory_worker)
    report = run(args, argv)
    write_json(args.out_json, report)
    print(markdown_table(report))
    others = [r['other_busy_cores'] for r in report['results'] if r.get('other_busy_cores') is not None]
    print(f"other processes busy: up to {max(others) if others else float('nan'):.2f} cores; "
          + outputs_line(report['meta'], args.out_json))
    return 0


if __name__ == '__main__':
    sys.exit(run_tool(main))
