"""One backbone wrapper for dense prediction (mmsegmentation, mmdetection) around our timm models."""
import logging
from typing import Optional, Sequence, Tuple, Union

import timm
import torch
import torch.nn as nn
from mmengine.logging import print_log
from mmengine.model import BaseModule
from torch.nn.modules.batchnorm import _BatchNorm

from ..checkpoint import check_starting_weights, load_starting_weights
from ..engine.model_spec import TimmModelSpec
from ..models.layers import LayerNorm2d


class NaLaBackbone(BaseModule):
    """A timm model of this project (``nalaformer_*``, ``nala_swin_*``) as a multi-scale backbone.

    Args:
        arch: timm model name. out_indices: stages to output (0-3 at strides 4/8/16/32).
        frozen_stages: as in mmdet/mmseg backbones: 0 freezes the stem, k the stem and the first k
            stages (no gradients, eval mode); -1 freezes nothing.
        norm_eval: keep BatchNorm layers in eval mode while training (frozen statistics).
        with_cp: gradient checkpointing in every stage: True (whole blocks) or ``'selective'`` (all but the
            matrix products, see ``NaLaFormer.set_grad_checkpointing``).
        out_norms: a LayerNorm on each output (detection/segmentation heads expect normalised maps).
        init_cfg: ``dict(type='Pretrained', checkpoint=PATH)`` loads an ImageNet checkpoint: the file
            ``tools/convert_checkpoint.py RUN/epoch_N.pth PATH --ema`` writes (docs/journey.md), a runner
            checkpoint, the release's, a ``.safetensors``, a timm folder or a dense-task checkpoint; the
            classifier is dropped. One log line names the file, EMA or raw weights and the keys matched /
            missing / unexpected. ``ema=True`` takes a runner checkpoint's EMA weights (an error if it has
            none; a file converted with ``--ema`` holds them already); ``accept_definition_change=True``
            accepts a checkpoint recorded with other ``attn_types`` / ``kernel_kwargs`` (otherwise an error
            naming both).
        **model_kwargs: the model's own arguments (drop_path_rate, attn_types, embed_dims, ...).

    ``forward(x)``: (B, C, H, W), any H, W -> tuple of (B, C_i, ceil(H/s_i), ceil(W/s_i)).
    """

    def __init__(self, arch: str = 'nalaformer_t', out_indices: Sequence[int] = (0, 1, 2, 3),
                 frozen_stages: int = -1, norm_eval: bool = False, with_cp: Union[bool, str] = False, out_norms: bool = True,
                 init_cfg: Optional[dict] = None, **model_kwargs):
        super().__init__(init_cfg=init_cfg)
        self.model = timm.create_model(arch, features_only=True, out_indices=tuple(out_indices), **model_kwargs)
        self.out_indices = tuple(out_indices)
        self.frozen_stages = frozen_stages
        self.norm_eval = norm_eval
        if with_cp:
            self.model.set_grad_checkpointing(with_cp)
        channels = self.model.feature_info.channels()
        self.norms = nn.ModuleList(LayerNorm2d(c) for c in channels) if out_norms else None
        self._freeze_stages()

    @classmethod
    def timm_model_spec(cls, model_cfg: dict, prefix: str = 'model.backbone.') -> TimmModelSpec:
        """The timm model a config dict of this class builds (:mod:`nalaformer.engine.model_spec`): the whole
        network, whose features the backbone takes (its weights sit in the features-only layout)."""
        return TimmModelSpec.of_wrapper(cls, model_cfg, prefix, model_cfg.get('arch', 'nalaformer_t'),
                                        weight_options=('init_cfg',))

    @classmethod
    def check_starting_weights(cls, model_cfg: dict, prefix: str = 'model.backbone.') -> None:
        """Before a run writes anything (``tools/train.py``): a Pretrained ``init_cfg`` names a checkpoint that exists
        and fits the backbone this config dict builds (on the meta device); the error names
        ``<prefix>init_cfg.checkpoint``."""
        init_cfg = model_cfg.get('init_cfg')
        if not (isinstance(init_cfg, dict) and init_cfg.get('type') == 'Pretrained'):
            return
        kwargs = {k: v for k, v in model_cfg.items() if k not in ('type', '_scope_', 'init_cfg')}
        with torch.device('meta'):
            network = cls(**kwargs).model.model
        check_starting_weights(network, init_cfg.get('checkpoint'), f'{prefix}init_cfg.checkpoint',
                               init_cfg.get('ema', False), init_cfg.get('accept_definition_change', False), prefix)

    @property
    def stage_modules(self) -> list:
        """[stem, stage 0, stage 1, ...] of the wrapped network, for freezing."""
        net = self.model.model
        stem = net.get_submodule(net.pretrained_cfg['first_conv'].rsplit('.', 2)[0])
        stages = [net.get_submodule(info['module']) for info in net.feature_info]
        return [stem, *stages]

    def _freeze_stages(self) -> None:
        for module in self.stage_modules[:self.frozen_stages + 1]:
            module.eval()
            for param in module.parameters():
                param.requires_grad = False

    def train(self, mode: bool = True):
        super().train(mode)
        self._freeze_stages()
        if mode and self.norm_eval:
            for module in self.modules():
                if isinstance(module, _BatchNorm):
                    module.eval()
        return self

    def init_weights(self) -> None:
        if not (self.init_cfg and self.init_cfg.get('type') == 'Pretrained'):
            return super().init_weights()
        report = load_starting_weights(  # the model's own safe loading and checkpoint layout
            self.model.model, self.init_cfg['checkpoint'], 'model.backbone.init_cfg.checkpoint',
            ema=self.init_cfg.get('ema', False),
            accept_definition_change=self.init_cfg.get('accept_definition_change', False),
            cfg_prefix='model.backbone.')
        print_log(report.line(), logger='current', level=logging.INFO)
        self._is_init = True

    def forward(self, x: torch.Tensor) -> Tuple[torch.Tensor, ...]:
        features = self.model(x)
        if self.norms is not None:
            features = [norm(f) for norm, f in zip(self.norms, features)]
        # Contiguous channels-first maps: mmcv's RoIAlign (CPU and CUDA) reads its input's memory as NCHW
        # whatever its strides, so a channels-last map (LayerNorm2d's output is one) gives wrong RoI features.
        return tuple(f.contiguous() for f in features)
