"""Train any task (classification, super-resolution, segmentation, detection) from an mmengine config.

    python3 tools/train.py configs/nalaformer/nalaformer-t_8xb128_in1k.py
    python3 tools/train.py CONFIG --resume                 # from the last checkpoint in the work dir
    python3 tools/train.py CONFIG --work-dir W --overwrite # a new run where W holds another run's checkpoints
    python3 tools/train.py CONFIG --amp --cfg-options train_dataloader.batch_size=64
    python3 tools/train.py CONFIG --dry-run                # 3 iterations + a short validation on synthetic data (CPU)
    torchrun --nproc_per_node 8 tools/train.py CONFIG --launcher pytorch   (or tools/dist_train.sh)
"""
import argparse
import sys
import warnings

from nalaformer.engine import Preempted
from nalaformer.engine.dry_run import DryRun
from nalaformer.engine.launch import (
    apply_amp, apply_thread_policy, build_runner, check_dataset_files, check_starting_weights, finalize_config,
    load_config,
)
from nalaformer.engine.runner_options import add_runner_options
from nalaformer.engine.work_dir import check_work_dir, prepare_work_dir
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
    parser.add_argument('--dry-run', action='store_true',
                        help='before queueing a job: run the config as shipped for a few iterations and a short '
                             'validation on synthetic data in its layout, on the CPU in a temporary folder (kept '
                             'with --work-dir), and report the time per iteration and the peak memory')
    parser.add_argument('--dry-run-iters', type=int, default=3, metavar='N',
                        help='training iterations of --dry-run (default 3); it validates on as many batches, at most 2')
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
    if not args.dry_run:
        return train(args)
    if args.resume or args.overwrite:
        raise ConfigError('--dry-run starts a new run in a work dir of its own: leave out --resume and --overwrite')
    with DryRun(args.config, args.work_dir, iters=args.dry_run_iters, val_iters=min(args.dry_run_iters, 2)) as dry_run:
        return train(args, dry_run)


def train(args, dry_run=None):
    work_dir = dry_run.work_dir if dry_run else args.work_dir
    cfg = finalize_config(load_config(args.config, args.cfg_options), args.config, work_dir, args.launcher)
    if args.compile:
        cfg.compile = True
    if args.amp:
        apply_amp(cfg, args.amp)
    if args.auto_scale_lr:
        if not (cfg.get('auto_scale_lr') or {}).get('base_batch_size'):
            raise ConfigError('--auto-scale-lr: the config has no auto_scale_lr.base_batch_size (the total batch its '
                              'lr is for); add auto_scale_lr = dict(base_batch_size=N)')
        cfg.auto_scale_lr.enable = True
    if args.wandb:
        add_wandb(cfg, args.wandb)
    if dry_run:
        dry_run.rewrite(cfg)  # small batches, few iterations, synthetic data written in the config's layout
    check_work_dir(cfg.work_dir, cfg)  # a folder the run can write: named before the data are read
    check_dataset_files(cfg, ('train', 'val'))
    check_starting_weights(cfg)  # pretrained / init_cfg / load_from: named by their config key
    threads = apply_thread_policy(cfg, args.threads)  # a bad thread count is a config mistake: named before
    prepare_work_dir(cfg, args.config, args.resume, args.overwrite)  # last check: with --overwrite it deletes
    runner = build_runner(cfg)
    runner.logger.info(threads)
    if dry_run:
        dry_run.attach(runner)
    runner.train()
    if dry_run:
        dry_run.finish()


if __name__ == '__main__':
    try:
        sys.exit(run_tool(main))  # what the user asked for is wrong: one line, exit code 2; bugs keep their traceback
    except Preempted as e:  # a checkpoint was written: exit as a signal-terminated process would
        print(e, file=sys.stderr)
        sys.exit(e.exit_code)
