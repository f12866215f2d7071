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
from typing import Dict, List

from ...datasets import CLASSES, write_scenes
from ...errors import ConfigError
from ..machine import CHECKOUT
from ..models import ModelSpec, create_model
from ..plots import panels, save_figure
from ..results import write_json
from .runs import run_tool

CONFIGS = {
    'det': CHECKOUT / 'configs' / 'coco' / 'mask-rcnn_nalaformer-xt_fpn_1x_coco.py',
    'seg': CHECKOUT / 'configs' / 'ade20k' / 'upernet_nalaformer-xt_8xb2-160k_ade20k-512x512.py',
}
METRICS = {'det': ('coco/bbox_mAP', 'coco/segm_mAP'), 'seg': ('mIoU',)}
RESNET18 = {  # from scratch, BatchNorm trained, nothing frozen: as the NaLaFormer backbone is run here
    'det': dict(type='mmdet.ResNet', depth=18, out_indices=(0, 1, 2, 3), frozen_stages=-1, norm_eval=False,
                norm_cfg=dict(type='BN', requires_grad=True), style='pytorch', init_cfg=None),
    'seg': dict(type='mmseg.ResNetV1c', depth=18, out_indices=(0, 1, 2, 3), frozen_stages=-1, norm_eval=False,
                norm_cfg=dict(type='BN', requires_grad=True), style='pytorch', init_cfg=None,
                dilations=(1, 1, 1, 1), strides=(1, 2, 2, 2), contract_dilation=True),
}
RESNET18_CHANNELS = [64, 128, 256, 512]


def _backbone_overrides(task: str, backbone: str, options: Dict) -> Dict:
    """model.* overrides that put ``backbone`` (from scratch) under the config's neck/heads."""
    if backbone == 'resnet18':
        channels = RESNET18_CHANNELS
        model = dict(backbone=dict(_delete_=True, **RESNET18[task]))
    else:
        wrapper_args = {k: options[k] for k in ('frozen_stages', 'norm_eval', 'out_norms') if k in options}
        model_args = {k: v for k, v in options.items() if k not in wrapper_args}
        channels = create_model(ModelSpec(backbone, model_args), features_only=True).feature_info.channels()
        model = dict(backbone=dict(arch=backbone, init_cfg=None, **{'norm_eval': False, 'frozen_stages': -1,
                                                                     **wrapper_args}, **model_args))
    if task == 'det':
        model['neck'] = dict(in_channels=channels)
    else:
        model['decode_head'] = dict(in_channels=channels)
        model['auxiliary_head'] = dict(in_channels=channels[2])
    return model


def _narrow_heads(task: str, channels: int) -> Dict:
    """model.* overrides giving the neck and heads ``channels`` channels (the configs: 256, UperNet 512)."""
    if task == 'det':
        return dict(neck=dict(out_channels=channels), rpn_head=dict(in_channels=channels, feat_channels=channels),
                    roi_head=dict(bbox_roi_extractor=dict(out_channels=channels),
                                  bbox_head=dict(in_channels=channels, fc_out_channels=4 * channels),
                                  mask_roi_extractor=dict(out_channels=channels),
                                  mask_head=dict(in_channels=channels, conv_out_channels=channels)))
    return dict(decode_head=dict(channels=channels), auxiliary_head=dict(channels=channels // 2))


def _merge(a: Dict, b: Dict) -> Dict:
    out = dict(a)
    for key, value in b.items():
        out[key] = _merge(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


def fit_config(task: str, backbone: str, args: argparse.Namespace, options: Dict) -> Path:
    """Write and return a config that inherits the project's config and changes only data, backbone,
    schedule (and with ``--head-channels`` the heads' width)."""
    data_root, work_dir = args.work_dir / 'scenes', args.work_dir / f'{task}_{backbone}'
    iters, eval_every, batch, lr, warmup, size = args.iters, args.eval_every, args.batch, args.lr, args.warmup, args.size
    model = _backbone_overrides(task, backbone, options)
    if args.head_channels:
        model = _merge(model, _narrow_heads(task, args.head_channels))
    schedule = dict(
        train_cfg=dict(_delete_=True, type='IterBasedTrainLoop', max_iters=iters, val_interval=eval_every),
        param_scheduler=[dict(type='LinearLR', start_factor=1e-3, by_epoch=False, begin=0, end=warmup)],
        log_processor=dict(by_epoch=False, window_size=1),
        default_hooks=dict(logger=dict(interval=1, log_metric_by_epoch=False),  # metrics at their iteration
                           checkpoint=dict(by_epoch=False, interval=iters, max_keep_ckpts=1)),
        randomness=dict(seed=0),
        optim_wrapper=dict(optimizer=dict(lr=lr)))
    sampler = dict(type='InfiniteSampler', shuffle=True)  # mmengine pauses 2 s at each epoch end otherwise
    if task == 'det':
        model = _merge(model, dict(roi_head=dict(bbox_head=dict(num_classes=len(CLASSES)),
                                                 mask_head=dict(num_classes=len(CLASSES)))))
        root = data_root / 'coco'
        loaders = {split: dict(batch_size=batch if split == 'train' else 1, num_workers=0, persistent_workers=False,
                               **(dict(sampler=sampler) if split == 'train' else {}),
                               dataset=dict(data_root=str(root), metainfo=dict(classes=CLASSES),
                                            ann_file=f'annotations/instances_{"train" if split == "train" else "val"}2017.json',
                                            data_prefix=dict(img=f'{"train" if split == "train" else "val"}2017/')))
                   for split in ('train', 'val', 'test')}
        evaluator = dict(ann_file=str(root / 'annotations' / 'instances_val2017.json'))
        extra = dict(val_evaluator=evaluator, test_evaluator=evaluator)
    else:
        num_classes = len(CLASSES) + 1  # background + the items
        model['decode_head'].update(num_classes=num_classes)
        model['auxiliary_head'].update(num_classes=num_classes)
        model['data_preprocessor'] = dict(size=(size, size))
        root = data_root / 'ade' / 'ADEChallengeData2016'
        loaders = {split: dict(batch_size=batch if split == 'train' else 1, num_workers=0, persistent_workers=False,
                               **(dict(sampler=sampler) if split == 'train' else {}),
                               dataset=dict(data_root=str(root))) for split in ('train', 'val', 'test')}
        extra = {}
    text = [f'_base_ = [{str(CONFIGS[task])!r}]', f'model = {model!r}']
    for key, value in {**schedule, **extra}.items():
        text.append(f'{key} = {value!r}')
    for split, loader in loaders.items():
        text.append(f'{split}_dataloader = {loader!r}')
    config = work_dir / f'{task}_{backbone}.py'
    config.parent.mkdir(parents=True, exist_ok=True)
    config.write_text(_with_pipelines(task, '\n'.join(text), size) + '\n')
    return config


def _with_pipelines(task: str, text: str, size: int) -> str:
    """Append pipelines at the scenes' own size (a Resize to it records the scale factor the heads read):
    the configs' rescaling, cropping and photometric distortion are left out so that both backbones fit
    exactly the images they are evaluated on."""
    resize = dict(type='Resize', scale=(size, size), keep_ratio=True)
    if task == 'det':
        train = [dict(type='LoadImageFromFile'), dict(type='LoadAnnotations', with_bbox=True, with_mask=True), resize,
                 dict(type='RandomFlip', prob=0.5), dict(type='PackDetInputs')]
        test = [dict(type='LoadImageFromFile'), resize, dict(type='LoadAnnotations', with_bbox=True, with_mask=True),
                dict(type='PackDetInputs', meta_keys=('img_id', 'img_path', 'ori_shape', 'img_shape', 'scale_factor'))]
    else:
        train = [dict(type='LoadImageFromFile'), dict(type='LoadAnnotations', reduce_zero_label=True), resize,
                 dict(type='RandomFlip', prob=0.5), dict(type='PackSegInputs')]
        test = [dict(type='LoadImageFromFile'), resize, dict(type='LoadAnnotations', reduce_zero_label=True),
                dict(type='PackSegInputs')]
    lines = [text]
    for split, pipeline in (('train', train), ('val', test), ('test', test)):
        lines.append(f'{split}_dataloader["dataset"]["pipeline"] = {pipeline!r}')
    return '\n'.join(lines)


def openmmlab_train_script(task: str) -> Path:
    package = importlib.import_module('mmdet' if task == 'det' else 'mmseg')
    return Path(package.__file__).parent / '.mim' / 'tools' / 'train.py'


def read_curves(work_dir: Path, task: str) -> Dict:
    """Per-iteration losses and the metrics of each evaluation from mmengine's scalars.json."""
    [scalars] = work_dir.glob('*/vis_data/scalars.json')
    rows = [json.loads(line) for line in scalars.read_text().splitlines()]
    losses = [{k: v for k, v in row.items() if k == 'step' or k.startswith(('loss', 'acc'))}
              for row in rows if 'loss' in row]
    metric_rows = [row for row in rows if METRICS[task][0] in row]
    metrics = [{'step': row['step'], **{m: row[m] for m in METRICS[task]}} for row in metric_rows]
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


def plot(results: Dict, task: str, path: Path) -> None:
    metrics = METRICS[task]
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


def parse_value(text: str):
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def add_arguments(parser: argparse.ArgumentParser):
    parser.add_argument('task', choices=sorted(CONFIGS))
    parser.add_argument('--backbones', nargs='+', default=['nalaformer_xt', 'resnet18'],
                        help="timm names of the project's models, or resnet18")
    parser.add_argument('--backbone-options', nargs='*', default=[], metavar='KEY=VALUE',
                        help='keyword arguments of the NaLaFormer backbone (values as JSON, else strings)')
    parser.add_argument('--iters', type=int, default=300)
    parser.add_argument('--eval-every', type=int, default=50)
    parser.add_argument('--batch', type=int, default=4)
    parser.add_argument('--lr', type=float, default=5e-4)
    parser.add_argument('--warmup', type=int, default=50, help='iterations of linear warm-up')
    parser.add_argument('--images', type=int, default=16)
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
        for other in results[1:]:
            differing = [k for k, v in settings.items() if k in other and other[k] != v]
            if differing:
                raise ConfigError(f'--combine: runs differ in {differing}; combine runs of one schedule only')
        results = dict(settings, commands=[r['command'] for r in results], runs=[run for r in results for run in r['runs']])
    else:
        options = {}
        for item in args.backbone_options:
            key, sep, value = item.partition('=')
            if not sep:
                raise ConfigError(f'--backbone-options takes KEY=VALUE, got {item!r}')
            options[key] = parse_value(value)
        write_scenes(args.work_dir / 'scenes', num_images=args.images, size=args.size)
        runs: List[Dict] = [run_one(args.task, backbone, args, options) for backbone in args.backbones]
        results = dict(task=args.task, config=str(CONFIGS[args.task].relative_to(CHECKOUT)), iters=args.iters,
                       eval_every=args.eval_every, batch=args.batch, lr=args.lr, warmup=args.warmup,
                       images=args.images, size=args.size, head_channels=args.head_channels,
                       cfg_options=args.cfg_options,
                       command=shlex.join(['python3', 'tools/analysis/study.py', *args.argv]), runs=runs)
    write_json(out.with_suffix('.json'), results)
    plot(results, args.task, out.with_suffix('.png'))
    print(f'wrote {out.with_suffix(".json")} and {out.with_suffix(".png")}')
    return 0
