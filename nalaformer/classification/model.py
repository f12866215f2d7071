"""mmengine model wrapper around a timm classifier (any timm model name, ours included)."""
import logging
from typing import Dict, List, Optional, Union

import timm
import torch
from mmengine.logging import print_log
from mmengine.model import BaseModel
from mmengine.registry import MODELS
from timm.data import Mixup
from timm.loss import LabelSmoothingCrossEntropy, SoftTargetCrossEntropy

from ..checkpoint import check_starting_weights, load_starting_weights
from ..engine.model_spec import TimmModelSpec, check_model_name


def loads_itself(arch: str) -> bool:
    """``arch`` is a model of this project, whose family loads checkpoints (``load_weights``: safe reading, EMA,
    definitions, its layout); timm's loader serves any other timm model."""
    return timm.models.model_entrypoint(arch).__module__.startswith('nalaformer.')


def mix_batch(mixup: Mixup, inputs: torch.Tensor, targets: torch.Tensor):
    """timm's Mixup/CutMix on a batch of any size: (B, C, H, W), (B,) -> (B, C, H, W), (B, num_classes).

    timm pairs each image with its partner in the reversed batch and so refuses an odd batch; an odd batch
    (batch size 1 while debugging, an odd last batch) gets a copy of its last image appended for the mixing,
    which is dropped afterwards. A batch of one is mixed with itself: its target is only label-smoothed.
    """
    if len(inputs) % 2 == 0:
        return mixup(inputs, targets)
    inputs, targets = mixup(torch.cat([inputs, inputs[-1:]]), torch.cat([targets, targets[-1:]]))
    return inputs[:-1], targets[:-1]


@MODELS.register_module()
class TimmClassifier(BaseModel):
    """``timm.create_model(arch, **model_kwargs)`` trained with timm's Mixup/CutMix and losses.

    Args:
        arch: timm model name (e.g. ``'nalaformer_t'``); unknown keyword arguments go to the model,
            which rejects the ones it does not know.
        pretrained: checkpoint to start from: the file ``tools/convert_checkpoint.py RUN/epoch_N.pth PATH
            --ema`` writes (docs/journey.md), a runner checkpoint, the release's, ``.pth``, ``.safetensors`` or a
            timm folder; a classifier of another number of classes is dropped (fine-tuning). For this project's
            models one log line names the file, EMA or raw weights and the keys matched / missing / unexpected.
        pretrained_ema: start from a runner checkpoint's EMA weights (an error if it has none; a file converted
            with ``--ema`` holds them already).
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
        check_model_name(arch)
        own_loader = bool(pretrained) and loads_itself(arch)
        if pretrained and not own_loader:  # another timm model: timm's loader
            model_kwargs.update(pretrained=True, pretrained_cfg_overlay=dict(file=str(pretrained)))
        self.model = timm.create_model(arch, **model_kwargs)
        if own_loader:
            report = load_starting_weights(self.model, pretrained, 'model.pretrained', ema=pretrained_ema,
                                           accept_definition_change=accept_definition_change)
            print_log(report.line(), logger='current', level=logging.INFO)
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

    @classmethod
    def timm_model_spec(cls, model_cfg: dict, prefix: str = 'model.') -> TimmModelSpec:
        """The timm model a config dict of this class builds (:mod:`nalaformer.engine.model_spec`)."""
        return TimmModelSpec.of_wrapper(cls, model_cfg, prefix, model_cfg.get('arch'), weight_options=('pretrained',),
                                        weights_prefix='model.')

    @classmethod
    def check_starting_weights(cls, model_cfg: dict, prefix: str = 'model.') -> None:
        """Before a run writes anything (``tools/train.py``): ``pretrained`` names a checkpoint that exists and fits
        the model this config dict builds (on the meta device); the error names ``<prefix>pretrained``."""
        if not model_cfg.get('pretrained'):
            return
        check_starting_weights(cls.timm_model_spec(model_cfg, prefix).meta_model(), model_cfg['pretrained'],
                               f'{prefix}pretrained', model_cfg.get('pretrained_ema', False),
                               model_cfg.get('accept_definition_change', False), prefix)

    def forward(self, inputs: torch.Tensor, data_samples: Optional[torch.Tensor] = None, mode: str = 'tensor',
                unreadable: Optional[list] = None) -> Union[Dict[str, torch.Tensor], List[dict], torch.Tensor]:
        """``unreadable``: paths of images the dataset replaced in this batch, when
        :class:`~nalaformer.engine.hooks.UnreadableImageHook` (which counts them) is not configured."""
        if mode == 'loss':
            targets = data_samples
            if self.mixup is not None:
                inputs, targets = mix_batch(self.mixup, inputs, targets)
            return dict(loss=self.criterion(self.model(inputs), targets))
        logits = self.model(inputs)
        if mode == 'predict':
            return [dict(logits=lg, label=lb) for lg, lb in zip(logits.float(), data_samples)]
        if mode == 'tensor':
            return logits
        raise ValueError(f"mode must be 'loss', 'predict' or 'tensor', got {mode!r}")
