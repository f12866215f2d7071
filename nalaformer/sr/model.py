"""mmengine model wrapper around a timm super-resolution network, trained with an L1 loss (BasicSR's SRModel)."""
import inspect
from typing import Dict, List, Optional, Union

import timm
import torch
from mmengine.model import BaseModel
from mmengine.registry import MODELS

from ..engine.model_spec import TimmModelSpec, check_model_name
from ..images import to_uint8


@MODELS.register_module()
class SRModel(BaseModel):
    """``timm.create_model(arch, upscale=upscale, **model_kwargs)`` on [0, 1] images, L1 loss.

    Args:
        arch: timm model name (``'nalasr_light'``); unknown keyword arguments go to the model, which
            rejects the ones it does not know.
        upscale: the scale factor (2, 3, 4).
        tile: evaluate in tiles of ``tile`` x ``tile`` LR pixels overlapping by ``tile_overlap`` (the
            network's ``forward_tiled``), so that images of any size fit in memory; None: whole images.

    ``forward(inputs, data_samples, mode)``: inputs (B, 3, h, w) uint8 LR images, data_samples
    ``dict(gt=(B, 3, h * upscale, w * upscale) uint8, name=[...], set=[...])`` (default_collate);
    'loss' -> dict(loss), 'tensor' -> (B, 3, H, W) float in about [0, 1], 'predict' -> one dict per image
    with ``pred`` (rounded and clipped to uint8 as images are saved), ``gt``, ``lr`` and the sample's names.
    """

    def __init__(self, arch: str = 'nalasr_light', upscale: int = 2, tile: Optional[int] = None,
                 tile_overlap: int = 0, data_preprocessor: Optional[dict] = None, init_cfg: Optional[dict] = None,
                 **model_kwargs):
        super().__init__(data_preprocessor=data_preprocessor, init_cfg=init_cfg)
        check_model_name(arch)
        self.model = timm.create_model(arch, upscale=upscale, **model_kwargs)
        self.tile, self.tile_overlap = tile, tile_overlap
        self.criterion = torch.nn.L1Loss()

    @classmethod
    def timm_model_spec(cls, model_cfg: dict, prefix: str = 'model.') -> TimmModelSpec:
        """The timm model a config dict of this class builds (:mod:`nalaformer.engine.model_spec`)."""
        defaults = inspect.signature(cls).parameters
        return TimmModelSpec.of_wrapper(
            cls, model_cfg, prefix, model_cfg.get('arch', defaults['arch'].default),
            model_args=dict(upscale=model_cfg.get('upscale', defaults['upscale'].default)), weights_prefix='model.')

    def super_resolve(self, lr: torch.Tensor) -> torch.Tensor:
        """(B, 3, h, w) float [0, 1] -> (B, 3, h * upscale, w * upscale), tiled when configured."""
        if self.tile is not None and max(lr.shape[-2:]) > self.tile:
            return self.model.forward_tiled(lr, self.tile, self.tile_overlap)
        return self.model(lr)

    def forward(self, inputs: torch.Tensor, data_samples: Optional[dict] = None,
                mode: str = 'tensor') -> Union[Dict[str, torch.Tensor], List[dict], torch.Tensor]:
        lr = inputs.float() / 255
        if mode == 'loss':
            return dict(loss=self.criterion(self.model(lr), data_samples['gt'].float() / 255))
        sr = self.super_resolve(lr)
        if mode == 'tensor':
            return sr
        if mode == 'predict':
            pred = torch.from_numpy(to_uint8(sr.detach().float().cpu().numpy()))
            names = {k: v for k, v in data_samples.items() if k in ('name', 'set')}
            return [dict(pred=pred[i], gt=data_samples['gt'][i].cpu(), lr=inputs[i].cpu(),
                         **{k: v[i] for k, v in names.items()}) for i in range(len(pred))]
        raise ValueError(f"mode must be 'loss', 'predict' or 'tensor', got {mode!r}")
