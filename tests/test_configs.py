"""Every experiment config under configs/ builds: model constructed, dataloaders and evaluators resolvable."""
import importlib
from pathlib import Path

import pytest
import torch
from mmengine.config import Config
from mmengine.registry import DATA_SAMPLERS, DATASETS, METRICS, MODELS, DefaultScope

from nalaformer.engine.launch import model_spec

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = sorted(p for p in (ROOT / 'configs').rglob('*.py') if '_base_' not in p.parts)


def _registry_has(registry, scope, type_name):
    with registry.switch_scope_and_registry(scope) as scoped:  # e.g. mmdet's child registry, as build() does
        return scoped.get(type_name) is not None


@pytest.mark.parametrize('path', CONFIGS, ids=[str(p.relative_to(ROOT / 'configs')) for p in CONFIGS])
def test_config_builds(path):
    cfg = Config.fromfile(str(path))
    for module in cfg.get('custom_imports', {}).get('imports', []):
        importlib.import_module(module)
    scope = cfg.get('default_scope')
    if scope:
        importlib.import_module(f'{scope}.utils').register_all_modules(init_default_scope=False)
    model_cfg = cfg.model.copy()
    if model_cfg.get('pretrained'):
        model_cfg.pretrained = None  # weights are not part of the build check
    backbone = model_cfg.get('backbone') or {}
    if backbone.get('init_cfg'):
        backbone.init_cfg = None
    with DefaultScope.overwrite_default_scope(scope), torch.device('meta'):
        model = MODELS.build(model_cfg)
    # the runner core's seam reads the same timm model off the config (keyword checks, resume fit, export, test)
    spec = model_spec(cfg)
    assert spec is not None and isinstance(model.get_submodule(spec.prefix[len('model.'):].rstrip('.')), spec.wrapper)
    if spec.weights_prefix is not None:
        built = {key: value.shape for key, value in model.state_dict().items()}
        assert {spec.weights_prefix + k: v.shape for k, v in spec.meta_model().state_dict().items()}.items() \
            <= built.items()
    for split in ('train', 'val', 'test'):
        loader = cfg.get(f'{split}_dataloader')
        if loader is None:
            continue
        assert _registry_has(DATASETS, scope, loader.dataset.type), loader.dataset.type
        assert _registry_has(DATA_SAMPLERS, scope, loader.sampler.type), loader.sampler.type
        assert loader.batch_size >= 1
    evaluator_cfg = cfg.get('val_evaluator') or cfg.test_evaluator  # configs without validation test only
    evaluators = evaluator_cfg if isinstance(evaluator_cfg, (list, tuple)) else [evaluator_cfg]
    for evaluator in evaluators:
        assert _registry_has(METRICS, scope, evaluator.type), evaluator.type
