"""Detect objects (and instance masks) in one image and save a picture of the predictions.

    python3 tools/det_demo.py demo.jpg configs/coco/mask-rcnn_nalaformer-t_fpn_1x_coco.py \
        work_dirs/mask-rcnn_nalaformer-t_fpn_1x_coco/epoch_12.pth --out demo_pred.png

Use the config the checkpoint was trained with (tools/train.py saves it in the work dir); class
names come from the checkpoint. mmdet's init_detector / inference_detector and DetLocalVisualizer.
--out is checked before the model is built (an existing file is replaced only with --overwrite) and
written atomically.
"""
import sys

import mmcv
import torch
from mmdet.apis import inference_detector, init_detector
from mmdet.registry import VISUALIZERS

from nalaformer.dense_demo import demo_parser, load_demo_config
from nalaformer.errors import run_tool
from nalaformer.files import atomic_file


def parse_args(argv=None):
    parser = demo_parser(__doc__, 'image file', 'detection config file', 'output image (.png, .jpg)')
    parser.add_argument('--device', default='cuda:0' if torch.cuda.is_available() else 'cpu')
    parser.add_argument('--score-thr', type=float, default=0.3, help='draw predictions scoring at least this')
    return parser.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    cfg = load_demo_config(args, 'demo_pred.png')
    model = init_detector(cfg, args.checkpoint, device=args.device)  # the config imports nalaformer.dense
    result = inference_detector(model, args.image)
    visualizer = VISUALIZERS.build(model.cfg.visualizer)
    visualizer.dataset_meta = model.dataset_meta
    image = mmcv.imread(args.image, channel_order='rgb')
    with atomic_file(args.out) as tmp:
        visualizer.add_datasample('prediction', image, data_sample=result, draw_gt=False,
                                  pred_score_thr=args.score_thr, out_file=str(tmp))
    kept = int((result.pred_instances.scores >= args.score_thr).sum())
    print(f'{kept} detections with score >= {args.score_thr} drawn to {args.out}')


if __name__ == '__main__':
    sys.exit(run_tool(main))  # the arguments are wrong: one line, exit code 2; bugs keep their traceback
