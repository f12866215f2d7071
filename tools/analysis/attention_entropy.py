"""Attention entropy vs query norm for softmax, ReLU linear attention and NaLa (the paper's Fig. 1).

On q, k of one block on real images, per kernel: each query's entropy against |q| (Pearson, Spearman), and the norm
sweep (the same directions at fixed norms). Writes a PNG and a JSON. Example::

    python3 tools/analysis/attention_entropy.py --model nalaformer_t --stage 0 \\
        --out docs/attention_entropy.png --json docs/attention_entropy.json
"""
import argparse
import math
import sys
from pathlib import Path
from typing import Dict, Optional, Sequence, Tuple

import torch
from tqdm import tqdm

from nalaformer.analysis.cli import block_parser, block_qk
from nalaformer.analysis.entropy import pearson, spearman
from nalaformer.analysis.grids import parse_size
from nalaformer.analysis.mechanism import entropy_and_sweep, spread, sweep_norms
from nalaformer.analysis.plots import panels, save_figure
from nalaformer.analysis.results import write_json
from nalaformer.errors import run_tool

Measured = Dict[str, Tuple[torch.Tensor, torch.Tensor]]  # kernel: entropy (B, heads, N), norm sweep (S, queries)


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    parser = block_parser(__doc__, 'docs/attention_entropy.png')
    parser.add_argument('--chunk', type=int, default=1024, help='queries per chunk (memory: chunk x N scores)')
    parser.add_argument('--sweep-norms', type=float, nargs=2, default=(0.03, 30.), metavar=('MIN', 'MAX'),
                        help='range of query norms of the sweep (log-spaced)')
    parser.add_argument('--sweep-steps', type=int, default=13)
    parser.add_argument('--sweep-queries', type=int, default=256, help='query directions per head in the sweep')
    parser.add_argument('--json', type=Path, default=Path('docs/attention_entropy.json'))
    return parser.parse_args(argv)


def analyse(args: argparse.Namespace) -> Dict:
    """Measure every kernel on the chosen block, plot to ``args.out``; returns the report."""
    q, k, grid, _, paths = block_qk(args)
    n_tokens = q.shape[-2]
    q_norm = torch.linalg.vector_norm(q, dim=-1)
    norms = sweep_norms(*args.sweep_norms, args.sweep_steps)
    measured = {attn_type: entropy_and_sweep(q, k, attn_type, norms, args.sweep_queries, args.chunk)
                for attn_type in tqdm(args.attn_types, desc='kernels')}
    results = {}
    for attn_type, (h, sweep) in measured.items():
        mean_sweep = sweep.nanmean(dim=1)
        results[attn_type] = dict(pearson=pearson(q_norm, h), spearman=spearman(q_norm, h), entropy=spread(h),
                                  sweep=dict(mean_entropy=mean_sweep.tolist(),
                                             change_low_to_high_norm=float(mean_sweep[-1] - mean_sweep[0])))
    report = dict(
        model=args.model, checkpoint=args.checkpoint or f'random init (seed {args.seed})', images=paths,
        input_size=list(parse_size(args.size)), stage=args.stage, block=args.block, token_grid=list(grid),
        heads=q.shape[1], head_dim=q.shape[-1], tokens=n_tokens, log_n=math.log(n_tokens),
        rope='off (the release rotates only the numerator, so rotated weights are not a distribution)',
        softmax_scale='1/sqrt(head_dim), as in the model', correlations='pooled over images, heads and queries',
        query_norm=spread(q_norm), sweep_norms=norms.tolist(),
        sweep_queries_per_head=math.ceil(n_tokens / max(1, n_tokens // args.sweep_queries)),
        kernels=results,
    )
    plot(report, q_norm, measured, norms, args.out)
    return report


def plot(report: Dict, q_norm: torch.Tensor, measured: Measured, norms: torch.Tensor, out: Path):
    """One panel per kernel: token scatter (entropy vs |q|) and the norm sweep's median with its IQR."""
    fig, [axes] = panels(1, len(measured), 4.2, 3.8)
    quartiles = torch.tensor([0.25, 0.5, 0.75], dtype=torch.float64)
    for ax, (attn_type, (h, sweep)) in zip(axes, measured.items()):
        stats = report['kernels'][attn_type]
        ax.scatter(q_norm.flatten(), h.flatten(), s=2, alpha=0.25, color='tab:blue', label='tokens', rasterized=True)
        lo, mid, hi = torch.nanquantile(sweep, quartiles, dim=1)
        ax.plot(norms, mid, color='tab:red', label='same directions, norm swept')
        ax.fill_between(norms, lo, hi, color='tab:red', alpha=0.2)
        ax.axhline(report['log_n'], color='gray', ls='--', lw=1, label='log N (uniform)')
        ax.set(xscale='log', xlabel='query norm |q|')
        ax.set_title(f"{attn_type}: tokens Spearman {stats['spearman']:+.2f}, Pearson {stats['pearson']:+.2f}\n"
                     f"sweep: entropy change {stats['sweep']['change_low_to_high_norm']:+.3f} nats", fontsize=10)
    axes[0].set(ylabel='attention entropy (nats)')
    axes[0].legend(fontsize=8, loc='lower left')
    fig.suptitle(f"{report['model']} stage {report['stage']} block {report['block']}, "
                 f"{report['token_grid'][0]}x{report['token_grid'][1]} tokens, {report['checkpoint']}, RoPE off",
                 fontsize=10)
    save_figure(fig, out, dpi=120)


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_args(argv)
    report = analyse(args)
    write_json(args.json, report)
    for attn_type, stats in report['kernels'].items():
        print(f"{attn_type:9s} Spearman {stats['spearman']:+.3f}  Pearson {stats['pearson']:+.3f}  "
              f"sweep change {stats['sweep']['change_low_to_high_norm']:+.3f} nats")
    print(f'wrote {args.out} and {args.json}')
    return 0


if __name__ == '__main__':
    sys.exit(run_tool(main))
