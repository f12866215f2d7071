"""Attention entropy vs query norm for softmax, ReLU linear attention and NaLa (the paper's Fig. 1).

Takes q, k entering the attention kernel of one block of a NaLaFormer (random init, or
``--checkpoint``) on real images, and for each kernel computes every query's attention
distribution over the keys and its entropy (``nalaformer.analysis.entropy``: exact, chunked
over queries, RoPE off). Two views per kernel:

* tokens: entropy of each real query against its norm |q|, with Pearson/Spearman correlations
  (pooled over images and heads);
* norm sweep: the same query directions rescaled to fixed norms, which isolates |q|. Softmax
  and NaLa lose entropy as |q| grows; ReLU linear attention is exactly invariant.

Writes a PNG and a JSON. Example::

    python3 tools/analysis/attention_entropy.py --model nalaformer_t --stage 0 \\
        --out docs/attention_entropy.png --json docs/attention_entropy.json
"""
import argparse
import math
import sys
from pathlib import Path
from typing import Dict, Optional, Sequence

import torch
from tqdm import tqdm

from nalaformer.analysis.cli import add_block_args, block_qk
from nalaformer.analysis.entropy import KERNELS, attention_entropy, norm_sweep, pearson, spearman
from nalaformer.analysis.grids import parse_size
from nalaformer.analysis.results import save_figure, write_json
from nalaformer.errors import run_tool


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    add_block_args(parser)
    parser.add_argument('--kernels', nargs='+', default=['softmax', 'relu', 'nala'], choices=KERNELS)
    parser.add_argument('--chunk', type=int, default=1024, help='queries per chunk (memory: chunk x N scores)')
    parser.add_argument('--sweep-norms', type=float, nargs=2, default=(0.03, 30.), metavar=('MIN', 'MAX'),
                        help='range of query norms of the sweep (log-spaced)')
    parser.add_argument('--sweep-steps', type=int, default=13)
    parser.add_argument('--sweep-queries', type=int, default=256, help='query directions per head in the sweep')
    parser.add_argument('--out', type=Path, default=Path('docs/attention_entropy.png'))
    parser.add_argument('--json', type=Path, default=Path('docs/attention_entropy.json'))
    return parser.parse_args(argv)


def analyse(args: argparse.Namespace) -> Dict:
    q, k, grid, _, paths = block_qk(args)
    n_tokens = q.shape[-2]
    q_norm = torch.linalg.vector_norm(q, dim=-1)
    sweep_norms = torch.logspace(math.log10(args.sweep_norms[0]), math.log10(args.sweep_norms[1]), args.sweep_steps)
    stride = max(1, n_tokens // args.sweep_queries)
    results, entropies, sweeps = {}, {}, {}
    for kernel in tqdm(args.kernels, desc='kernels'):
        h = attention_entropy(kernel, q, k, args.chunk)
        sweep = norm_sweep(kernel, q[..., ::stride, :], k, sweep_norms, args.chunk).flatten(1)  # (S, queries)
        entropies[kernel], sweeps[kernel] = h, sweep
        mean_sweep = sweep.nanmean(dim=1)
        results[kernel] = dict(
            pearson=pearson(q_norm, h), spearman=spearman(q_norm, h),
            entropy=dict(min=float(h.min()), median=float(h.median()), max=float(h.max())),
            sweep=dict(mean_entropy=mean_sweep.tolist(),
                       change_low_to_high_norm=float(mean_sweep[-1] - mean_sweep[0])),
        )
    report = dict(
        model=args.model, checkpoint=args.checkpoint or f'random init (seed {args.seed})', images=paths,
        input_size=list(parse_size(args.size)), stage=args.stage, block=args.block, token_grid=list(grid),
        heads=q.shape[1], head_dim=q.shape[-1], tokens=n_tokens, log_n=math.log(n_tokens),
        rope='off (the release rotates only the numerator, so rotated weights are not a distribution)',
        softmax_scale='1/sqrt(head_dim), as in the model', correlations='pooled over images, heads and queries',
        query_norm=dict(min=float(q_norm.min()), median=float(q_norm.median()), max=float(q_norm.max())),
        sweep_norms=sweep_norms.tolist(), sweep_queries_per_head=q[..., ::stride, :].shape[-2],
        kernels=results,
    )
    plot(report, q_norm, entropies, sweeps, sweep_norms, args.out)
    return report


def plot(report: Dict, q_norm: torch.Tensor, entropies: Dict[str, torch.Tensor], sweeps: Dict[str, torch.Tensor],
         sweep_norms: torch.Tensor, out: Path):
    """One panel per kernel: token scatter (entropy vs |q|) and the norm sweep's median with its IQR."""
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt

    kernels = list(entropies)
    fig, axes = plt.subplots(1, len(kernels), figsize=(4.2 * len(kernels), 3.8), squeeze=False)
    for ax, kernel in zip(axes[0], kernels):
        stats = report['kernels'][kernel]
        ax.scatter(q_norm.flatten(), entropies[kernel].flatten(), s=2, alpha=0.25, color='tab:blue',
                   label='tokens', rasterized=True)
        lo, mid, hi = torch.nanquantile(sweeps[kernel], torch.tensor([0.25, 0.5, 0.75], dtype=torch.float64), dim=1)
        ax.plot(sweep_norms, mid, color='tab:red', label='same directions, norm swept')
        ax.fill_between(sweep_norms, lo, hi, color='tab:red', alpha=0.2)
        ax.axhline(report['log_n'], color='gray', ls='--', lw=1, label='log N (uniform)')
        ax.set_xscale('log')
        ax.set_xlabel('query norm |q|')
        ax.set_title(f"{kernel}: tokens Spearman {stats['spearman']:+.2f}, Pearson {stats['pearson']:+.2f}\n"
                     f"sweep: entropy change {stats['sweep']['change_low_to_high_norm']:+.3f} nats", fontsize=10)
    axes[0][0].set_ylabel('attention entropy (nats)')
    axes[0][0].legend(fontsize=8, loc='lower left')
    fig.suptitle(f"{report['model']} stage {report['stage']} block {report['block']}, "
                 f"{report['token_grid'][0]}x{report['token_grid'][1]} tokens, {report['checkpoint']}, RoPE off",
                 fontsize=10)
    save_figure(fig, out, dpi=120)


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_args(argv)
    report = analyse(args)
    write_json(args.json, report)
    for kernel, stats in report['kernels'].items():
        print(f"{kernel:9s} Spearman {stats['spearman']:+.3f}  Pearson {stats['pearson']:+.3f}  "
              f"sweep change {stats['sweep']['change_low_to_high_norm']:+.3f} nats")
    print(f'wrote {args.out} and {args.json}')
    return 0


if __name__ == '__main__':
    sys.exit(run_tool(main))
