"""COCO detection / instance segmentation with mmdetection: configs, tiny end-to-end runs (CPU)."""
import json
from pathlib import Path

import mmdet
import numpy as np
import pytest
import torch
from mmdet.datasets import CocoDataset
from mmengine.config import Config
from PIL import Image

from tool_runs import run_script, train, write_tiny_coco

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = ROOT / 'configs' / 'coco'
MASK_RCNN = CONFIGS / 'mask-rcnn_nalaformer-t_fpn_1x_coco.py'
MASK_RCNN_3X = CONFIGS / 'mask-rcnn_nalaformer-t_fpn_ms-3x_coco.py'
RETINANET = CONFIGS / 'retinanet_nalaformer-t_fpn_1x_coco.py'
CUSTOM = CONFIGS / 'mask-rcnn_nalaformer-t_fpn_1x_custom-coco.py'
COCO_CLASSES = CocoDataset.METAINFO['classes']
TINY_DIMS = [16, 32, 48, 64]
TINY = ','.join(map(str, TINY_DIMS))
EMBED_DIMS = {'xt': [32, 64, 128, 384], 't': [64, 128, 256, 512], 's': [64, 128, 320, 512],
              'b': [96, 192, 384, 512]}


@pytest.fixture(scope='module')
def tiny_coco(tmp_path_factory):
    """COCO layout (annotations/instances_{train,val}2017.json, {train,val}2017/): 160x120 images with
    two objects each, rectangles ('cat') and ellipses ('dog') with polygon masks; 8 train, 4 val."""
    return write_tiny_coco(tmp_path_factory.mktemp('tiny_coco'), COCO_CLASSES)


HEAD_WIDTHS = {  # 32 channels after the backbone instead of 256 (and 64 instead of 1024): 10x faster on CPU
    'mask_rcnn': {'model.neck.out_channels': 32, 'model.rpn_head.in_channels': 32, 'model.rpn_head.feat_channels': 32,
                  'model.roi_head.bbox_roi_extractor.out_channels': 32, 'model.roi_head.bbox_head.in_channels': 32,
                  'model.roi_head.bbox_head.fc_out_channels': 64, 'model.roi_head.mask_roi_extractor.out_channels': 32,
                  'model.roi_head.mask_head.in_channels': 32, 'model.roi_head.mask_head.conv_out_channels': 32},
    'retinanet': {'model.neck.out_channels': 32, 'model.bbox_head.in_channels': 32, 'model.bbox_head.feat_channels': 32},
}
SCORE_THR = {'mask_rcnn': 'model.test_cfg.rcnn.score_thr', 'retinanet': 'model.test_cfg.score_thr'}


def tiny_options(data_root, detector='mask_rcnn'):
    """Data from ``data_root`` at 128x96, a one-block-per-stage backbone, narrow heads, 1 epoch, score
    threshold 0 (an untrained detector scores below the configs' thresholds: the evaluator would get nothing)."""
    opts = []
    for split in ('train', 'val', 'test'):
        loader = f'{split}_dataloader'
        resize = 2 if split == 'train' else 1  # index of Resize in mmdet's coco pipelines
        opts += [f'{loader}.dataset.data_root={data_root}', f'{loader}.num_workers=0',
                 f'{loader}.persistent_workers=False', f'{loader}.dataset.pipeline.{resize}.scale=(128,96)']
        if split != 'train':
            opts.append(f'{split}_evaluator.ann_file={data_root}/annotations/instances_val2017.json')
    opts += ['train_dataloader.batch_size=2', 'model.backbone.init_cfg=None', f'model.backbone.embed_dims=[{TINY}]',
             'model.backbone.depths=[1,1,1,1]', 'model.backbone.num_heads=[1,2,3,4]', f'model.neck.in_channels=[{TINY}]',
             'train_cfg.max_epochs=1', 'default_hooks.logger.interval=1', 'log_processor.window_size=1']
    return opts + [f'{k}={v}' for k, v in HEAD_WIDTHS[detector].items()] + [f'{SCORE_THR[detector]}=0.0']


def val_metrics(work_dir):
    [scalars] = Path(work_dir).glob('*/vis_data/scalars.json')
    [row] = [json.loads(line) for line in scalars.read_text().splitlines() if 'coco/bbox_mAP' in line]
    return row


def coco_metrics(metrics, kinds):
    """The AP, AP50 and AP75 of each kind ('bbox', 'segm'); a KeyError if the run did not report one.

    These tiny runs check the pipelines; that the detector learns is tests/test_dense_fit.py's job."""
    return {key: metrics[key] for kind in kinds for key in (f'coco/{kind}_mAP', f'coco/{kind}_mAP_50', f'coco/{kind}_mAP_75')}


# --- configs -----------------------------------------------------------------------------------------------


@pytest.mark.parametrize('variant', list(EMBED_DIMS))
@pytest.mark.parametrize('experiment', ['mask-rcnn_nalaformer-{}_fpn_1x_coco', 'mask-rcnn_nalaformer-{}_fpn_ms-3x_coco',
                                        'retinanet_nalaformer-{}_fpn_1x_coco'])
def test_configs_follow_the_paper_protocol(experiment, variant):
    cfg = Config.fromfile(str(CONFIGS / f'{experiment.format(variant)}.py'))
    assert cfg.model.backbone.type == 'NaLaBackbone' and cfg.model.backbone.arch == f'nalaformer_{variant}'
    assert cfg.model.backbone.init_cfg.checkpoint == f'checkpoints/nalaformer_{variant}_in1k.pth'
    assert cfg.model.neck.in_channels == EMBED_DIMS[variant]
    assert cfg.optim_wrapper.optimizer == dict(type='AdamW', lr=1e-4, weight_decay=1e-4)
    epochs, milestones = (36, [27, 33]) if '3x' in experiment else (12, [8, 11])
    assert cfg.train_cfg.max_epochs == epochs
    assert [s for s in cfg.param_scheduler if s.type == 'MultiStepLR'][0].milestones == milestones
    assert cfg.runner_type == 'NaLaRunner' and dict(type='ResumableCheckpointHook') in cfg.custom_hooks
    metrics = ['bbox', 'segm'] if experiment.startswith('mask-rcnn') else 'bbox'
    assert cfg.val_evaluator.type == 'CocoMetric' and cfg.val_evaluator.metric == metrics
    assert cfg.val_evaluator.ann_file == 'data/coco/annotations/instances_val2017.json'


def test_3x_trains_at_multiple_scales():
    from mmdet.utils import register_all_modules
    from mmengine.dataset import Compose
    register_all_modules()
    cfg = Config.fromfile(str(MASK_RCNN_3X))
    skip = ('LoadImageFromFile', 'LoadAnnotations', 'PackDetInputs')  # the image is given; only shapes are checked
    pipeline = Compose([t for t in cfg.train_dataloader.dataset.pipeline if t.type not in skip])
    np.random.seed(0)  # mmcv's random transforms draw from numpy
    image = dict(img=torch.zeros(480, 640, 3).byte().numpy(), img_shape=(480, 640), ori_shape=(480, 640))
    shapes = [pipeline(dict(image))['img_shape'] for _ in range(80)]
    # every image ends with its shorter side drawn from 480..800 (step 32); the resize-crop branch changes the
    # aspect ratio of some (384-600 crops of a 400-600 resize), the plain branch keeps 4:3
    assert all(min(h, w) in range(480, 801, 32) for h, w in shapes)
    assert len(set(shapes)) > 10
    kept = [(h, w) for h, w in shapes if w == round(h * 4 / 3)]
    assert 0 < len(kept) < len(shapes)
    test_resize = cfg.test_dataloader.dataset.pipeline[1]
    assert test_resize.type == 'Resize' and test_resize.scale == (1333, 800)  # single-scale testing


def test_frozen_stages_get_no_gradients():
    from mmdet.registry import MODELS
    from mmdet.testing import demo_mm_inputs
    from mmdet.utils import register_all_modules
    register_all_modules()
    cfg = Config.fromfile(str(MASK_RCNN))
    cfg.model.backbone.update(init_cfg=None, frozen_stages=2, embed_dims=TINY_DIMS, depths=[1, 1, 1, 1],
                              num_heads=[1, 2, 3, 4])
    cfg.model.neck.in_channels = TINY_DIMS
    cfg.merge_from_dict(HEAD_WIDTHS['mask_rcnn'])
    model = MODELS.build(cfg.model).train()
    data = model.data_preprocessor(demo_mm_inputs(2, [[3, 96, 128]] * 2, num_items=[2, 2], num_classes=80,
                                                  with_mask=True), True)
    loss, _ = model.parse_losses(model(**data, mode='loss'))
    loss.backward()
    backbone = model.backbone.model.model
    frozen = ['patch_embed', 'layers.0', 'layers.1']  # the stem and the first frozen_stages stages
    for name, param in backbone.named_parameters():
        if name.startswith(tuple(frozen)):
            assert not param.requires_grad and param.grad is None, name
        else:
            assert param.grad is not None and param.grad.abs().sum() > 0, name
    assert not any(m.training for prefix in frozen for m in backbone.get_submodule(prefix).modules())


def test_roi_features_of_the_backbone_maps_are_the_true_ones():
    """mmcv's RoIAlign reads memory as NCHW whatever the strides: the backbone must hand it maps whose
    RoI features equal torchvision's stride-aware roi_align (a channels-last map gave garbage boxes/masks)."""
    from mmcv.ops import RoIAlign
    from torchvision.ops import roi_align

    from nalaformer.dense import NaLaBackbone
    torch.manual_seed(0)
    backbone = NaLaBackbone('nalaformer_xt', init_cfg=None).eval()
    with torch.no_grad():
        features = backbone(torch.randn(2, 3, 96, 128))
    rois = torch.tensor([[0, 4., 6., 60., 50.], [1, 30., 10., 120., 90.]])
    for feature, stride in zip(features, (4, 8, 16, 32)):
        ours = RoIAlign(7, spatial_scale=1 / stride, sampling_ratio=2, aligned=True)(feature, rois)
        expected = roi_align(feature, rois, 7, spatial_scale=1 / stride, sampling_ratio=2, aligned=True)
        torch.testing.assert_close(ours, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.slow
def test_missing_coco_files_are_named(tmp_path):
    result = run_script(ROOT / 'tools' / 'train.py', MASK_RCNN, '--work-dir', tmp_path / 'w', '--cfg-options',
                        f'train_dataloader.dataset.data_root={tmp_path}/coco', check=False)
    assert result.returncode != 0
    assert f'{tmp_path}/coco/annotations/instances_train2017.json does not exist (train data)' in result.stderr
    assert 'Expected layout' in result.stderr and 'train2017/' in result.stderr


# --- end to end --------------------------------------------------------------------------------------------


@pytest.fixture(scope='module')
def trained_mask_rcnn(tiny_coco, tmp_path_factory):
    return train(MASK_RCNN, tmp_path_factory.mktemp('mask_rcnn'), *tiny_options(tiny_coco))


@pytest.mark.xdist_group('det_mask_rcnn_run')
@pytest.mark.slow
def test_mask_rcnn_trains_and_reports_coco_box_and_mask_ap(trained_mask_rcnn):
    assert all(isinstance(v, float) for v in coco_metrics(val_metrics(trained_mask_rcnn), ['bbox', 'segm']).values())
    checkpoint = torch.load(trained_mask_rcnn / 'epoch_1.pth', map_location='cpu', weights_only=True)
    assert checkpoint['meta']['dataset_meta']['classes'][:3] == ('person', 'bicycle', 'car')


@pytest.mark.xdist_group('det_mask_rcnn_run')
@pytest.mark.slow
def test_test_tool_reports_coco_metrics_and_draws_predictions(trained_mask_rcnn, tiny_coco, tmp_path):
    out = run_script(ROOT / 'tools' / 'test.py', MASK_RCNN, trained_mask_rcnn / 'epoch_1.pth', '--work-dir',
                     tmp_path / 'test', '--show-dir', tmp_path / 'show', '--cfg-options', *tiny_options(tiny_coco))
    metrics = eval(out.stdout.strip().splitlines()[-1])  # the dict printed by tools/test.py
    # the checkpoint re-evaluated on the validation images gives what the training run's validation logged
    assert coco_metrics(metrics, ['bbox', 'segm']) == coco_metrics(val_metrics(trained_mask_rcnn), ['bbox', 'segm'])
    drawn = sorted(p.name for p in (tmp_path / 'show').glob('*.png'))
    assert drawn == [f'{i:06d}.png' for i in range(1, 5)]
    assert Image.open(tmp_path / 'show' / drawn[0]).size == (320, 120)  # ground truth | predictions


@pytest.mark.xdist_group('det_mask_rcnn_run')
@pytest.mark.slow
def test_demo_writes_a_picture_of_the_predictions(trained_mask_rcnn, tiny_coco, tmp_path):
    [config] = trained_mask_rcnn.glob('*.py')  # the config tools/train.py saved with the tiny settings
    out = run_script(ROOT / 'tools' / 'det_demo.py', tiny_coco / 'val2017' / '000001.png', config,
                     trained_mask_rcnn / 'epoch_1.pth', '--out', tmp_path / 'pred.png', '--score-thr', '0.0')
    assert 'detections with score >= 0.0 drawn to' in out.stdout
    assert Image.open(tmp_path / 'pred.png').size == (160, 120)


@pytest.mark.slow
def test_retinanet_trains_and_reports_coco_box_ap(tiny_coco, tmp_path):
    train(RETINANET, tmp_path, *tiny_options(tiny_coco, detector='retinanet'))
    metrics = val_metrics(tmp_path)
    assert all(isinstance(v, float) for v in coco_metrics(metrics, ['bbox']).values())
    assert 'coco/segm_mAP' not in metrics


@pytest.mark.slow
def test_custom_coco_config_runs_under_mmdet_own_train_script(tiny_coco, tmp_path):
    """Own classes (metainfo) and annotation paths, trained by the train.py that ships with mmdet."""
    mmdet_train = Path(mmdet.__file__).parent / '.mim' / 'tools' / 'train.py'
    options = tiny_options(tiny_coco)
    for split, source in (('train', 'train'), ('val', 'val'), ('test', 'val')):
        options += [f'{split}_dataloader.dataset.ann_file=annotations/instances_{source}2017.json',
                    f'{split}_dataloader.dataset.data_prefix.img={source}2017/']
    run_script(mmdet_train, CUSTOM, '--work-dir', tmp_path, '--cfg-options', *options)
    checkpoint = torch.load(tmp_path / 'epoch_1.pth', map_location='cpu', weights_only=True)
    assert checkpoint['meta']['dataset_meta']['classes'] == ('cat', 'dog')
    assert checkpoint['state_dict']['roi_head.bbox_head.fc_cls.weight'].shape[0] == 3  # 2 classes + background
    assert all(isinstance(v, float) for v in coco_metrics(val_metrics(tmp_path), ['bbox', 'segm']).values())
