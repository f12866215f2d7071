"""The configs hold the recipes they cite: optimizer parameter groups as built, schedules, pipelines, EMA, seeds.

Sources: the release (ZacharyMeng/NaLaFormer NaLaformer/main.py: timm's create_optimizer, ModelEma decay
0.99996 ** (batch / 512)), Swin's set_weight_decay, PVT's COCO recipe, PoolFormer's/VAN's ADE20K Semantic FPN
configs (lr 2e-4 at 8 x 4 images for 40k iterations) and mmdet's Swin 3x config.
"""
import copy
import functools
import importlib
import math
import re
from pathlib import Path

import pytest
import torch
from mmengine.config import Config
from mmengine.hub import get_config
from mmengine.optim import build_optim_wrapper
from mmengine.registry import HOOKS, MODELS, DefaultScope

ROOT = Path(__file__).resolve().parents[1]


def configs(*folders):
    """The experiment configs of the folders, less the pico CPU checks (not a cited recipe)."""
    return [p for f in folders for p in sorted((ROOT / 'configs' / f).glob('*.py')) if 'pico' not in p.name]


def ids(paths):
    return [p.name for p in paths]


@functools.lru_cache(maxsize=None)
def load(path):
    """A config, parsed once for all the tests that read it (they do not change it)."""
    return Config.fromfile(str(path))


def build_model(cfg):
    for module in cfg.get('custom_imports', {}).get('imports', []):
        importlib.import_module(module)
    scope = cfg.get('default_scope')
    if scope:
        importlib.import_module(f'{scope}.utils').register_all_modules(init_default_scope=False)
    model_cfg = copy.deepcopy(cfg.model)
    model_cfg.pop('pretrained', None)
    if (model_cfg.get('backbone') or {}).get('init_cfg'):
        model_cfg.backbone.init_cfg = None
    with DefaultScope.overwrite_default_scope(scope), torch.device('meta'):
        return MODELS.build(model_cfg)


def weight_decay_by_name(cfg):
    """{parameter name: weight decay} of the optimizer that mmengine builds from the config for its model."""
    model = build_model(cfg)
    optimizer = build_optim_wrapper(model, cfg.optim_wrapper).optimizer
    decay = {id(p): group['weight_decay'] for group in optimizer.param_groups for p in group['params']}
    return {name: decay[id(p)] for name, p in model.named_parameters()}, dict(model.named_parameters())


def release_rule(name, param):
    """timm's create_optimizer as the release calls it: no decay for ndim <= 1, names ending in .bias and the
    model's no_weight_decay() names (the release's NALAFORMER lists only 'absolute_pos_embed')."""
    return not (param.ndim <= 1 or name.endswith('.bias') or name == 'absolute_pos_embed')


def swin_rule(name, param):
    """Swin's set_weight_decay: no decay for one-dimensional parameters, .bias and relative position bias tables."""
    return not (param.ndim == 1 or name.endswith('.bias') or 'relative_position_bias_table' in name)


@pytest.mark.parametrize('path', configs('nalaformer', 'ade20k', 'cityscapes'),
                         ids=ids(configs('nalaformer', 'ade20k', 'cityscapes')))
def test_nalaformer_configs_decay_as_the_release(path):
    cfg = load(path)
    base = cfg.optim_wrapper.optimizer.weight_decay
    decay, params = weight_decay_by_name(cfg)
    wrong = {n: d for n, d in decay.items() if d != (base if release_rule(n, params[n]) else 0.0)}
    assert not wrong, f'weight decay differs from the release rule (base {base}): {sorted(wrong.items())[:8]}'
    gammas = [n for n in decay if n.endswith(('gamma_1', 'gamma_2'))]
    assert gammas and all(decay[n] == base > 0 for n in gammas)  # LayerScale, shape (1, C, 1, 1), decays


def test_imagenet_recipe_is_the_release_one():
    cfg = load(ROOT / 'configs/nalaformer/nalaformer-t_8xb128_in1k.py')
    gpus, per_gpu = 8, cfg.train_dataloader.batch_size
    optimizer = cfg.optim_wrapper.optimizer
    assert (optimizer.type, optimizer.weight_decay, optimizer.eps) == ('AdamW', 0.05, 1e-8)
    assert optimizer.lr == pytest.approx(5e-4 * gpus * per_gpu / 512)  # main.py: args.lr * total batch / 512
    warmup, cosine = cfg.param_scheduler
    assert (warmup.type, warmup.end, cosine.type, cosine.end) == ('LinearLR', 5, 'CosineAnnealingLR', 300)
    assert warmup.start_factor * optimizer.lr == pytest.approx(1e-6)  # --warmup-lr 1e-6
    assert cosine.eta_min == 1e-5 and cfg.train_cfg.max_epochs == 300  # --min-lr, --epochs (paper: 320)
    assert warmup.convert_to_iter_based and cosine.convert_to_iter_based  # epochs: iterations follow the batch
    assert cfg.train_dataloader.sampler.num_repeats == 3 and cfg.randomness.seed == 0


@pytest.mark.parametrize('path', configs('swin_protocol'), ids=ids(configs('swin_protocol')))
def test_swin_protocol_configs_decay_as_swin(path):
    cfg = load(path)
    base = cfg.optim_wrapper.optimizer.weight_decay
    decay, params = weight_decay_by_name(cfg)
    wrong = {n: d for n, d in decay.items() if d != (base if swin_rule(n, params[n]) else 0.0)}
    assert not wrong, sorted(wrong.items())[:8]


@pytest.mark.parametrize('path', configs('coco'), ids=ids(configs('coco')))
def test_coco_configs_decay_everything_as_pvt(path):
    cfg = load(path)
    decay, _ = weight_decay_by_name(cfg)
    assert set(decay.values()) == {1e-4} and cfg.optim_wrapper.optimizer.lr == 1e-4


@pytest.mark.parametrize('path', configs('ade20k'), ids=ids(configs('ade20k')))
def test_segmentation_lr_per_image_is_the_cited_recipes(path):
    """Semantic FPN: 2e-4 for 8 x 4 images over 40k iterations (PoolFormer, VAN; PVT's 1e-4 at 16 for 80k).
    UperNet: the paper's 1e-4 for 8 x 2 images over 160k iterations."""
    cfg = load(path)
    gpus, per_gpu = map(int, re.search(r'_(\d+)xb(\d+)-', path.name).groups())
    assert cfg.train_dataloader.batch_size == per_gpu
    total = gpus * per_gpu
    cited = {'fpn': (2e-4, 32, 40000), 'upernet': (1e-4, 16, 160000)}[path.name.split('_')[0]]
    lr, batch, iters = cited
    assert cfg.optim_wrapper.optimizer.lr / total == pytest.approx(lr / batch)
    assert cfg.train_cfg.max_iters == iters and cfg.auto_scale_lr.base_batch_size == batch


@pytest.mark.parametrize('variant', ['t', 's', 'b', 'xt'])
def test_mask_rcnn_3x_is_mmdets_swin_3x_protocol(variant):
    """Pipeline (with DETR's resize-crop branch) and schedule as mmdet's mask-rcnn_swin-t-p4-w7_fpn_ms-crop-3x."""
    ours = load(ROOT / f'configs/coco/mask-rcnn_nalaformer-{variant}_fpn_ms-3x_coco.py')
    swin = get_config('mmdet::swin/mask-rcnn_swin-t-p4-w7_fpn_ms-crop-3x_coco.py')

    def resize_scales(transform):  # mmdet writes (short, long) with keep_ratio: the order carries no meaning
        return dict(transform, scales=sorted(tuple(sorted(s)) for s in transform.scales)) \
            if 'scales' in transform else transform

    def steps(pipeline):
        out = []
        for t in pipeline:
            if t.type == 'RandomChoice':
                t = dict(t, transforms=[[resize_scales(s) for s in branch] for branch in t.transforms])
            out.append(resize_scales(t))
        return out

    assert steps(ours.train_dataloader.dataset.pipeline) == steps(swin.train_dataloader.dataset.pipeline)
    crop_branch = [b for t in ours.train_dataloader.dataset.pipeline if t.type == 'RandomChoice'
                   for b in t.transforms if any(s.type == 'RandomCrop' for s in b)]
    assert crop_branch and crop_branch[0][1].crop_size == (384, 600)
    assert ours.param_scheduler == swin.param_scheduler and ours.train_cfg.max_epochs == 36


def ema_momentum(hook_cfg, per_gpu, gpus):
    return HOOKS.build(hook_cfg).iteration_momentum(per_gpu * gpus)


def test_ema_momentum_follows_the_total_batch_as_the_release():
    importlib.import_module('nalaformer.engine')
    cfg = load(ROOT / 'configs/nalaformer/nalaformer-t_8xb128_in1k.py')
    [ema] = [h for h in cfg.custom_hooks if h.type == 'DualEMAHook']
    at_1024, at_256 = ema_momentum(ema, 128, 8), ema_momentum(ema, 32, 8)
    # main.py: ModelEma(decay=0.99996 ** (batch_size * world_size / 512)); mmengine's momentum = 1 - decay
    assert at_1024 == pytest.approx(1 - 0.99996 ** 2, rel=1e-9)
    assert at_256 == pytest.approx(1 - 0.99996 ** 0.5, rel=1e-9)
    assert math.isclose(at_1024 / at_256, 4, rel_tol=1e-3)
    assert ema_momentum(dict(ema, momentum=0.3), 32, 8) == 0.3  # an explicit momentum is used as given


def test_raw_and_ema_best_checkpoints_are_both_kept():
    cfg = load(ROOT / 'configs/nalaformer/nalaformer-t_8xb128_in1k.py')
    assert cfg.default_hooks.checkpoint.save_best == ['accuracy/top1', 'ema/accuracy/top1']


DENSE = configs('ade20k', 'cityscapes', 'coco')


@pytest.mark.parametrize('path', DENSE, ids=ids(DENSE))
def test_dense_runs_are_seeded(path):
    cfg = load(path)
    assert cfg.randomness.seed == 0


NAMED_BATCH = [p for p in configs('nalaformer', 'swin_protocol', 'ade20k', 'cityscapes')
               if re.search(r'_\d+xb\d+', p.name)]


@pytest.mark.parametrize('path', NAMED_BATCH, ids=ids(NAMED_BATCH))
def test_auto_scale_lr_base_is_the_batch_the_lr_is_for(path):
    """--auto-scale-lr leaves the lr alone at the batch the config's name states (GPUS x images per GPU)."""
    cfg = load(path)
    gpus, per_gpu = map(int, re.search(r'_(\d+)xb(\d+)', path.name).groups())
    assert cfg.train_dataloader.batch_size == per_gpu
    assert cfg.auto_scale_lr.base_batch_size == gpus * per_gpu
