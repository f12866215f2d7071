"""Command-line plumbing of ``tools/analysis``: commands made of subcommands, and the attention tools' parser (model,
weights, images, one attention block, kernels) and that block's q, k. Each tool runs its ``main`` through
:func:`nalaformer.errors.run_tool`: the project's own errors print one line and exit 2."""
import argparse
import sys
from pathlib import Path
from types import ModuleType
from typing import Dict, List, Optional, Sequence, Tuple

import torch

from ..errors import ConfigError
from ..threads import apply_threads
from .entropy import ATTN_TYPES, capture_qk
from .grids import parse_size
from .images import default_image_paths, load_images
from .models import create_model, parse_model_spec

__all__ = ['parse_subcommand', 'block_parser', 'block_qk']


def parse_subcommand(description: str, commands: Dict[str, ModuleType],
                     argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    """Parse ``argv`` for a command with one subcommand per module of ``commands`` (each has ``add_arguments(parser)``
    and ``main(args)``; its docstring is the help): ``args.command`` names the chosen one, ``args.argv`` is the
    command line as given."""
    parser = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    subparsers = parser.add_subparsers(dest='command', required=True)
    for name, module in commands.items():
        module.add_arguments(subparsers.add_parser(name, help=module.__doc__.split('\n')[0], description=module.__doc__,
                                                   formatter_class=argparse.RawDescriptionHelpFormatter))
    args = parser.parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)
    return args


def block_parser(doc: str, out: str) -> argparse.ArgumentParser:
    """An attention tool's parser, described by the first line of ``doc``: the options choosing a model, its weights,
    the images, one attention block and the kernels, and ``--out`` (the figure, default ``out``)."""
    parser = argparse.ArgumentParser(description=doc.split('\n')[0])
    parser.add_argument('--model', default='nalaformer_t',
                        help="timm name or spec, e.g. \"nalaformer_t(attn_types='nala')\" (NaLaFormer layout)")
    parser.add_argument('--checkpoint', default=None, help='weights file (default: random init, seeded)')
    parser.add_argument('--images', type=Path, nargs='+', default=None,
                        help="image files (default: matplotlib's grace_hopper.jpg, installed with matplotlib)")
    parser.add_argument('--size', default='224', help='input size: 224 or HxW (stage 0 at 224 is 56x56 tokens)')
    parser.add_argument('--stage', type=int, default=0)
    parser.add_argument('--block', type=int, default=0)
    parser.add_argument('--seed', type=int, default=0, help='seed of the random init')
    parser.add_argument('--threads', type=int, default=None,
                        help='CPU threads (default: the cores other processes leave free; OMP_NUM_THREADS wins)')
    parser.add_argument('--attn-types', nargs='+', default=['softmax', 'relu', 'nala'], choices=ATTN_TYPES)
    parser.add_argument('--out', type=Path, default=Path(out))
    return parser


def block_qk(args: argparse.Namespace) -> Tuple[torch.Tensor, torch.Tensor, Tuple[int, int], torch.Tensor, List[str]]:
    """q, k (B, heads, N, d) in float64 of the chosen block on the images, the token grid (H, W), the images' pixels
    (B, H_img, W_img, 3) in [0, 1] and their paths."""
    spec, size = parse_model_spec(args.model), parse_size(args.size)
    paths = [Path(p) for p in (args.images or default_image_paths())]
    missing = [str(p) for p in paths if not p.is_file()]
    if missing:
        raise ConfigError(f'image files not found: {missing}')
    print(apply_threads(args.threads).describe())
    torch.manual_seed(args.seed)
    model = create_model(spec, img_size=size, checkpoint=args.checkpoint)
    images, pixels = load_images(paths, size, model.pretrained_cfg['mean'], model.pretrained_cfg['std'])
    q, k, grid = capture_qk(model, images, args.stage, args.block)
    return q.double(), k.double(), grid, pixels, [str(p) for p in paths]
