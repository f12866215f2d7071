"""What the dense-prediction demos (tools/det_demo.py, tools/seg_demo.py) share: their positional arguments and
``--out``, and the checks of the inputs that come before a model is built."""
import argparse
import os.path as osp

from mmengine.config import Config

from .checkpoint import Checkpoint
from .engine.launch import load_config
from .errors import ConfigError
from .files import check_file_destination

__all__ = ['demo_parser', 'load_demo_config']


def demo_parser(description: str, image_help: str, config_help: str, out_help: str) -> argparse.ArgumentParser:
    """A parser with ``image``, ``config``, ``checkpoint``, ``--out`` and ``--overwrite``."""
    parser = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('image', help=image_help)
    parser.add_argument('config', help=config_help)
    parser.add_argument('checkpoint', help='checkpoint written by tools/train.py')
    parser.add_argument('--out', required=True, help=out_help)
    parser.add_argument('--overwrite', action='store_true', help='replace --out if it exists')
    return parser


def load_demo_config(args: argparse.Namespace, example: str, cfg_options=None) -> Config:
    """The config, once ``--out`` (``example``: a name to suggest), the image and the checkpoint are checked."""
    check_file_destination(args.out, args.overwrite, '--out', example,
                           inputs=(args.image, args.config, args.checkpoint))
    if not osp.isfile(args.image):
        raise ConfigError(f'image {args.image} does not exist')
    cfg = load_config(args.config, cfg_options)
    Checkpoint.read(args.checkpoint)  # a missing, damaged or foreign file is named before the model is built
    return cfg
