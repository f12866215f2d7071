"""mmengine model wrapper around a timm classifier (any timm model name, ours included)."""
from typing import Dict, List, Optional, Union

import timm
import torch
from mmengine.model import BaseModel
from mmengine.registry import MODELS
from timm.data import Mixup
from timm.loss import LabelSmoothingCrossEntropy, SoftTargetCrossEntropy


@MODELS.register_module()
class TimmClassifier(BaseModel):
    """``timm.create_model(arch, **model_kwargs)`` trained with timm's Mixup/CutMix and losses.

    Args:
        arch: timm model name (e.g. ``'nalaformer_t'``); unknown keyword arguments go to the model,
            which rejects the ones it does not know.
        pretrained: checkpoint to start from (ours, the release's, ``.pth`` or ``.safetensors``);
            a classifier of another number of classes is dropped (fine-tuning).
        pretrained_ema: start from the checkpoint's EMA weights (an error if it has none).
        accept_definition_change: start from a checkpoint recorded with other ``attn_types`` /
            ``kernel_kwargs`` than this model's (otherwise an error naming both).
        mixup: timm ``Mixup`` arguments (``num_classes`` and ``label_smoothing`` are filled in) or None.
        label_smoothing: smoothing of the targets (inside Mixup when it is on).
        grad_checkpointing: trade compute for memory in every stage: True (whole blocks) or ``'selective'``
            (all but the matrix products; NaLaFormer only).

    ``forward(inputs, data_samples, mode)``: inputs (B, C, H, W) float, data_samples (B,) int64 labels;
    'loss' -> dict(loss), 'predict' -> list of dict(logits (num_classes,), label ()), 'tensor' -> logits.
    """

    def __init__(self, arch: str, pretrained: Optional[str] = None, pretrained_ema: bool = False,
                 accept_definition_change: bool = False, mixup: Optional[dict] = None,
                 label_smoothing: float = 0.0, grad_checkpointing: Union[bool, str] = False,
                 data_preprocessor: Optional[dict] = None, init_cfg: Optional[dict] = None, **model_kwargs):
        super().__init__(data_preprocessor=data_preprocessor, init_cfg=init_cfg)
        if arch not in timm.list_models():
            close = timm.list_models(f'*{arch.split("_")[0]}*')[:10]
            raise ValueError(f'unknown timm model {arch!r} (model.arch); similar names: {close}')
        if pretrained:
            model_kwargs.update(pretrained=True, pretrained_cfg_overlay=dict(file=str(pretrained)))
            if pretrained_ema or accept_definition_change:  # loading options of this project's models
                model_kwargs.update(pretrained_ema=pretrained_ema, accept_definition_change=accept_definition_change)
        self.model = timm.create_model(arch, **model_kwargs)
        if grad_checkpointing:
            self.model.set_grad_checkpointing(grad_checkpointing)
        num_classes = self.model.num_classes
        self.mixup = Mixup(**{**mixup, 'label_smoothing': label_smoothing, 'num_classes': num_classes}) \
            if mixup else None
        if self.mixup is not None:
            self.criterion = SoftTargetCrossEntropy()
        elif label_smoothing > 0:
            self.criterion = LabelSmoothingCrossEntropy(smoothing=label_smoothing)
        else:
            self.criterion = torch.nn.CrossEntropyLoss()

    def forward(self, inputs: torch.Tensor, data_samples: Optional[torch.Tensor] = None, mode: str = 'tensor',
                unreadable: Optional[list] = None) -> Union[Dict[str, torch.Tensor], List[dict], torch.Tensor]:
        """``unreadable``: paths of images the dataset replaced in this batch, when
        :class:`~nalaformer.engine.data.UnreadableImageHook` (which counts them) is not configured."""
        if mode == 'loss':
            targets = data_samples
            if self.mixup is not None:
                inputs, targets = self.mixup(inputs, targets)
            return dict(loss=self.criterion(self.model(inputs), targets))
        logits = self.model(inputs)
        if mode == 'predict':
            return [dict(logits=lg, label=lb) for lg, lb in zip(logits.float(), data_samples)]
        if mode == 'tensor':
            return logits
        raise ValueError(f"mode must be 'loss', 'predict' or 'tensor', got {mode!r}")
