"""Can a dense model fit 16 real-pixel scenes? Learning curves of NaLaFormer vs ResNet-18 backbones.

Writes the scenes (Fashion-MNIST items on crops of a photograph, COCO and ADE20K layouts), then trains each
backbone from scratch under the project's smallest det / seg config (same schedule, nothing frozen) with OpenMMLab's
own ``tools/train.py``, evaluating on the same scenes every ``--eval-every`` iterations (docs/dense_fit.md). Writes
``OUT.json`` (losses, metrics per evaluation, wall time) and ``OUT.png``; ``--backbone-options KEY=VALUE ...`` change
the NaLaFormer backbone (e.g. ``attn_types=nala``)::

    python3 tools/analysis/study.py dense det --backbones nalaformer_xt resnet18 --iters 300 --out docs/dense_fit_det
    python3 tools/analysis/study.py dense seg --backbones nalaformer_xt resnet18 --iters 300 --out docs/dense_fit_seg
"""
import argparse
import importlib
import json
import shlex
import shutil
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

from ...datasets import CLASSES, write_scenes
from ...errors import ConfigError
from ..machine import CHECKOUT
from ..models import ModelSpec, create_model
from ..plots import panels, save_figure
from ..results import write_report
from .runs import read_scalars, run_tool

CONFIGS = {
    'det': CHECKOUT / 'configs' / 'coco' / 'mask-rcnn_nalaformer-xt_fpn_1x_coco.py',
    'seg': CHECKOUT / 'configs' / 'ade20k' / 'upernet_nalaformer-xt_8xb2-160k_ade20k-512x512.py',
}
METRICS = {'det': ('coco/bbox_mAP', 'coco/segm_mAP'), 'seg': ('mIoU',)}
_RESNET18 = dict(depth=18, out_indices=(0, 1, 2, 3), frozen_stages=-1, norm_eval=False, style='pytorch',
                 norm_cfg=dict(type='BN', requires_grad=True), init_cfg=None)
RESNET18 = {  # from scratch, BatchNorm trained, nothing frozen: as the NaLaFormer backbone is run here
    'det': dict(type='mmdet.ResNet', **_RESNET18),
    'seg': dict(type='mmseg.ResNetV1c', **_RESNET18, dilations=(1, 1, 1, 1), strides=(1, 2, 2, 2),
                contract_dilation=True),
}
RESNET18_CHANNELS = [64, 128, 256, 512]
# the arguments a result records
SETTINGS = ('iters', 'eval_every', 'batch', 'lr', 'warmup', 'images', 'size', 'head_channels', 'cfg_options')


def _model_overrides(task: str, backbone: str, options: Dict, size: int, head_channels: Optional[int]) -> Dict:
    """model.* overrides: ``backbone`` (from scratch) under the config's neck and heads, the scenes' classes and
    size, and with ``head_channels`` the width of the neck and heads (the configs: 256, UperNet 512)."""
    if backbone == 'resnet18':
        channels, model = RESNET18_CHANNELS, dict(backbone=dict(_delete_=True, **RESNET18[task]))
    else:
        wrapper_args = {k: options[k] for k in ('frozen_stages', 'norm_eval', 'out_norms') if k in options}
        model_args = {k: v for k, v in options.items() if k not in wrapper_args}
        channels = create_model(ModelSpec(backbone, model_args), features_only=True).feature_info.channels()
        model = dict(backbone=dict(arch=backbone, init_cfg=None, **{'norm_eval': False, 'frozen_stages': -1,
                                                                     **wrapper_args}, **model_args))
    c, n = head_channels or 0, len(CLASSES)
    if task == 'det':
        model.update(neck=dict(in_channels=channels),
                     roi_head=dict(bbox_head=dict(num_classes=n), mask_head=dict(num_classes=n)))
        width = dict(neck=dict(out_channels=c), rpn_head=dict(in_channels=c, feat_channels=c),
                     roi_head=dict(bbox_roi_extractor=dict(out_channels=c), mask_roi_extractor=dict(out_channels=c),
                                   bbox_head=dict(in_channels=c, fc_out_channels=4 * c),
                                   mask_head=dict(in_channels=c, conv_out_channels=c)))
    else:  # the classes: background + the items
        model.update(decode_head=dict(in_channels=channels, num_classes=n + 1),
                     auxiliary_head=dict(in_channels=channels[2], num_classes=n + 1),
                     data_preprocessor=dict(size=(size, size)))
        width = dict(decode_head=dict(channels=c), auxiliary_head=dict(channels=c // 2))
    return _merge(model, width) if head_channels else model


def _merge(a: Dict, b: Dict) -> Dict:
    out = dict(a)
    for key, value in b.items():
        out[key] = _merge(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


def _dataset(task: str, root: Path, split: str, pipeline: List[Dict]) -> Dict:
    """A loader's dataset: the scenes under ``root`` (COCO: train2017 to train on, val2017 to evaluate)."""
    if task == 'seg':
        return dict(data_root=str(root), pipeline=pipeline)
    name = 'train' if split == 'train' else 'val'
    return dict(data_root=str(root), metainfo=dict(classes=CLASSES), ann_file=f'annotations/instances_{name}2017.json',
                data_prefix=dict(img=f'{name}2017/'), pipeline=pipeline)


def _pipelines(task: str, size: int) -> Tuple[List[Dict], List[Dict]]:
    """The train and test pipelines at the scenes' own size (a Resize to it records the scale factor the heads read):
    the configs' rescaling, cropping and photometric distortion are left out so that both backbones fit exactly
    the images they are evaluated on."""
    load, resize = dict(type='LoadImageFromFile'), dict(type='Resize', scale=(size, size), keep_ratio=True)
    if task == 'det':
        labels, pack = dict(type='LoadAnnotations', with_bbox=True, with_mask=True), dict(type='PackDetInputs')
        test_pack = dict(pack, meta_keys=('img_id', 'img_path', 'ori_shape', 'img_shape', 'scale_factor'))
    else:
        labels, pack = dict(type='LoadAnnotations', reduce_zero_label=True), dict(type='PackSegInputs')
        test_pack = pack
    return [load, labels, resize, dict(type='RandomFlip', prob=0.5), pack], [load, resize, labels, test_pack]


def fit_config(task: str, backbone: str, args: argparse.Namespace, options: Dict) -> Path:
    """Write and return a config that inherits the project's config and changes only data, backbone,
    schedule (and with ``--head-channels`` the heads' width)."""
    root = args.work_dir / 'scenes' / ('coco' if task == 'det' else 'ade/ADEChallengeData2016')
    model = _model_overrides(task, backbone, options, args.size, args.head_channels)
    entries = dict(
        model=model,
        train_cfg=dict(_delete_=True, type='IterBasedTrainLoop', max_iters=args.iters, val_interval=args.eval_every),
        param_scheduler=[dict(type='LinearLR', start_factor=1e-3, by_epoch=False, begin=0, end=args.warmup)],
        log_processor=dict(by_epoch=False, window_size=1),
        default_hooks=dict(logger=dict(interval=1, log_metric_by_epoch=False),  # metrics at their iteration
                           checkpoint=dict(by_epoch=False, interval=args.iters, max_keep_ckpts=1)),
        randomness=dict(seed=0),
        optim_wrapper=dict(optimizer=dict(lr=args.lr)))
    if task == 'det':
        entries['val_evaluator'] = entries['test_evaluator'] = dict(
            ann_file=str(root / 'annotations' / 'instances_val2017.json'))
    train, test = _pipelines(task, args.size)
    for split in ('train', 'val', 'test'):
        entries[f'{split}_dataloader'] = dict(
            batch_size=args.batch if split == 'train' else 1, num_workers=0, persistent_workers=False,
            # an infinite sampler: mmengine pauses 2 s at each epoch end otherwise
            **(dict(sampler=dict(type='InfiniteSampler', shuffle=True)) if split == 'train' else {}),
            dataset=_dataset(task, root, split, train if split == 'train' else test))
    config = args.work_dir / f'{task}_{backbone}' / f'{task}_{backbone}.py'
    config.parent.mkdir(parents=True, exist_ok=True)
    text = [f'_base_ = [{str(CONFIGS[task])!r}]'] + [f'{key} = {value!r}' for key, value in entries.items()]
    config.write_text('\n'.join(text) + '\n')
    return config


def openmmlab_train_script(task: str) -> Path:
    package = importlib.import_module('mmdet' if task == 'det' else 'mmseg')
    return Path(package.__file__).parent / '.mim' / 'tools' / 'train.py'


def read_curves(work_dir: Path, task: str) -> Dict:
    """Per-iteration losses and the metrics of each evaluation from mmengine's scalars.json."""
    rows = read_scalars(work_dir)
    losses = [{k: v for k, v in row.items() if k == 'step' or k.startswith(('loss', 'acc'))}
              for row in rows if 'loss' in row]
    metrics = [{'step': row['step'], **{m: row[m] for m in METRICS[task]}} for row in rows if METRICS[task][0] in row]
    return dict(losses=losses, metrics=metrics)


def run_one(task: str, backbone: str, args: argparse.Namespace, options: Dict) -> Dict:
    work_dir = args.work_dir / f'{task}_{backbone}'
    shutil.rmtree(work_dir, ignore_errors=True)  # one run's logs per folder
    config = fit_config(task, backbone, args, options)
    print(f'[{task} {backbone}] training (log: {work_dir / "train.log"})', flush=True)
    start = time.perf_counter()
    run_tool(openmmlab_train_script(task), [str(config), '--work-dir', str(work_dir),
                                            *(['--cfg-options', *args.cfg_options] if args.cfg_options else [])],
             work_dir / 'train.log')
    seconds = time.perf_counter() - start
    curves = read_curves(work_dir, task)
    final = curves['metrics'][-1]
    print(f'[{task} {backbone}] {seconds:.0f} s, final ' + ', '.join(f'{k} {final[k]}' for k in METRICS[task]),
          flush=True)
    return dict(backbone=backbone, options=options if backbone != 'resnet18' else {}, seconds=seconds,
                config=str(config), **curves)


def plot(results: Dict, path: Path) -> None:
    metrics = METRICS[results['task']]
    fig, [axes] = panels(1, 1 + len(metrics), 5, 3.6)
    for run in results['runs']:
        label = run['backbone'] + ''.join(f' {k}={v}' for k, v in run['options'].items())
        axes[0].plot([r['step'] for r in run['losses']], [r['loss'] for r in run['losses']], label=label, lw=1)
        for ax, metric in zip(axes[1:], metrics):
            ax.plot([r['step'] for r in run['metrics']], [r[metric] for r in run['metrics']], 'o-', label=label)
    axes[0].set(title='training loss', xlabel='iteration', yscale='log')
    for ax, metric in zip(axes[1:], metrics):
        ax.set(title=f'{metric} on the training scenes', xlabel='iteration')
    axes[-1].legend(fontsize=7)
    save_figure(fig, path)


def key_value(text: str) -> Tuple[str, Any]:
    """An argument ``KEY=VALUE`` as (key, value), the value read as JSON, else the string."""
    key, sep, value = text.partition('=')
    if not sep:
        raise argparse.ArgumentTypeError(f'takes KEY=VALUE, got {text!r}')
    try:
        return key, json.loads(value)
    except json.JSONDecodeError:
        return key, value


def add_arguments(parser: argparse.ArgumentParser):
    parser.add_argument('task', choices=sorted(CONFIGS))
    parser.add_argument('--backbones', nargs='+', default=['nalaformer_xt', 'resnet18'],
                        help="timm names of the project's models, or resnet18")
    parser.add_argument('--backbone-options', nargs='*', type=key_value, default=[], metavar='KEY=VALUE',
                        help='keyword arguments of the NaLaFormer backbone (values as JSON, else strings)')
    for flag, default in (('--iters', 300), ('--eval-every', 50), ('--batch', 4), ('--images', 16)):
        parser.add_argument(flag, type=int, default=default)
    parser.add_argument('--lr', type=float, default=5e-4)
    parser.add_argument('--warmup', type=int, default=50, help='iterations of linear warm-up')
    parser.add_argument('--size', type=int, default=256, help='side of the square scenes')
    parser.add_argument('--head-channels', type=int, default=None,
                        help="width of the neck and heads (default: the config's; smaller is faster)")
    parser.add_argument('--cfg-options', nargs='+', default=[], metavar='KEY=VALUE',
                        help='passed to every run\'s tools/train.py (e.g. optim_wrapper.clip_grad.max_norm=1.0)')
    parser.add_argument('--work-dir', type=Path, default=CHECKOUT / 'work_dirs' / 'dense_fit')
    parser.add_argument('--out', type=Path, default=None, help='OUT.json and OUT.png (default: WORK_DIR/TASK)')
    parser.add_argument('--combine', nargs='+', type=Path, default=None, metavar='JSON',
                        help='no training: merge the runs of these result files (same task and schedule) into OUT')


def main(args: argparse.Namespace) -> int:
    out = args.out or args.work_dir / args.task
    if args.combine:  # runs made separately (e.g. one backbone per core) into one JSON and plot
        results = [json.loads(Path(p).read_text()) for p in args.combine]
        settings = {k: v for k, v in results[0].items() if k not in ('runs', 'command')}
        differing = sorted({k for r in results[1:] for k, v in settings.items() if k in r and r[k] != v})
        if differing:
            raise ConfigError(f'--combine: runs differ in {differing}; combine runs of one schedule only')
        results = dict(settings, commands=[r['command'] for r in results],
                       runs=[run for r in results for run in r['runs']])
    else:
        write_scenes(args.work_dir / 'scenes', num_images=args.images, size=args.size)
        runs = [run_one(args.task, backbone, args, dict(args.backbone_options)) for backbone in args.backbones]
        results = dict(task=args.task, config=str(CONFIGS[args.task].relative_to(CHECKOUT)),
                       **{k: getattr(args, k) for k in SETTINGS},
                       command=shlex.join(['python3', 'tools/analysis/study.py', *args.argv]), runs=runs)
    print(write_report(results, out.with_suffix('.json'), plot, out.with_suffix('.png')))
    return 0
