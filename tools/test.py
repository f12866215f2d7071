"""Evaluate a checkpoint with the config's test dataloader and evaluator (any task).

    python tools/test.py configs/nalaformer/nalaformer-t_8xb128_in1k.py work_dirs/.../best.pth
    python tools/test.py CONFIG release_nalaformer_t.pth       # the authors' checkpoints work too
    python tools/test.py configs/ade20k/CONFIG.py work_dirs/.../best_mIoU_iter_*.pth --tta --show-dir vis/

Checkpoints written by tools/train.py are loaded as they are; other weights (the release's
.pth, .safetensors) go through the model's checkpoint filter, which rejects other variants.
"""
import argparse
import os.path as osp
import sys

import numpy as np
from mmengine.config import DictAction

import nalaformer.engine  # noqa: F401
from nalaformer.checkpoint import CheckpointError
from nalaformer.engine.checkpoint import _load_local_weights_only, check_state_dict_fits
from nalaformer.engine.launch import build_runner, check_dataset_files, finalize_config, load_config


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('config', help='config file')
    parser.add_argument('checkpoint', help='checkpoint (.pth from tools/train.py, the release\'s .pth, .safetensors)')
    parser.add_argument('--work-dir', help='where logs go (default: work_dirs/<config name>)')
    parser.add_argument('--show-dir', help='write visualised predictions here (segmentation/detection)')
    parser.add_argument('--ema', action='store_true', help='evaluate the EMA weights stored in the checkpoint')
    parser.add_argument('--tta', action='store_true',
                        help="test-time augmentation with the config's tta_pipeline and tta_model "
                             '(segmentation: scales 0.5-1.75 and flips)')
    parser.add_argument('--cfg-options', nargs='+', action=DictAction, help='override config keys: key=value ...')
    parser.add_argument('--launcher', choices=['none', 'pytorch', 'slurm', 'mpi'], default='none')
    parser.add_argument('--local-rank', '--local_rank', type=int, default=0)
    return parser.parse_args(argv)


def is_runner_checkpoint(path: str) -> bool:
    if not path.endswith(('.pth', '.pt', '.ckpt')):
        return False
    checkpoint = _load_local_weights_only(path, map_location='cpu')
    return isinstance(checkpoint, dict) and 'state_dict' in checkpoint and 'meta' in checkpoint


def main(argv=None):
    args = parse_args(argv)
    cfg = finalize_config(load_config(args.config, args.cfg_options), args.config, args.work_dir, args.launcher)
    runner_checkpoint = is_runner_checkpoint(args.checkpoint)
    if runner_checkpoint:
        cfg.load_from = args.checkpoint
    elif cfg.model.get('type') == 'TimmClassifier':
        cfg.model.pretrained = args.checkpoint
    else:
        raise SystemExit(f'{args.checkpoint} is not a checkpoint written by tools/train.py; for dense tasks '
                         f'load backbone weights through model.backbone.init_cfg and train/fine-tune first')
    if args.ema:
        ema_hooks = [h for h in cfg.get('custom_hooks', []) if h.get('type') == 'DualEMAHook']
        if not ema_hooks:
            raise SystemExit('--ema: this config has no DualEMAHook, so its checkpoints hold no EMA weights')
        ema_hooks[0].test_with_ema = True
    if args.show_dir and cfg.default_hooks.visualization.type.endswith('SegVisualizationHook'):
        # mmseg's hook draws every `interval`-th image through the visualizer: <show-dir>/vis_data/vis_image
        cfg.default_hooks.visualization.update(draw=True, interval=1)
        cfg.visualizer.save_dir = args.show_dir
    elif args.show_dir:
        # absolute: mmdet's DetVisualizationHook joins a relative dir onto work_dir/timestamp at every iteration
        cfg.default_hooks.visualization.update(draw=True, test_out_dir=osp.abspath(args.show_dir))
    if args.tta:
        if not {'tta_model', 'tta_pipeline'} <= set(cfg):
            raise SystemExit('--tta: this config defines no tta_model and tta_pipeline')
        cfg.test_dataloader.dataset.pipeline = cfg.tta_pipeline
        cfg.model = dict(cfg.tta_model, module=cfg.model)
    check_dataset_files(cfg, ('test',))
    runner = build_runner(cfg)
    if runner_checkpoint:
        state = _load_local_weights_only(args.checkpoint, map_location='cpu')['state_dict']
        check_state_dict_fits(runner.model, state)
    metrics = runner.test()
    print({k: round(float(v), 4) if isinstance(v, (float, np.floating)) else v for k, v in metrics.items()})
    return metrics


if __name__ == '__main__':
    try:
        main()
    except (KeyError, FileNotFoundError, CheckpointError) as e:
        sys.exit(f'error: {e.args[0] if e.args else e}')
