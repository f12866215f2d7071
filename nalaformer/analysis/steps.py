"""One iteration of a model, as the benchmarks time and measure it: a forward under inference_mode, or a training
step, under autocast for an AMP dtype and on a chosen NaLa backend; the summary of a run's losses."""
import contextlib
import math
from typing import Callable, ContextManager, Dict, List, Optional, Sequence

import torch
import torch.nn as nn

from ..ops import use_nala_backend

__all__ = ['AMP_DTYPES', 'MODES', 'ModelStep', 'autocast', 'backend_context', 'loss_summary']

AMP_DTYPES = {'none': None, 'bf16': torch.bfloat16, 'fp16': torch.float16}
MODES = ('infer', 'train')


def autocast(device: torch.device, amp: str) -> ContextManager:
    """``torch.autocast`` to the dtype of ``amp`` (a key of :data:`AMP_DTYPES`; 'none': disabled)."""
    return torch.autocast(device.type, dtype=AMP_DTYPES[amp], enabled=AMP_DTYPES[amp] is not None)


def backend_context(backend: Optional[str]) -> Callable[[], ContextManager]:
    """A fresh context per iteration: the NaLa backend ``backend`` (``nalaformer.ops.BACKENDS``), or, for None,
    whichever is current."""
    return contextlib.nullcontext if backend is None else lambda: use_nala_backend(backend)


class ModelStep:
    """One iteration of ``model`` on fixed ``inputs`` per call, under :func:`autocast` and ``context()``: 'infer', a
    forward under inference_mode; 'train', forward, ``loss_fn``, backward and ``optimizer`` step (a GradScaler for
    fp16 unless ``grad_scaling`` is off), keeping each loss (0-dim, not synced) in ``losses``."""

    def __init__(self, model: nn.Module, inputs: torch.Tensor, mode: str, device: torch.device, amp: str = 'none',
                 loss_fn: Optional[Callable] = None, target: Optional[torch.Tensor] = None,
                 optimizer: Optional[torch.optim.Optimizer] = None,
                 context: Callable[[], ContextManager] = contextlib.nullcontext, grad_scaling: bool = True):
        if mode not in MODES or (mode == 'train' and any(x is None for x in (loss_fn, target, optimizer))):
            raise ValueError(f'mode is one of {MODES}, got {mode!r}; training needs loss_fn, target and optimizer')
        self.model = model.train(mode == 'train')
        self.inputs, self.mode, self.device, self.amp = inputs, mode, device, amp
        self.loss_fn, self.target, self.optimizer, self.context = loss_fn, target, optimizer, context
        self.scaler = torch.amp.GradScaler(device.type, enabled=grad_scaling and AMP_DTYPES[amp] is torch.float16)
        self.losses: List[torch.Tensor] = []

    def __call__(self):
        if self.mode == 'infer':
            with torch.inference_mode(), self.context(), autocast(self.device, self.amp):
                self.model(self.inputs)
            return
        self.optimizer.zero_grad(set_to_none=True)
        with self.context():
            with autocast(self.device, self.amp):
                loss = self.loss_fn(self.model(self.inputs), self.target)
            self.scaler.scale(loss).backward()
        self.scaler.step(self.optimizer)
        self.scaler.update()
        self.losses.append(loss.detach())


def loss_summary(losses: Sequence) -> Dict:
    """The final loss of a run's iterations and whether all were finite; empty without losses (inference)."""
    values = [float(loss) for loss in losses]
    return dict(final_loss=values[-1], losses_finite=all(map(math.isfinite, values))) if values else {}
