"""Evaluate a checkpoint with the config's test dataloader and evaluator (any task).

    python3 tools/test.py configs/nalaformer/nalaformer-t_8xb128_in1k.py work_dirs/.../best.pth [--ema]
    python3 tools/test.py CONFIG checkpoints/nalaformer_t_in1k.pth   # converted from a run (docs/journey.md)
    python3 tools/test.py configs/ade20k/CONFIG.py work_dirs/.../best_mIoU_iter_*.pth --tta --show-dir vis/

The checkpoint is read once, through nalaformer.checkpoint. Checkpoints written by tools/train.py
load into the model they were written from; other weights (the release's .pth, .safetensors,
converted files, timm folders) go through the model's checkpoint filter, which rejects other variants. ``--ema``
evaluates the checkpoint's EMA weights (an error if it has none). A checkpoint that records other
``attn_types`` / ``kernel_kwargs`` than the config's model fails, naming both, unless
``--accept-definition-change``. An ImageFolder test split must have the classes the checkpoint was
trained with (recorded by tools/train.py), else indices would shift. Outputs (``--out-json``,
``--show-dir``) are checked before the evaluation and written atomically; existing ones are replaced
only with ``--overwrite``.
"""
import argparse
import contextlib
import json
import os.path as osp
import sys

import numpy as np

import nalaformer.engine  # noqa: F401  (the runner core; a config imports its task plug-in)
from nalaformer.checkpoint import Checkpoint, load_checkpoint_into
from nalaformer.engine.launch import (
    apply_thread_policy, build_runner, check_dataset_files, finalize_config, load_config, model_spec, report_lines,
)
from nalaformer.engine.runner_options import add_runner_options
from nalaformer.engine.work_dir import check_work_dir
from nalaformer.errors import ConfigError, run_tool
from nalaformer.files import atomic_file, atomic_folder, check_file_destination, check_folder_destination


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('config', help='config file')
    parser.add_argument('checkpoint', help='checkpoint (.pth from tools/train.py, the release\'s .pth, .safetensors, '
                                           'a timm folder)')
    parser.add_argument('--work-dir', help='where logs go (default: work_dirs/<config name>)')
    parser.add_argument('--show-dir', help='write visualised predictions here (segmentation/detection)')
    parser.add_argument('--ema', action='store_true',
                        help='evaluate the EMA weights stored in the checkpoint (ours, timm\'s or the release\'s)')
    parser.add_argument('--accept-definition-change', action='store_true',
                        help='evaluate a checkpoint recorded with other attn_types / kernel_kwargs than the config')
    parser.add_argument('--tta', action='store_true',
                        help="test-time augmentation with the config's tta_pipeline and tta_model "
                             '(segmentation: scales 0.5-1.75 and flips)')
    parser.add_argument('--out-json', metavar='FILE', help='also write the metrics to FILE as JSON')
    parser.add_argument('--overwrite', action='store_true',
                        help='replace an existing --out-json file or a --show-dir folder that holds files')
    add_runner_options(parser)
    return parser.parse_args(argv)


def trained_classes(checkpoint: Checkpoint):
    """The class names a tools/train.py checkpoint was trained with (mmengine records the training dataset's
    metainfo), or None."""
    meta = checkpoint.content.get('meta')
    dataset_meta = meta.get('dataset_meta') if isinstance(meta, dict) else None
    return dataset_meta.get('classes') if isinstance(dataset_meta, dict) else None


def main(argv=None):
    args = parse_args(argv)
    cfg = finalize_config(load_config(args.config, args.cfg_options), args.config, args.work_dir, args.launcher)
    if args.compile:
        cfg.compile = True
    check_work_dir(cfg.work_dir, cfg)  # where the logs go
    if args.out_json:
        check_file_destination(args.out_json, args.overwrite, '--out-json', 'metrics.json',
                               inputs=(args.config, args.checkpoint))
    if args.show_dir:
        if 'visualization' not in (cfg.get('default_hooks') or {}):
            raise ConfigError(f'--show-dir: {args.config} draws no predictions (no default_hooks.visualization: '
                              f'segmentation and detection configs have one)')
        check_folder_destination(args.show_dir, args.overwrite, '--show-dir')
    checkpoint = Checkpoint.read(args.checkpoint)
    spec = model_spec(cfg)  # which part of the config is the timm model
    single_model = spec is not None and spec.prefix == 'model.'  # the wrapper is the whole model (no heads)
    if not (checkpoint.is_runner_checkpoint or single_model):
        raise ConfigError(f'{args.checkpoint} is not a checkpoint written by tools/train.py; for dense tasks load '
                          f'backbone weights through model.backbone.init_cfg and train/fine-tune first')
    # the weights come from the checkpoint alone: nothing the config would load on its own
    cfg.load_from = None
    for option in spec.weight_options if spec is not None else ():
        spec.part(cfg)[option] = None
    if args.tta:
        if not {'tta_model', 'tta_pipeline'} <= set(cfg):
            raise ConfigError('--tta: this config defines no tta_model and tta_pipeline')
        cfg.test_dataloader.dataset.pipeline = cfg.tta_pipeline
        cfg.model = dict(cfg.tta_model, module=cfg.model)
    check_dataset_files(cfg, ('test',), trained_classes(checkpoint), str(args.checkpoint))
    threads = apply_thread_policy(cfg, args.threads)  # a bad thread count is named before anything is written
    # visualisations go to a folder beside --show-dir that replaces it when the evaluation completes
    with atomic_folder(args.show_dir) if args.show_dir else contextlib.nullcontext() as show_dir:
        if show_dir and cfg.default_hooks.visualization.type.endswith('SegVisualizationHook'):
            # mmseg's hook draws every `interval`-th image through the visualizer: <show-dir>/vis_data/vis_image
            cfg.default_hooks.visualization.update(draw=True, interval=1)
            cfg.visualizer.save_dir = str(show_dir)
        elif show_dir:
            # absolute: mmdet's DetVisualizationHook joins a relative dir onto work_dir/timestamp at every iteration
            cfg.default_hooks.visualization.update(draw=True, test_out_dir=osp.abspath(show_dir))
        runner = build_runner(cfg)
        runner.logger.info(threads)
        load_checkpoint_into(runner.model, checkpoint, ema=args.ema,
                             accept_definition_change=args.accept_definition_change,
                             cfg_prefix=spec.prefix if spec is not None else 'model.')
        metrics = runner.test()
    print({k: round(float(v), 4) if isinstance(v, (float, np.floating)) else v for k, v in metrics.items()})
    for line in report_lines(cfg, metrics):  # e.g. super-resolution: one line per test set
        print(line)
    if args.out_json:
        with atomic_file(args.out_json) as tmp, open(tmp, 'w') as f:
            json.dump({k: float(v) if isinstance(v, (float, np.floating)) else v for k, v in metrics.items()}, f,
                      indent=1)
    return metrics


if __name__ == '__main__':
    sys.exit(run_tool(main))  # the arguments are wrong: one line, exit code 2; anything else keeps its traceback
