"""The chain of docs/journey.md, run with its commands at pico scale: ImageNet-style pretraining with tools/train.py,
the backbone file written by tools/convert_checkpoint.py (EMA weights), then UperNet (ADE20K), Mask R-CNN (COCO) and
a fine-tune on a new ImageFolder started from it with the documented keys; and the one-line errors of a missing or
wrong starting checkpoint, given before the work dir is written."""
import importlib.util
import re
import shutil
from pathlib import Path

import pytest
import timm
import torch
from mmdet.datasets import CocoDataset

from nalaformer.checkpoint import save_state_dict
from nalaformer.errors import run_tool
from tool_runs import run_script, write_imagefolder, write_tiny_ade, write_tiny_coco

ROOT = Path(__file__).resolve().parents[1]
PRETRAIN = ROOT / 'configs' / 'nalaformer' / 'nalaformer-t_8xb128_in1k.py'
FINETUNE = ROOT / 'configs' / 'nalaformer' / 'nalaformer-t_in1k-pre_1xb64-50e_imagefolder.py'
UPERNET = ROOT / 'configs' / 'ade20k' / 'upernet_nalaformer-t_8xb2-160k_ade20k-512x512.py'
MASK_RCNN = ROOT / 'configs' / 'coco' / 'mask-rcnn_nalaformer-t_fpn_1x_coco.py'
PICO = dict(embed_dims='[16,32,48,64]', depths='[1,1,1,1]', num_heads='[1,2,3,4]')
LOADERS = ('train_dataloader', 'val_dataloader', 'test_dataloader')
BN_STATISTICS = ('running_mean', 'running_var', 'num_batches_tracked')  # updated by every training forward pass


def pico(prefix):
    """The pico NaLaFormer (one block per stage) at the config key ``prefix`` ('model.', 'model.backbone.')."""
    return [f'{prefix}{k}={v}' for k, v in PICO.items()]


def classification_options(data_root, num_classes, batch_size=6):
    """The ImageNet-style configs on ``data_root`` at 32 px, in the main process, one epoch."""
    opts = []
    for loader in LOADERS:
        opts += [f'{loader}.dataset.data_root={data_root}', f'{loader}.num_workers=0',
                 f'{loader}.persistent_workers=False', f'{loader}.pin_memory=False', f'{loader}.dataset.input_size=32',
                 f'{loader}.batch_size={batch_size}']
    return opts + [*pico('model.'), f'model.num_classes={num_classes}', 'model.head_hidden_size=32', 'train_cfg.max_epochs=1',
                   'default_hooks.logger.interval=1', 'log_processor.window_size=1', 'env_cfg.cudnn_benchmark=False']


def ade_options(data_root):
    """UperNet on the tiny ADE20K copy: 64x64 crops, narrow heads, 2 iterations of 2 images, validation on 1."""
    opts = []
    for loader in LOADERS:
        opts += [f'{loader}.dataset.data_root={data_root}', f'{loader}.num_workers=0',
                 f'{loader}.persistent_workers=False',
                 f'{loader}.dataset.indices={4 if loader == "train_dataloader" else 1}']
    return opts + [
        'train_dataloader.batch_size=2', 'train_dataloader.dataset.pipeline.2.scale=(128,64)',
        'train_dataloader.dataset.pipeline.3.crop_size=(64,64)', 'model.data_preprocessor.size=(64,64)',
        'val_dataloader.dataset.pipeline.1.scale=(128,64)', 'test_dataloader.dataset.pipeline.1.scale=(128,64)',
        *pico('model.backbone.'), 'model.decode_head.in_channels=[16,32,48,64]', 'model.decode_head.channels=16',
        'model.auxiliary_head.in_channels=48', 'model.auxiliary_head.channels=16', 'train_cfg.max_iters=2',
        'train_cfg.val_interval=2', 'default_hooks.checkpoint.interval=2', 'env_cfg.cudnn_benchmark=False']


COCO_HEADS = {'model.neck.in_channels': '[16,32,48,64]', 'model.neck.out_channels': 32,
              'model.rpn_head.in_channels': 32, 'model.rpn_head.feat_channels': 32,
              'model.roi_head.bbox_roi_extractor.out_channels': 32, 'model.roi_head.bbox_head.in_channels': 32,
              'model.roi_head.bbox_head.fc_out_channels': 64, 'model.roi_head.mask_roi_extractor.out_channels': 32,
              'model.roi_head.mask_head.in_channels': 32, 'model.roi_head.mask_head.conv_out_channels': 32,
              'model.test_cfg.rcnn.score_thr': 0.0}


def coco_options(data_root):
    """Mask R-CNN on the tiny COCO copy at 128x96, narrow heads, one epoch of 4 images, the validation on 2."""
    opts = []
    for loader in LOADERS:
        resize = 2 if loader == 'train_dataloader' else 1  # index of Resize in mmdet's coco pipelines
        opts += [f'{loader}.dataset.data_root={data_root}', f'{loader}.num_workers=0',
                 f'{loader}.persistent_workers=False', f'{loader}.dataset.pipeline.{resize}.scale=(128,96)',
                 f'{loader}.dataset.indices={4 if loader == "train_dataloader" else 2}']
    opts += [f'{split}_evaluator.ann_file={data_root}/annotations/instances_val2017.json' for split in ('val', 'test')]
    return opts + ['train_dataloader.batch_size=2', *pico('model.backbone.'), 'train_cfg.max_epochs=1',
                   *[f'{k}={v}' for k, v in COCO_HEADS.items()]]


def train(config, work_dir, *options):
    """``python3 tools/train.py CONFIG --work-dir W --cfg-options ...``, checked; its output (stdout + stderr)."""
    result = run_script(ROOT / 'tools' / 'train.py', config, '--work-dir', work_dir, '--cfg-options', *options)
    return result.stdout + result.stderr


def load_line(output, key):
    """The one line naming what the run loaded under ``key``: (file, weights, matched, missing, unexpected)."""
    [match] = re.findall(rf'{re.escape(key)}: loaded (\S+) \((.+?)\): (\d+) keys matched, (\d+) missing(?: \(.*?\))?, '
                         rf'(\d+) unexpected', output)
    return match[0], match[1], int(match[2]), int(match[3]), int(match[4])


def write_new_imagefolder(root):
    """Another ImageFolder dataset: two of the classes of :func:`write_imagefolder`."""
    write_imagefolder(root)
    for split in ('train', 'val'):
        shutil.rmtree(root / split / 'class2')
    return root


def runner_weights(path, prefix, ema=False):
    """The timm model's tensors in a runner checkpoint (raw, or the EMA copy), under ``prefix``, with own keys."""
    checkpoint = torch.load(path, map_location='cpu', weights_only=True)
    state_dict, prefix = ((checkpoint['ema_state_dict'], f'module.{prefix}') if ema else
                          (checkpoint['state_dict'], prefix))
    return {k[len(prefix):]: v for k, v in state_dict.items() if k.startswith(prefix)}


def assert_same(started, pretrained, skip=()):
    """Every tensor of ``started`` (except names ending in ``skip``) equals ``pretrained``'s, exactly."""
    compared = [k for k in started if not k.endswith(skip)]
    assert len(compared) > 40
    for key in compared:
        torch.testing.assert_close(started[key], pretrained[key], rtol=0, atol=0, msg=key)


# ---------------------------------------------------------------- the chain, end to end (slow)

@pytest.mark.slow
def test_pretraining_becomes_the_backbone_of_every_downstream_run(tmp_path):
    images, ade, coco = tmp_path / 'imagenet', tmp_path / 'ADEChallengeData2016', tmp_path / 'coco'
    write_imagefolder(images)  # 3 classes
    write_tiny_ade(ade)
    write_tiny_coco(coco, CocoDataset.METAINFO['classes'])

    # 1. ImageNet-style pretraining: the runner checkpoint holds raw and EMA weights
    pre = tmp_path / 'work_dirs' / 'pretrain'
    train(PRETRAIN, pre, *classification_options(images, 3), 'param_scheduler=[]')
    raw, ema = runner_weights(pre / 'epoch_1.pth', 'model.'), runner_weights(pre / 'epoch_1.pth', 'model.', ema=True)
    assert raw.keys() == ema.keys() and any(not torch.equal(raw[k], ema[k]) for k in raw)

    # 2. the backbone file: the EMA weights (the default where the run kept them), recording where they came from
    backbone_file = tmp_path / 'checkpoints' / 'nalaformer_t_in1k.pth'
    converted = run_script(ROOT / 'tools' / 'convert_checkpoint.py', pre / 'epoch_1.pth', backbone_file)
    assert f'EMA weights of {pre / "epoch_1.pth"}' in converted.stdout
    weights = f'EMA weights of {pre / "epoch_1.pth"}'

    # 3. UperNet on ADE20K, the backbone frozen so that its weights after training are those it started from
    seg = tmp_path / 'work_dirs' / 'upernet'
    out = train(UPERNET, seg, f'model.backbone.init_cfg.checkpoint={backbone_file}', 'model.backbone.frozen_stages=4',
                *ade_options(ade))
    path, taken, matched, missing, unexpected = load_line(out, 'model.backbone.init_cfg.checkpoint')
    assert (path, taken, missing) == (str(backbone_file), weights, 0)
    started = runner_weights(seg / 'iter_2.pth', 'backbone.model.model.')
    assert matched == len(started)
    assert unexpected == len(set(ema) - set(started) - {'head.weight', 'head.bias'})  # proj, norm: not in a backbone
    assert_same(started, ema)
    assert any(not torch.equal(started[k], raw[k]) for k in started)  # the EMA weights, not the raw ones

    # 4. Mask R-CNN on COCO from the same file
    det = tmp_path / 'work_dirs' / 'mask_rcnn'
    out = train(MASK_RCNN, det, f'model.backbone.init_cfg.checkpoint={backbone_file}', 'model.backbone.frozen_stages=4',
                *coco_options(coco))
    assert load_line(out, 'model.backbone.init_cfg.checkpoint') == (str(backbone_file), weights, matched, 0, unexpected)
    assert_same(runner_weights(det / 'epoch_1.pth', 'backbone.model.model.'), ema)

    # 5. fine-tuning on a new ImageFolder of 2 classes (a new head); learning rate 0 keeps the starting weights
    tuned = tmp_path / 'work_dirs' / 'finetune'
    out = train(FINETUNE, tuned, f'model.pretrained={backbone_file}',
                *classification_options(write_new_imagefolder(tmp_path / 'my_dataset'), 2), 'optim_wrapper.optimizer.lr=0.0')
    assert load_line(out, 'model.pretrained') == (str(backbone_file), weights, len(ema) - 2, 2, 0)  # head.weight, .bias
    started = runner_weights(tuned / 'epoch_1.pth', 'model.')
    assert started['head.weight'].shape[0] == 2
    assert_same(started, ema, skip=(*BN_STATISTICS, 'head.weight', 'head.bias'))


# ---------------------------------------------------------------- a missing or wrong starting checkpoint (fast)

def load_tool(name):
    spec = importlib.util.spec_from_file_location(f'journey_{name}', ROOT / 'tools' / f'{name}.py')
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope='module')
def train_tool():
    return load_tool('train')


@pytest.fixture(scope='module')
def data(tmp_path_factory):
    """The tiny ImageFolder and ADE20K copies."""
    root = tmp_path_factory.mktemp('journey_data')
    write_imagefolder(root / 'my_dataset')
    write_tiny_ade(root / 'ADEChallengeData2016')
    return root


def pico_file(path, **kwargs):
    """A converted-style file of a pico NaLaFormer built with ``kwargs`` over the pico architecture."""
    args = {**dict(embed_dims=[16, 32, 48, 64], depths=[1, 1, 1, 1], num_heads=[1, 2, 3, 4], head_hidden_size=32,
                   num_classes=3), **kwargs}
    save_state_dict(timm.create_model('nalaformer_t', **args).state_dict(), path)
    return path


def the_error(err):
    """The one ``error:`` line a tool printed."""
    [line] = [line for line in err.splitlines() if line.startswith('error: ')]
    return line


def test_a_missing_backbone_file_is_one_line_naming_the_key_before_the_work_dir(data, tmp_path):
    missing, work = tmp_path / 'checkpoints' / 'nalaformer_t_in1k.pth', tmp_path / 'work'
    result = run_script(ROOT / 'tools' / 'train.py', UPERNET, '--work-dir', work, '--cfg-options',
                        f'model.backbone.init_cfg.checkpoint={missing}', *ade_options(data / 'ADEChallengeData2016'),
                        check=False)
    assert result.returncode == 2
    assert 'Traceback' not in result.stderr and len(result.stderr.split('error: ')) == 2  # one line, no traceback
    assert the_error(result.stderr).startswith(f'error: model.backbone.init_cfg.checkpoint: checkpoint {missing} does '
                                               f'not exist; write it from an ImageNet run with python3 '
                                               f'tools/convert_checkpoint.py work_dirs/<config>/epoch_<N>.pth {missing} '
                                               f'(docs/journey.md)')
    assert not work.exists()


def wrong_files(tmp_path):
    """(what, the file, the text the error must hold) for files that cannot start the pico model."""
    text = tmp_path / 'notes.pth'
    text.write_text('not weights')
    return {
        'another variant': (pico_file(tmp_path / 'wide.pth', embed_dims=[32, 64, 96, 128]),
                            'checkpoint is for another architecture'),
        'not a checkpoint': (text, 'is not a checkpoint: it is a text file'),
        'no EMA weights': (pico_file(tmp_path / 'raw.pth'), 'has no EMA weights'),
    }


@pytest.mark.parametrize('what', ['another variant', 'not a checkpoint', 'no EMA weights'])
@pytest.mark.parametrize('task', ['upernet', 'finetune'])
def test_a_wrong_starting_file_is_one_line_naming_the_key_before_the_work_dir(what, task, train_tool, data, tmp_path,
                                                                              capsys):
    path, message = wrong_files(tmp_path)[what]
    ema = what == 'no EMA weights'
    if task == 'upernet':
        key, config = 'model.backbone.init_cfg.checkpoint', UPERNET
        options = [f'{key}={path}', *ade_options(data / 'ADEChallengeData2016')]
        options += ['model.backbone.init_cfg.ema=True'] if ema else []
    else:
        key, config = 'model.pretrained', FINETUNE
        options = [f'{key}={path}', *classification_options(data / 'my_dataset', 3)]
        options += ['model.pretrained_ema=True'] if ema else []
    work = tmp_path / 'work'
    assert run_tool(train_tool.main, [str(config), '--work-dir', str(work), '--cfg-options', *options]) == 2
    line = the_error(capsys.readouterr().err)
    assert line.startswith(f'error: {key}: ') and message in line and f'set --cfg-options {key}=PATH' in line
    assert not work.exists()


def test_a_missing_load_from_is_named(train_tool, data, tmp_path, capsys):
    work, missing = tmp_path / 'work', tmp_path / 'detector.pth'
    options = [f'load_from={missing}', 'model.backbone.init_cfg=None', *ade_options(data / 'ADEChallengeData2016')]
    assert run_tool(train_tool.main, [str(UPERNET), '--work-dir', str(work), '--cfg-options', *options]) == 2
    assert the_error(capsys.readouterr().err).startswith(f'error: load_from: checkpoint {missing} does not exist')
    assert not work.exists()
