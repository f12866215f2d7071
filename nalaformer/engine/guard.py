"""Stop a diverging run before it costs anything: no update from a non-finite gradient, no checkpoint with
non-finite weights, and a message that says where to resume from.

:class:`NonFiniteGuardHook` (on by default in every runtime, ``default_hooks.nonfinite``):

* before every optimizer step it takes the total gradient norm; a non-finite one skips the step (the
  gradients are dropped), so one bad batch does not turn the weights into NaN;
* after every iteration it checks each loss term; ``max_consecutive`` iterations in a row with a
  non-finite loss or gradient norm stop the run with :class:`DivergenceError`, naming the iterations,
  the loss terms, the learning rate and the newest checkpoint whose weights are finite (with the
  ``--resume`` command);
* steps that AMP's GradScaler skips (an overflow in fp16, followed by a smaller scale) are normal: they
  are counted (``train/amp_skipped_steps``), not fatal;
* the weights (and the EMA weights) are checked before a checkpoint is written, and before mmengine's
  CheckpointHook rotates old checkpoints out, so a run never replaces good weights by bad ones.
"""
import logging
import sys
from pathlib import Path
from typing import Dict, List, Optional

import torch
from mmengine.dist import all_reduce, get_world_size
from mmengine.hooks import CheckpointHook, Hook
from mmengine.logging import print_log
from mmengine.model import is_model_wrapper
from mmengine.registry import HOOKS

from ..checkpoint import Checkpoint, CheckpointError
from ..errors import UserError

__all__ = ['DivergenceError', 'NonFiniteGuardHook', 'newest_finite_checkpoint', 'nonfinite_tensors', 'resume_command']


class DivergenceError(UserError):
    """Training stopped because losses, gradients or weights stopped being finite (a recipe to fix: one line)."""


def nonfinite_tensors(state: Dict[str, torch.Tensor]) -> List[str]:
    """Names of the floating-point tensors of ``state`` that hold a NaN or an infinity."""
    return [k for k, v in state.items()
            if isinstance(v, torch.Tensor) and v.is_floating_point() and not bool(torch.isfinite(v).all())]


def newest_finite_checkpoint(work_dir: str) -> Optional[Path]:
    """The most recently written resumable checkpoint (``epoch_*.pth`` / ``iter_*.pth``) of ``work_dir`` that
    reads and whose weights (raw and EMA) are all finite, or None."""
    found = [*Path(work_dir).glob('epoch_*.pth'), *Path(work_dir).glob('iter_*.pth')]
    for path in sorted(found, key=lambda p: p.stat().st_mtime, reverse=True):
        try:
            content = Checkpoint.read(path).content
        except CheckpointError:
            continue
        if not any(nonfinite_tensors(content.get(key) or {}) for key in ('state_dict', 'ema_state_dict')):
            return path
    return None


def resume_command(argv: List[str], checkpoint: str) -> List[str]:
    """``argv`` (a tools/train.py command line) with its ``--resume [CKPT]`` replaced by ``--resume checkpoint``."""
    out, i = [], 0
    while i < len(argv):
        if argv[i] == '--resume':
            i += 2 if i + 1 < len(argv) and not argv[i + 1].startswith('-') else 1
            continue
        if argv[i].startswith('--resume='):
            i += 1
            continue
        out.append(argv[i])
        i += 1
    return [*out, '--resume', checkpoint]


def _resume_advice(runner) -> str:
    checkpoint = newest_finite_checkpoint(runner.work_dir)
    if checkpoint is None:
        return (f'{runner.work_dir} holds no checkpoint with finite weights yet: start again (without --resume) '
                f'after fixing the cause (a lower learning rate, optim_wrapper.clip_grad=dict(max_norm=5.0), '
                f'fp32 instead of fp16)')
    command = ' '.join(['python', *resume_command(sys.argv, str(checkpoint))])
    return (f'the newest checkpoint with finite weights is {checkpoint}; after fixing the cause (a lower learning '
            f'rate, optim_wrapper.clip_grad=dict(max_norm=5.0), fp32 instead of fp16) resume from it with: '
            f'{command}')


@HOOKS.register_module()
class NonFiniteGuardHook(Hook):
    """See the module docstring. ``max_consecutive``: non-finite iterations in a row that stop the run."""

    priority = 'LOW'  # after the logger has recorded the iteration, before CheckpointHook (VERY_LOW) saves

    def __init__(self, max_consecutive: int = 3):
        if max_consecutive < 1:
            raise ValueError(f'max_consecutive must be at least 1, got {max_consecutive}')
        self.max_consecutive = max_consecutive
        self.bad_iters: List[int] = []
        self.bad_terms: set = set()
        self.bad_lrs: set = set()
        self._lrs: set = set()
        self.step_skipped = False
        self.amp_skips = 0
        self._scale: Optional[float] = None
        self._handles = []

    # -- the optimizer step ------------------------------------------------------------------
    def _check_gradients(self, optimizer, args, kwargs) -> None:
        grads = [p.grad for group in optimizer.param_groups for p in group['params'] if p.grad is not None]
        if grads and not torch.isfinite(torch.nn.utils.get_total_norm(grads)):
            for group in optimizer.param_groups:
                for p in group['params']:
                    p.grad = None  # optimizers leave parameters without a gradient untouched
            self.step_skipped = True

    @staticmethod
    def _optimizers(runner) -> list:
        wrappers = getattr(runner.optim_wrapper, 'optim_wrappers', {'': runner.optim_wrapper})  # OptimWrapperDict
        return [w.optimizer for w in wrappers.values()]

    def before_train(self, runner) -> None:
        self._handles = [o.register_step_pre_hook(self._check_gradients) for o in self._optimizers(runner)]

    def after_train(self, runner) -> None:
        for handle in self._handles:
            handle.remove()

    # -- every iteration ---------------------------------------------------------------------
    def _amp_scale(self, runner) -> Optional[float]:
        scaler = getattr(runner.optim_wrapper, 'loss_scaler', None)
        return float(scaler.get_scale()) if scaler is not None and scaler.is_enabled() else None

    def before_train_iter(self, runner, batch_idx: int, data_batch=None) -> None:
        self.step_skipped = False
        self._scale = self._amp_scale(runner)
        self._lrs = {g['lr'] for o in self._optimizers(runner) for g in o.param_groups}  # schedulers step after it

    def after_train_iter(self, runner, batch_idx: int, data_batch=None, outputs=None) -> None:
        terms = [k for k, v in (outputs or {}).items() if not bool(torch.isfinite(torch.as_tensor(v).detach()).all())]
        bad = torch.tensor(float(bool(terms) or self.step_skipped))
        if get_world_size() > 1:  # every rank stops at the same iteration
            all_reduce(bad, op='max')
        scale = self._amp_scale(runner)
        if scale is not None and self._scale is not None and scale < self._scale and not terms:
            self.amp_skips += 1  # GradScaler found an overflow and skipped the step: normal in fp16
            runner.message_hub.update_scalar('train/amp_skipped_steps', self.amp_skips)
        if not bad:
            self.bad_iters, self.bad_terms, self.bad_lrs = [], set(), set()
        else:
            self.bad_iters.append(runner.iter + 1)
            self.bad_terms.update(terms or ['gradient norm'])
            self.bad_lrs.update(self._lrs)
            print_log(f'iteration {runner.iter + 1}: non-finite {", ".join(terms) or "gradient norm"}; '
                      f'the optimizer step was skipped ({len(self.bad_iters)} of {self.max_consecutive} in a row '
                      f'stop the run)', logger='current', level=logging.WARNING)
            if len(self.bad_iters) >= self.max_consecutive:
                lrs = ', '.join(f'{lr:.3g}' for lr in sorted(self.bad_lrs)[:4])
                raise DivergenceError(
                    f'training diverged: {len(self.bad_iters)} iterations in a row '
                    f'({self.bad_iters[0]}-{self.bad_iters[-1]}, epoch {runner.epoch + 1}) had a non-finite '
                    f'{", ".join(sorted(self.bad_terms))} at learning rate {lrs}; '
                    f'their updates were skipped and no checkpoint was written from them. {_resume_advice(runner)}')
        if self._checkpoint_due(runner):
            self._check_weights(runner, 'the next checkpoint')

    # -- checkpoints -------------------------------------------------------------------------
    def _checkpoint_due(self, runner) -> bool:
        """Whether mmengine's CheckpointHook saves after this iteration (it removes old checkpoints first)."""
        return any(isinstance(h, CheckpointHook) and not h.by_epoch and h.interval > 0
                   and (h.every_n_train_iters(runner, h.interval) or (h.save_last and h.is_last_train_iter(runner)))
                   for h in runner.hooks)

    def _check_weights(self, runner, what: str, checkpoint: Optional[dict] = None) -> None:
        model = runner.model.module if is_model_wrapper(runner.model) else runner.model
        states = {'weights': checkpoint['state_dict'] if checkpoint else model.state_dict()}
        if checkpoint and 'ema_state_dict' in checkpoint:
            states['EMA weights'] = checkpoint['ema_state_dict']
        for name, state in states.items():
            bad = nonfinite_tensors(state)
            if bad:
                raise DivergenceError(
                    f'training diverged: {len(bad)} of the {len(state)} tensors of the {name} are not finite '
                    f'(e.g. {bad[:3]}) at iteration {runner.iter + 1}; {what} was not written. '
                    f'{_resume_advice(runner)}')

    def after_train_epoch(self, runner) -> None:
        self._check_weights(runner, 'the epoch checkpoint')

    def before_save_checkpoint(self, runner, checkpoint: dict) -> None:
        self._check_weights(runner, 'the checkpoint', checkpoint)
