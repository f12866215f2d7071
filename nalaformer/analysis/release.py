"""The authors' release model next to ours: the ``NALAFORMER`` of the release's NALA.py (kept outside this
repository) built with our model's architecture and attention types, and our weights (the layouts are identical)."""
import importlib.util
from pathlib import Path
from types import ModuleType
from typing import Optional

import timm
import torch.nn as nn

from .models import ModelSpec, ModelSpecError

__all__ = ['RELEASE_FLAGS', 'has_release', 'load_release', 'release_model']

# Release block flags of our attention types.
RELEASE_FLAGS = {'nala': 'l', 'softmax': 'v'}


def has_release(spec: ModelSpec) -> bool:
    """Whether the release defines ``spec``'s architecture: the NaLaFormer family (``nalaformer_*``) only."""
    return spec.arch in timm.list_models(module='nalaformer')


def load_release(path: Optional[Path]) -> ModuleType:
    """The release's NALA.py as a module (it is never copied into this repository)."""
    if path is None or not Path(path).is_file():
        raise ModelSpecError(f"'release:' models need --release-file pointing at the release's NALA.py (got {path})")
    spec = importlib.util.spec_from_file_location('nala_release', str(path))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def release_model(ours: nn.Module, release_file: Path) -> nn.Module:
    """The release's model of ``ours``' architecture and attention types, with ``ours``' weights."""
    attn_types = getattr(ours, 'attn_types', None)
    if attn_types is None or any(t not in RELEASE_FLAGS for t in attn_types):
        raise ModelSpecError(f"'release:' needs a nalaformer_* model with 'nala'/'softmax' stages, got {attn_types}")
    stages = list(ours.layers)
    dims = [stage.blocks[0].attn.qkvg.in_features for stage in stages]
    model = load_release(release_file).NALAFORMER(
        num_classes=ours.num_classes, embed_dims=dims, depths=[len(stage.blocks) for stage in stages],
        num_heads=[stage.blocks[0].attn.num_heads for stage in stages],
        mlp_ratios=[stage.blocks[0].ffn.fc1.out_features / dim for stage, dim in zip(stages, dims)],
        flagss=[[RELEASE_FLAGS[t]] * len(stage.blocks) for t, stage in zip(attn_types, stages)],
        drop_path_rate=0., projection=ours.head_hidden_size,
        layerscales=[stage.blocks[0].gamma_1 is not None for stage in stages], layer_init_values=[1.] * len(stages))
    model.load_state_dict(ours.state_dict())
    return model
