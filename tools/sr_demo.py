"""Upscale one image of any size with a trained super-resolution model.

    python3 tools/sr_demo.py photo.png photo_x2.png --config configs/sr/nalasr-light_8xb16-500k_div2k-x2.py \\
        --checkpoint work_dirs/nalasr-light_8xb16-500k_div2k-x2/iter_500000.pth [--tile 200] [--overwrite]

The whole image goes through the network at once unless --tile T is given: then tiles of T x T LR pixels
overlapping by --tile-overlap (default T / 10) bound the memory whatever the image size. --scale builds the
network for another scale than the config's (it must be the checkpoint's). OUT is written as PNG/JPEG/...
by its extension and never replaces an existing file unless --overwrite.
"""
import argparse
import os.path as osp
import sys
from pathlib import Path

import torch
from mmengine.config import DictAction
from mmengine.registry import MODELS

import nalaformer.sr  # noqa: F401  (registers SRModel)
from nalaformer.checkpoint import Checkpoint, load_checkpoint_into
from nalaformer.engine.launch import load_config
from nalaformer.images import IMAGE_EXTENSIONS, read_image, save_image, to_uint8
from nalaformer.errors import ConfigError, run_tool
from nalaformer.files import check_file_destination


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('image', help='input image (any size)')
    parser.add_argument('out', help='output image (.png, .jpg, ...)')
    parser.add_argument('--config', required=True, help='the SR config the checkpoint was trained with')
    parser.add_argument('--checkpoint', required=True, help='checkpoint written by tools/train.py')
    parser.add_argument('--scale', type=int, help="upscaling factor (default: the config's model.upscale)")
    parser.add_argument('--tile', type=int, help='upscale in tiles of TILE x TILE LR pixels (default: whole image)')
    parser.add_argument('--tile-overlap', type=int, help='LR pixels shared by neighbouring tiles (default: TILE // 10)')
    parser.add_argument('--device', default='cuda' if torch.cuda.is_available() else 'cpu')
    parser.add_argument('--overwrite', action='store_true', help='replace OUT if it exists')
    parser.add_argument('--cfg-options', nargs='+', action=DictAction, help='override config keys: key=value ...')
    return parser.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    check_file_destination(args.out, args.overwrite, 'OUT', 'out.png', inputs=(args.image, args.config, args.checkpoint))
    if Path(args.out).suffix.lower() not in IMAGE_EXTENSIONS:
        raise ConfigError(f'OUT {args.out}: give an image extension (.png, .jpg, ...)')
    cfg = load_config(args.config, args.cfg_options)
    if cfg.model.get('type') != 'SRModel':
        raise ConfigError(f'{args.config} is not a super-resolution config (model.type {cfg.model.get("type")!r})')
    if args.scale is not None:
        cfg.model.upscale = args.scale
    if args.tile is not None and args.tile < 1:
        raise ConfigError(f'--tile must be a positive number of LR pixels, got {args.tile}')
    overlap = args.tile_overlap if args.tile_overlap is not None else (args.tile or 0) // 10
    cfg.model.update(tile=args.tile, tile_overlap=overlap)
    if not osp.exists(args.checkpoint):
        raise ConfigError(f'checkpoint {args.checkpoint} does not exist')
    image = read_image(Path(args.image))
    model = MODELS.build(cfg.model)
    load_checkpoint_into(model, Checkpoint.read(args.checkpoint))
    model.to(args.device).eval()
    with torch.no_grad():
        lr = torch.from_numpy(image.transpose(2, 0, 1).copy())[None].to(args.device)
        sr = model(lr, mode='tensor')
    out = to_uint8(sr[0].permute(1, 2, 0).float().cpu().numpy())
    save_image(out, Path(args.out))
    tiles = f', tiles of {args.tile} px' if args.tile else ''
    print(f'wrote {args.out}: {image.shape[1]}x{image.shape[0]} -> {out.shape[1]}x{out.shape[0]} '
          f'(x{model.model.upscale}{tiles})')


if __name__ == '__main__':
    sys.exit(run_tool(main))  # what the user gave is wrong: one line, exit code 2; bugs keep their traceback
