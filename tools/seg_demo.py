"""Segment one image with a trained segmentation model; save the image and the coloured overlay side by side.

    python3 tools/seg_demo.py demo.jpg configs/ade20k/upernet_nalaformer-t_8xb2-160k_ade20k-512x512.py \\
        work_dirs/upernet_nalaformer-t_8xb2-160k_ade20k-512x512/best_mIoU_iter_160000.pth --out demo_seg.png
"""
import sys

import mmcv
import numpy as np
from mmengine.config import DictAction
from mmseg.apis import inference_model, init_model, show_result_pyplot

import nalaformer.engine  # noqa: F401  (weights-only checkpoint loading)
from nalaformer.dense_demo import demo_parser, load_demo_config
from nalaformer.errors import run_tool
from nalaformer.files import atomic_file


def parse_args(argv=None):
    parser = demo_parser(__doc__, 'input image', 'segmentation config file', 'output PNG: image | overlay')
    parser.add_argument('--device', default='cpu', help="'cpu', 'cuda', 'cuda:1', ...")
    parser.add_argument('--opacity', type=float, default=0.5, help='opacity of the class colours in the overlay')
    parser.add_argument('--cfg-options', nargs='+', action=DictAction, help='override config keys: key=value ...')
    return parser.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    cfg = load_demo_config(args, 'demo_seg.png', args.cfg_options)
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
