"""Overlay one query's attention map on the image, for one or several attention kernels.

The query at ``--query X Y`` (fractions of width and height), head ``--head``: its attention over all keys per kernel
(RoPE off), each map scaled to its maximum. Example::

    python3 tools/analysis/visualize_attention.py --attn-types softmax relu nala --query 0.45 0.3 \\
        --out docs/attention_map.png
"""
import argparse
import math
import sys
from typing import Optional, Sequence, Tuple

import torch.nn.functional as F

from nalaformer.analysis.cli import block_parser, block_qk
from nalaformer.analysis.entropy import attention_probs, entropy
from nalaformer.analysis.plots import panels, save_figure
from nalaformer.errors import ConfigError, run_tool


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    parser = block_parser(__doc__, 'docs/attention_map.png')
    parser.add_argument('--head', type=int, default=0)
    parser.add_argument('--query', type=float, nargs=2, default=(0.45, 0.3), metavar=('X', 'Y'),
                        help='query position as fractions of image width and height, in [0, 1]')
    return parser.parse_args(argv)


def query_cell(query_xy: Sequence[float], grid: Sequence[int]) -> Tuple[int, int]:
    """Token (row, col) of the point (x, y) in [0, 1]^2 on an (H, W) token grid."""
    x, y = query_xy
    if not (0 <= x <= 1 and 0 <= y <= 1):
        raise ConfigError(f'--query takes fractions of width and height in [0, 1], got {x} {y}')
    return min(int(y * grid[0]), grid[0] - 1), min(int(x * grid[1]), grid[1] - 1)


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_args(argv)
    q, k, grid, pixels, _ = block_qk(args)
    if not 0 <= args.head < q.shape[1]:
        raise ConfigError(f'--head {args.head} out of range: stage {args.stage} has {q.shape[1]} heads')
    row, col = query_cell(args.query, grid)
    index = row * grid[1] + col
    q, k, image = q[0, args.head], k[0, args.head], pixels[0]  # first image: (N, d), (N, d), (H, W, 3)
    height, width = image.shape[:2]

    fig, [axes] = panels(1, 1 + len(args.attn_types), 3.6, 3.8)
    for ax in axes:
        ax.imshow(image)
        ax.plot((col + 0.5) * width / grid[1], (row + 0.5) * height / grid[0], marker='*', color='white',
                markeredgecolor='black', markersize=14)
        ax.axis('off')
    axes[0].set_title(f'query token {index} ({grid[0]}x{grid[1]} grid)', fontsize=10)
    for ax, attn_type in zip(axes[1:], args.attn_types):
        probs = attention_probs(attn_type, q[index:index + 1], k)[0]  # (N,)
        heat = F.interpolate(probs.reshape(1, 1, *grid).float(), size=(height, width), mode='bilinear')[0, 0]
        ax.imshow(heat / heat.max(), cmap='jet', alpha=0.5, vmin=0, vmax=1)
        ax.set_title(f'{attn_type}: entropy {float(entropy(probs)):.2f} / {math.log(probs.numel()):.2f}\n'
                     f'peak {float(probs.max()) * probs.numel():.1f}x uniform', fontsize=10)
    fig.suptitle(f'{args.model} stage {args.stage} block {args.block} head {args.head}, '
                 f"{args.checkpoint or f'random init (seed {args.seed})'}, RoPE off", fontsize=10)
    save_figure(fig, args.out, dpi=80, rect=(0, 0, 1, 0.92))
    print(f'wrote {args.out}')
    return 0


if __name__ == '__main__':
    sys.exit(run_tool(main))
