"""Segment one image with a trained segmentation model; save the image and the coloured overlay side by side.

    python tools/seg_demo.py demo.jpg configs/ade20k/upernet_nalaformer-t_8xb2-160k_ade20k-512x512.py \\
        work_dirs/upernet_nalaformer-t_8xb2-160k_ade20k-512x512/best_mIoU_iter_160000.pth --out demo_seg.png
"""
import argparse
import os.path as osp
import sys

import mmcv
import numpy as np
from mmengine.config import DictAction
from mmseg.apis import inference_model, init_model, show_result_pyplot

import nalaformer.engine  # noqa: F401  (weights-only checkpoint loading)
from nalaformer.checkpoint import Checkpoint
from nalaformer.engine.launch import load_config
from nalaformer.errors import ConfigError, run_tool
from nalaformer.files import atomic_file, check_file_destination


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('image', help='input image')
    parser.add_argument('config', help='segmentation config file')
    parser.add_argument('checkpoint', help='checkpoint written by tools/train.py')
    parser.add_argument('--out', required=True, help='output PNG: image | overlay')
    parser.add_argument('--overwrite', action='store_true', help='replace --out if it exists')
    parser.add_argument('--device', default='cpu', help="'cpu', 'cuda', 'cuda:1', ...")
    parser.add_argument('--opacity', type=float, default=0.5, help='opacity of the class colours in the overlay')
    parser.add_argument('--cfg-options', nargs='+', action=DictAction, help='override config keys: key=value ...')
    return parser.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    check_file_destination(args.out, args.overwrite, '--out', 'demo_seg.png',
                           inputs=(args.image, args.config, args.checkpoint))
    if not osp.isfile(args.image):
        raise ConfigError(f'image {args.image} does not exist')
    cfg = load_config(args.config, args.cfg_options)
    Checkpoint.read(args.checkpoint)  # a missing, damaged or foreign file is named before the model is built
    model = init_model(cfg, args.checkpoint, device=args.device)
    image = mmcv.imread(args.image, channel_order='rgb')
    result = inference_model(model, args.image)
    overlay = show_result_pyplot(model, image, result, opacity=args.opacity, draw_gt=False, show=False,
                                 with_labels=False)
    with atomic_file(args.out) as tmp:
        mmcv.imwrite(mmcv.rgb2bgr(np.concatenate([image, overlay], axis=1)), str(tmp))
    print(f'wrote {args.out}')


if __name__ == '__main__':
    sys.exit(run_tool(main))  # the arguments are wrong: one line, exit code 2; bugs keep their traceback
