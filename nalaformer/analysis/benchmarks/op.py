"""Time and memory of the NaLa attention op (fast vs reference), and of one attention block vs softmax (CPU).

Timed alternating; memory is what one call adds to the RSS, in a fresh process each. ``--what op``: the op
(``--attn-type``), ``reference`` vs ``fast``, forward and forward + backward. ``--what block``: one ``NaLaAttention``
block, forward: ``nala``, ``nala_reference``, ``sdpa`` and ``softmax`` (explicit; skipped where N x N does not fit)::

    python3 tools/analysis/benchmark.py op --threads 1 --sides 112 --batch 2 --out-json docs/nala_op_cpu.json
    python3 tools/analysis/benchmark.py op --what block --threads 2 --tokens 16384 32768 73728 \\
        --out-json docs/nala_block_vs_softmax_cpu.json
"""
import argparse
import itertools
from functools import partial
from pathlib import Path
from typing import Callable, Dict, Optional

import torch

from ...errors import ConfigError
from ...models import NaLaAttention
from ...ops import nala, nala_fast, rope_angles, rope_table
from ..grids import token_grid
from ..memory import add_worker_memory, available_memory_mb, malloc_setting, memory_env, tune_malloc, worker_memory
from ..results import add_ratios, format_optional, markdown_table, write_report
from ..steps import ModelStep, backend_context
from ..timing import time_steps
from .common import (
    add_keep_going_arg, add_mmap_arg, add_timing_args, attention_call, finish_meta, mmap_setting, start_meta,
)

METHODS = dict(op=('reference', 'fast'), block=('nala', 'nala_reference', 'sdpa', 'softmax'))
MODES = ('forward', 'forward_backward')
CPU = torch.device('cpu')
# What a memory worker needs to build a method's inputs again.
SETTINGS = ('what', 'attn_type', 'alpha', 'batch', 'heads', 'head_dim', 'dim', 'threads')


def add_arguments(parser: argparse.ArgumentParser):
    parser.add_argument('--what', choices=tuple(METHODS), default='op')
    parser.add_argument('--attn-type', choices=('nala', 'nala_cos'), default='nala', help='op: the kernel')
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
    add_timing_args(parser, warmup=2, repeats=10, threads=1)
    parser.add_argument('--no-memory', action='store_true')
    add_mmap_arg(parser)
    add_keep_going_arg(parser)
    parser.add_argument('--out-json', type=Path, default=Path('benchmark_nala_op.json'))


def op_step(method: str, args: argparse.Namespace, side: int, mode: str) -> Callable[[], torch.Tensor]:
    """One call of the op of ``method`` (``nala_fast``'s or the reference of ``nala``) on (batch, heads, side^2,
    head_dim) inputs."""
    g = torch.Generator().manual_seed(0)
    shape = (args.batch, args.heads, side * side, args.head_dim)
    # |q| spread over tanh's range, as in a trained block
    q = torch.randn(*shape, generator=g) * torch.linspace(0.1, 3.0, side * side)[:, None] / args.head_dim ** 0.5
    k, v, dout = (torch.randn(*shape, generator=g) * s for s in (0.7, 1.0, 1.0))
    rope = rope_table(rope_angles(args.head_dim), side, side)
    attention = getattr(nala_fast if method == 'fast' else nala, f'{args.attn_type}_attention')
    alpha = (args.alpha,) if args.attn_type == 'nala_cos' else ()
    inputs = [t.requires_grad_(mode != 'forward') for t in (q, k, v)]
    return lambda: attention_call(lambda q, k, v: attention(q, k, v, rope, *alpha), inputs, mode, dout)


def block_step(method: str, args: argparse.Namespace, tokens: int) -> ModelStep:
    """The block of ``method`` on a (1, dim, H, W) map of ``tokens`` tokens, forward under inference_mode."""
    torch.manual_seed(0)
    block = NaLaAttention(args.dim, args.heads, attn_type={'sdpa': 'softmax', 'softmax': 'softmax_explicit'}.get(
        method, 'nala'))
    x = torch.randn(1, args.dim, *token_grid(tokens), generator=torch.Generator().manual_seed(0))
    backend = 'reference' if method == 'nala_reference' else None
    return ModelStep(block, x, 'infer', CPU, context=backend_context(backend))


def block_skip_reason(method: str, args: argparse.Namespace, tokens: int) -> Optional[str]:
    """Why the explicit softmax cannot run here: its scores and their softmax (2 N x N x heads floats)."""
    need, available = 2 * tokens * tokens * args.heads * 4 / 2 ** 20, available_memory_mb()
    if method == 'softmax' and available is not None and need > 0.8 * available:
        return f'skipped: the explicit N x N softmax needs ~{need / 1024:.1f} GiB, {available / 1024:.1f} GiB available'
    return None


def make(job: Dict, args: argparse.Namespace) -> Callable[[], object]:
    if args.what == 'op':
        return op_step(job['method'], args, job['size'], job['mode'])
    return block_step(job['method'], args, job['size'])


def memory_worker(job: Dict) -> Dict:
    """In a fresh process: what two calls add to the RSS after the inputs are built (MiB)."""
    args = argparse.Namespace(**job['settings'])
    torch.set_num_threads(args.threads)

    def build():
        make({**job, 'size': 4 if args.what == 'op' else 16}, args)()  # libraries' one-off set-up, not counted
        return make(job, args)
    return dict(extra_mb=worker_memory(build, CPU, warmup=0)['extra_mb'])


def run(args: argparse.Namespace) -> Dict:
    methods = args.methods or list(METHODS[args.what])
    unknown = [m for m in methods if m not in METHODS[args.what]]
    if unknown:
        raise ConfigError(f'--methods {unknown} are not methods of --what {args.what}: choose from '
                          f'{list(METHODS[args.what])}')
    meta = start_meta(CPU, args, what=args.what, baseline=methods[0], argv=args.argv,
                      malloc_timing=malloc_setting(tune_malloc()),
                      memory='VmHWM (reset after building the inputs) - VmRSS then, fresh process, '
                             + mmap_setting(args.memory_mmap_threshold))
    if args.what == 'op':
        sizes, modes = args.sides, args.modes
        meta.update(kind=args.attn_type, batch=args.batch, heads=args.heads, head_dim=args.head_dim)
    else:
        sizes, modes = args.tokens, ['forward']
        meta.update(dim=args.dim, heads=args.heads, grids={t: token_grid(t) for t in sizes})
    results = []
    for size, mode in itertools.product(sizes, modes):
        skipped = {m: block_skip_reason(m, args, size) for m in methods}
        builders = {m: partial(make, dict(method=m, size=size, mode=mode), args) for m in methods if not skipped[m]}
        timing = time_steps(builders, CPU, args.warmup, args.repeats, args.keep_going, f'{size} {mode}')
        for m in methods:
            outcome = dict(status='skipped', reason=skipped[m], median_ms=None) if skipped[m] else timing.row(m)
            results.append(dict(method=m, size=size, mode=mode, **outcome, **timing.contention))
    if not args.no_memory:
        settings = {key: getattr(args, key) for key in SETTINGS}
        add_worker_memory([r for r in results if r['status'] == 'ok'], memory_worker,
                          lambda row: dict(method=row['method'], size=row['size'], mode=row['mode'], settings=settings),
                          memory_env(args.memory_mmap_threshold), args.keep_going,
                          lambda row: f"memory of {row['method']} at {row['size']} {row['mode']}", ('extra_mb',))
    add_ratios(results, lambda r: r['method'] == methods[0], lambda r: (r['size'], r['mode']),
               dict(latency_ratio='median_ms', memory_ratio='extra_mb'))
    return dict(meta=finish_meta(meta), results=results)


def table(report: Dict) -> str:
    fmt = format_optional
    header = ['method', 'N' if report['meta']['what'] == 'block' else 'side', 'mode', 'ms, median (IQR)', 'min ms',
              f"x {report['meta']['baseline']}", 'extra MB', 'x memory']
    rows = []
    for r in report['results']:
        if r['median_ms'] is None:
            figures = [r['reason'] if r['status'] == 'skipped' else f"{r['status']}: {r['error']}"] + [''] * 4
        else:
            figures = [f"{r['median_ms']:.1f} ({r['q1_ms']:.1f}-{r['q3_ms']:.1f})", f"{r['min_ms']:.1f}",
                       fmt(r['latency_ratio'], '.2f'), fmt(r.get('extra_mb'), '.0f'), fmt(r.get('memory_ratio'), '.2f')]
        rows.append([r['method'], str(r['size']), r['mode'], *figures])
    return markdown_table(header, rows)


def main(args: argparse.Namespace) -> int:
    report = run(args)
    written = write_report(report, args.out_json)
    print(table(report))
    others = [r['other_busy_cores'] for r in report['results'] if r.get('other_busy_cores') is not None]
    print(f"other processes busy: up to {max(others) if others else float('nan'):.2f} cores; {written}")
    return 0
