"""Train any task (classification, segmentation, detection) from an mmengine config.

    python tools/train.py configs/nalaformer/nalaformer-t_8xb128_in1k.py
    python tools/train.py CONFIG --resume                 # from the last checkpoint in the work dir
    python tools/train.py CONFIG --work-dir W --overwrite # a new run where W holds another run's checkpoints
    python tools/train.py CONFIG --amp --cfg-options train_dataloader.batch_size=64
    torchrun --nproc_per_node 8 tools/train.py CONFIG --launcher pytorch   (or tools/dist_train.sh)
"""
import argparse
import sys
import warnings

import nalaformer.engine  # noqa: F401  (registers models, datasets, hooks, metrics, runner)
from nalaformer.engine import Preempted
from nalaformer.engine.launch import (
    apply_amp, apply_thread_policy, build_runner, check_dataset_files, finalize_config, load_config,
)
from nalaformer.engine.runner_options import add_runner_options
from nalaformer.engine.work_dir import prepare_work_dir
from nalaformer.errors import ConfigError, run_tool


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('config', help='config file')
    parser.add_argument('--work-dir', help='where logs and checkpoints go (default: work_dirs/<config name>)')
    parser.add_argument('--resume', nargs='?', const='auto', metavar='CKPT',
                        help='resume from CKPT, or from the latest checkpoint in the work dir when no path is given')
    parser.add_argument('--overwrite', action='store_true',
                        help='start a new run in a work dir that holds another run\'s checkpoints (they are deleted)')
    parser.add_argument('--amp', nargs='?', const='bfloat16', choices=['bfloat16', 'float16'],
                        help='mixed precision (attention math stays fp32); default bfloat16')
    parser.add_argument('--auto-scale-lr', action='store_true',
                        help='scale the lr by the total batch (processes x batch size x accumulation) / '
                             'auto_scale_lr.base_batch_size; the log says what it set')
    parser.add_argument('--wandb', metavar='PROJECT', help='also log to Weights & Biases (WANDB_MODE=offline works)')
    add_runner_options(parser)
    return parser.parse_args(argv)


def add_wandb(cfg, project: str) -> None:
    try:
        import wandb  # noqa: F401
    except ImportError:
        warnings.warn('--wandb given but wandb is not installed (pip install wandb); continuing without it')
        return
    cfg.visualizer.vis_backends.append(dict(type='WandbVisBackend', init_kwargs=dict(project=project)))


def main(argv=None):
    args = parse_args(argv)
    cfg = finalize_config(load_config(args.config, args.cfg_options), args.config, args.work_dir, args.launcher)
    if args.amp:
        apply_amp(cfg, args.amp)
    if args.auto_scale_lr:
        if not (cfg.get('auto_scale_lr') or {}).get('base_batch_size'):
            raise ConfigError('--auto-scale-lr: the config has no auto_scale_lr.base_batch_size (the total batch its '
                              'lr is for); add auto_scale_lr = dict(base_batch_size=N)')
        cfg.auto_scale_lr.enable = True
    if args.wandb:
        add_wandb(cfg, args.wandb)
    check_dataset_files(cfg, ('train', 'val'))
    prepare_work_dir(cfg, args.config, args.resume, args.overwrite)  # last check: with --overwrite it deletes
    threads = apply_thread_policy(cfg, args.threads)
    runner = build_runner(cfg)
    runner.logger.info(threads)
    runner.train()


if __name__ == '__main__':
    try:
        sys.exit(run_tool(main))  # what the user asked for is wrong: one line, exit code 2; bugs keep their traceback
    except Preempted as e:  # a checkpoint was written: exit as a signal-terminated process would
        print(e, file=sys.stderr)
        sys.exit(e.exit_code)
