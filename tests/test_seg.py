"""Semantic segmentation with mmsegmentation: configs, the backbone, tiny end-to-end runs (CPU)."""
import argparse
import json
import re
from pathlib import Path

import mmseg
import pytest
import timm
import torch
from mmengine.config import Config
from PIL import Image

import nalaformer.dense  # noqa: F401  (registers NaLaBackbone in mmseg)
from nalaformer.dense import NaLaBackbone

from tool_runs import run_script, scene, train, write_tiny_ade

ROOT = Path(__file__).resolve().parents[1]
UPERNET = ROOT / 'configs' / 'ade20k' / 'upernet_nalaformer-t_8xb2-160k_ade20k-512x512.py'
CITYSCAPES = ROOT / 'configs' / 'cityscapes' / 'upernet_nalaformer-t_8xb2-80k_cityscapes-512x1024.py'
SEG_CONFIGS = sorted([*(ROOT / 'configs' / 'ade20k').glob('*.py'), *(ROOT / 'configs' / 'cityscapes').glob('*.py')])
DROP_PATH = {'nalaformer_xt': 0.1, 'nalaformer_t': 0.1, 'nalaformer_s': 0.15, 'nalaformer_b': 0.4}  # the release recipe
TINY = dict(embed_dims=[16, 32, 48, 64], depths=[1, 1, 1, 1], num_heads=[1, 2, 3, 4])


# ---------------------------------------------------------------- configs and backbone (fast)

@pytest.mark.parametrize('path', SEG_CONFIGS, ids=[p.name for p in SEG_CONFIGS])
def test_heads_fit_the_backbone_variant(path):
    cfg = Config.fromfile(str(path))
    model, backbone = cfg.model, cfg.model.backbone
    arch = backbone.arch
    assert arch in path.name.replace('-', '_'), (arch, path.name)
    assert backbone.drop_path_rate == DROP_PATH[arch]
    assert backbone.init_cfg == dict(type='Pretrained', checkpoint=f'checkpoints/{arch}_in1k.pth')
    with torch.device('meta'):
        channels = timm.create_model(arch, features_only=True).feature_info.channels()
    assert (model.neck if 'neck' in model else model.decode_head).in_channels == channels
    if 'auxiliary_head' in model:
        assert model.auxiliary_head.in_channels == channels[model.auxiliary_head.in_index]
    num_classes = 19 if 'cityscapes' in path.name else 150
    assert model.decode_head.num_classes == num_classes == model.get('auxiliary_head', model.decode_head).num_classes
    crop = (512, 1024) if 'cityscapes' in path.name else (512, 512)
    assert model.data_preprocessor.size == crop
    assert cfg.train_dataloader.batch_size == (4 if '8xb4' in path.name else 2)
    assert cfg.train_cfg.max_iters == 1000 * int(re.search(r'-(\d+)k_', path.name).group(1))
    assert cfg.optim_wrapper.optimizer.type == 'AdamW'
    assert cfg.tta_model.type == 'SegTTAModel' and cfg.tta_pipeline


def test_backbone_gives_four_strided_maps_for_odd_non_square_inputs():
    backbone = NaLaBackbone('nalaformer_t', **TINY).eval()
    x = torch.randn(2, 3, 97, 130)
    features = backbone(x)
    assert [tuple(f.shape) for f in features] == [
        (2, c, -(-97 // s), -(-130 // s)) for c, s in zip(TINY['embed_dims'], (4, 8, 16, 32))]
    with torch.autocast('cpu', dtype=torch.bfloat16):
        low = backbone(x)
    for f, f_low in zip(features, low):
        assert torch.isfinite(f_low).all()
        torch.testing.assert_close(f_low.float(), f, atol=0.2, rtol=0.05)


@pytest.mark.parametrize('layout', ['classification_runner', 'release'])
def test_init_cfg_loads_every_backbone_weight(layout, tmp_path):
    source = timm.create_model('nalaformer_t', num_classes=10, **TINY).state_dict()
    path = tmp_path / f'{layout}.pth'
    if layout == 'classification_runner':  # tools/train.py on ImageNet: TimmClassifier keys under state_dict
        torch.save({'meta': {}, 'state_dict': {f'model.{k}': v for k, v in source.items()}}, path)
    else:
        torch.save({'model': source, 'args': argparse.Namespace(model='nalaformer_t')}, path)
    backbone = NaLaBackbone('nalaformer_t', init_cfg=dict(type='Pretrained', checkpoint=str(path)), **TINY)
    assert not torch.equal(backbone.model.model.layers[0].blocks[0].attn.qkvg.weight,
                           source['layers.0.blocks.0.attn.qkvg.weight'])
    backbone.init_weights()
    loaded = backbone.model.model.state_dict()
    assert len(loaded) > 50
    for key, value in loaded.items():
        torch.testing.assert_close(value, source[key], rtol=0, atol=0, msg=key)


def test_missing_backbone_checkpoint_says_how_to_set_it(tmp_path):
    backbone = NaLaBackbone('nalaformer_t', init_cfg=dict(type='Pretrained', checkpoint=str(tmp_path / 'x.pth')), **TINY)
    with pytest.raises(FileNotFoundError, match='model.backbone.init_cfg.checkpoint=PATH'):
        backbone.init_weights()


def test_frozen_stages_get_no_gradients():
    backbone = NaLaBackbone('nalaformer_t', frozen_stages=2, **TINY).train()
    sum(f.sum() for f in backbone(torch.randn(2, 3, 64, 64))).backward()
    stem, *stages = backbone.stage_modules
    for module in (stem, stages[0], stages[1]):
        assert not module.training
        assert all(not p.requires_grad and p.grad is None for p in module.parameters())
    for module in stages[2:]:
        assert module.training and all(p.grad is not None for p in module.parameters() if p.requires_grad)


# ---------------------------------------------------------------- tiny datasets in the real folder layouts

@pytest.fixture(scope='module')
def tiny_ade(tmp_path_factory):
    """ADEChallengeData2016/images/{training,validation}/*.jpg + annotations/.../*.png, 72x96 images."""
    return write_tiny_ade(tmp_path_factory.mktemp('ade') / 'ADEChallengeData2016')


@pytest.fixture(scope='module')
def tiny_cityscapes(tmp_path_factory):
    """leftImg8bit/{train,val}/<city>/*_leftImg8bit.png + gtFine/.../*_gtFine_labelTrainIds.png, 64x128."""
    root = tmp_path_factory.mktemp('cityscapes')
    g = torch.Generator().manual_seed(1)
    for split, city, n in (('train', 'aachen', 4), ('val', 'frankfurt', 2)):
        (root / 'leftImg8bit' / split / city).mkdir(parents=True)
        (root / 'gtFine' / split / city).mkdir(parents=True)
        for i in range(n):
            image, label = scene(g, 64, 128, num_labels=4)
            stem = f'{city}_{i:06d}_000019'
            image.save(root / 'leftImg8bit' / split / city / f'{stem}_leftImg8bit.png')
            label[label == 0] = 255  # trainIds: 0..18, 255 = ignore
            Image.fromarray(label.numpy()).save(root / 'gtFine' / split / city / f'{stem}_gtFine_labelTrainIds.png')
    return root


TINY_HEADS = {
    'upernet': ['model.decode_head.in_channels=[16,32,48,64]', 'model.decode_head.channels=16',
                'model.auxiliary_head.in_channels=48', 'model.auxiliary_head.channels=16'],
    'fpn': ['model.neck.in_channels=[16,32,48,64]', 'model.neck.out_channels=16',
            'model.decode_head.in_channels=[16,16,16,16]', 'model.decode_head.channels=16'],
}


def tiny_options(data_root, heads='upernet', iters=2, cityscapes=False):
    """Data from ``data_root`` at 64x64 crops, a one-block-per-stage backbone and small heads, ``iters`` iterations."""
    opts = []
    for split in ('train', 'val', 'test'):
        loader = f'{split}_dataloader'
        opts += [f'{loader}.dataset.data_root={data_root}', f'{loader}.num_workers=0',
                 f'{loader}.persistent_workers=False']
    # pipeline indices of mmseg's ade20k/cityscapes bases: train [2] RandomResize, [3] RandomCrop; test [1] Resize
    opts += ['train_dataloader.batch_size=2', 'train_dataloader.dataset.pipeline.2.scale=(128,64)',
             'train_dataloader.dataset.pipeline.3.crop_size=(64,64)', 'model.data_preprocessor.size=(64,64)',
             'val_dataloader.dataset.pipeline.1.scale=(128,64)', 'test_dataloader.dataset.pipeline.1.scale=(128,64)',
             'model.backbone.init_cfg=None', 'model.backbone.embed_dims=[16,32,48,64]',
             'model.backbone.depths=[1,1,1,1]', 'model.backbone.num_heads=[1,2,3,4]', *TINY_HEADS[heads],
             f'train_cfg.max_iters={iters}', f'train_cfg.val_interval={iters}',
             f'default_hooks.checkpoint.interval={iters}', 'default_hooks.logger.interval=1',
             'env_cfg.cudnn_benchmark=False']
    if cityscapes:  # slide inference with a window of the training crop
        opts += ['model.test_cfg.crop_size=(64,64)', 'model.test_cfg.stride=(48,48)']
    return opts


def logged_scalars(work_dir):
    [scalars] = Path(work_dir).glob('*/vis_data/scalars.json')
    return [json.loads(line) for line in scalars.read_text().splitlines()]


def assert_trained_and_evaluated(work_dir, iters):
    rows = logged_scalars(work_dir)
    losses = [r['loss'] for r in rows if 'loss' in r]
    assert len(losses) == iters and all(map(torch.isfinite, torch.tensor(losses)))
    [val] = [r for r in rows if 'mIoU' in r]  # reported; that the model learns is tests/test_dense_fit.py's job
    assert all(isinstance(val[k], float) for k in ('aAcc', 'mIoU', 'mAcc'))
    assert (Path(work_dir) / f'iter_{iters}.pth').is_file()


@pytest.fixture(scope='module')
def ade_run(tiny_ade, tmp_path_factory):
    return train(UPERNET, tmp_path_factory.mktemp('ade_run'), *tiny_options(tiny_ade))


# ---------------------------------------------------------------- end to end (slow)

@pytest.mark.xdist_group('seg_ade_run')
@pytest.mark.slow
def test_ade20k_trains_and_evaluates(ade_run):
    assert_trained_and_evaluated(ade_run, 2)
    checkpoint = torch.load(ade_run / 'iter_2.pth', map_location='cpu', weights_only=True)
    assert checkpoint['meta']['dataset_meta']['classes'][0] == 'wall'  # ADE20K's 150 classes


@pytest.mark.xdist_group('seg_ade_run')
@pytest.mark.slow
def test_runs_are_seeded_and_the_seed_can_be_changed(ade_run, tiny_ade, tmp_path):
    """The runtime's seed: a second run repeats the first exactly (losses and metrics); another seed differs."""
    def results(work):
        rows = logged_scalars(work)
        return [r['loss'] for r in rows if 'loss' in r], [r['mIoU'] for r in rows if 'mIoU' in r]
    train(UPERNET, tmp_path / 'again', *tiny_options(tiny_ade))
    assert results(tmp_path / 'again') == results(ade_run)
    train(UPERNET, tmp_path / 'seed1', *tiny_options(tiny_ade), 'randomness.seed=1')
    assert results(tmp_path / 'seed1')[0] != results(ade_run)[0]


@pytest.mark.xdist_group('seg_ade_run')
@pytest.mark.slow
def test_dense_checkpoint_converts_to_its_backbone_and_initialises_another(ade_run, tmp_path):
    from safetensors.torch import load_file

    from nalaformer.checkpoint import Checkpoint, DefinitionMismatchError
    checkpoint = torch.load(ade_run / 'iter_2.pth', map_location='cpu', weights_only=True)
    [recorded] = checkpoint['meta']['model_definitions']
    assert recorded['module'] == 'backbone.model.model' and recorded['architecture'] == 'nalaformer_t'
    prefix = 'backbone.model.model.'
    backbone_weights = {k[len(prefix):]: v for k, v in checkpoint['state_dict'].items() if k.startswith(prefix)}
    run_script(ROOT / 'tools' / 'convert_checkpoint.py', ade_run / 'iter_2.pth', tmp_path / 'backbone.safetensors')
    converted = load_file(str(tmp_path / 'backbone.safetensors'))
    assert converted.keys() == backbone_weights.keys()
    assert all(torch.equal(converted[k], v) for k, v in backbone_weights.items())
    assert Checkpoint.read(tmp_path / 'backbone.safetensors').definitions[0]['model_args'] == recorded['model_args']
    for source in (ade_run / 'iter_2.pth', tmp_path / 'backbone.safetensors'):  # both start another dense model
        backbone = NaLaBackbone('nalaformer_t', init_cfg=dict(type='Pretrained', checkpoint=str(source)), **TINY)
        backbone.init_weights()
        assert all(torch.equal(v, backbone_weights[k]) for k, v in backbone.model.model.state_dict().items())
    other = NaLaBackbone('nalaformer_t', attn_types='nala', init_cfg=dict(
        type='Pretrained', checkpoint=str(tmp_path / 'backbone.safetensors')), **TINY)
    with pytest.raises(DefinitionMismatchError, match="'nala', 'nala', 'softmax', 'softmax'"):
        other.init_weights()
    other.init_cfg['accept_definition_change'] = True
    other.init_weights()


@pytest.mark.xdist_group('seg_ade_run')
@pytest.mark.slow
def test_test_tool_reports_miou_and_draws_predictions(ade_run, tiny_ade, tmp_path):
    out = run_script(ROOT / 'tools' / 'test.py', UPERNET, ade_run / 'iter_2.pth', '--work-dir', tmp_path / 'test',
              '--show-dir', tmp_path / 'vis', '--cfg-options', *tiny_options(tiny_ade))
    metrics = eval(out.stdout.strip().splitlines()[-1])  # the dict printed by tools/test.py
    [val] = [r for r in logged_scalars(ade_run) if 'mIoU' in r]  # the training run's validation of iter_2.pth
    # tools/test.py prints to 4 decimals; the log holds mmseg's float32 values (13.29 -> 13.289999961853027)
    assert {k: metrics[k] for k in ('aAcc', 'mIoU', 'mAcc')} == {k: round(val[k], 4) for k in ('aAcc', 'mIoU', 'mAcc')}
    assert len(list((tmp_path / 'vis').rglob('*.png'))) == 3  # one per validation image


@pytest.mark.xdist_group('seg_ade_run')
@pytest.mark.slow
def test_test_tool_multi_scale_flip(ade_run, tiny_ade, tmp_path):
    out = run_script(ROOT / 'tools' / 'test.py', UPERNET, ade_run / 'iter_2.pth', '--tta', '--work-dir', tmp_path,
              '--cfg-options', *tiny_options(tiny_ade), 'test_dataloader.dataset.indices=1')  # 12 passes an image
    assert 'mIoU' in eval(out.stdout.strip().splitlines()[-1])


@pytest.mark.xdist_group('seg_ade_run')
@pytest.mark.slow
def test_demo_writes_image_and_overlay(ade_run, tiny_ade, tmp_path):
    image = next((tiny_ade / 'images' / 'validation').glob('*.jpg'))
    run_script(ROOT / 'tools' / 'seg_demo.py', image, UPERNET, ade_run / 'iter_2.pth', '--out', tmp_path / 'demo.png',
        '--cfg-options', *tiny_options(tiny_ade))
    assert Image.open(tmp_path / 'demo.png').size == (2 * 96, 72)  # image | overlay


@pytest.mark.slow
def test_cityscapes_trains_and_evaluates(tiny_cityscapes, tmp_path):
    train(CITYSCAPES, tmp_path, *tiny_options(tiny_cityscapes, cityscapes=True))
    assert_trained_and_evaluated(tmp_path, 2)


@pytest.mark.slow
def test_semantic_fpn_runs_under_mmsegs_own_train_script(tiny_ade, tmp_path):
    config = ROOT / 'configs' / 'ade20k' / 'fpn_nalaformer-t_8xb4-40k_ade20k-512x512.py'
    run_script(Path(mmseg.__file__).parent / '.mim' / 'tools' / 'train.py', config, '--work-dir', tmp_path,
        '--cfg-options', *tiny_options(tiny_ade, heads='fpn'))
    assert_trained_and_evaluated(tmp_path, 2)


@pytest.mark.slow
def test_missing_data_root_is_named(tmp_path):
    result = run_script(ROOT / 'tools' / 'train.py', UPERNET, '--work-dir', tmp_path / 'w', '--cfg-options',
                 *tiny_options(tmp_path / 'no_such_ade'), check=False)
    assert result.returncode != 0
    assert f'{tmp_path / "no_such_ade" / "images" / "training"} does not exist' in result.stderr
    assert 'images/training' in result.stderr and 'annotations/training' in result.stderr  # the layout
