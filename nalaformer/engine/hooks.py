"""Hooks: EMA evaluated beside the raw weights, per-epoch reseeding for exact resume, and the count of unreadable
training images a dataset replaced."""
import logging
import random
from typing import Optional

import numpy as np
import torch
from mmengine.dist import get_rank, get_world_size
from mmengine.hooks import EMAHook, Hook
from mmengine.logging import print_log
from mmengine.registry import HOOKS


@HOOKS.register_module()
class DualEMAHook(EMAHook):
    """mmengine's EMAHook, but validation reports both weights: ``accuracy/top1`` (raw) and
    ``ema/accuracy/top1`` (EMA), so best-checkpoint tracking and logs can use either.

    Runs before RuntimeInfoHook so the EMA metrics reach the message hub, logs and CheckpointHook.
    Checkpoints keep the raw weights in ``state_dict`` (those ``accuracy/top1`` and the best
    checkpoint refer to) and the EMA weights in ``ema_state_dict`` (mmengine's EMAHook swaps
    them). Testing evaluates the weights the model holds: ``tools/test.py --ema`` loads the EMA weights
    themselves, through the one checkpoint reader.

    The averaging rate follows the total batch as in the release (``main.py``: timm's ``ModelEma`` with
    decay ``model_ema_decay ** (batch_size * world_size / 512)``, updated every iteration):
    ``decay`` is the decay for ``decay_batch_size`` images, and the per-iteration momentum
    (mmengine's ``1 - decay``) is ``1 - decay ** (total_batch / decay_batch_size)``, where the total
    batch is the training batch size times the number of processes. ``momentum`` instead fixes the
    per-iteration momentum whatever the batch. The value used is logged when training starts.

    Args:
        momentum: per-iteration momentum; when given, ``decay`` is not used.
        decay: EMA decay for a batch of ``decay_batch_size`` images (the release: 0.99996 per 512).
        decay_batch_size: the batch ``decay`` refers to.
        **kwargs: mmengine's EMAHook arguments (``update_buffers``, ``begin_iter``, ...).
    """

    priority = 'HIGHEST'

    def __init__(self, momentum: Optional[float] = None, decay: Optional[float] = None,
                 decay_batch_size: int = 512, **kwargs):
        if momentum is None and decay is None:
            raise ValueError('DualEMAHook needs momentum (per iteration) or decay (per decay_batch_size images)')
        if decay is not None and not 0.0 < decay < 1.0:
            raise ValueError(f'DualEMAHook decay must be in (0, 1), got {decay}')
        # the EMA model is built with a valid momentum; the run's own is set once the batch is known
        super().__init__(momentum=momentum if momentum is not None else 1.0 - decay, **kwargs)
        self.momentum, self.decay, self.decay_batch_size = momentum, decay, decay_batch_size

    def before_train(self, runner) -> None:
        super().before_train(runner)
        self.ema_model.momentum = self.iteration_momentum(runner.train_dataloader.batch_size * runner.world_size)

    def iteration_momentum(self, total_batch: int) -> float:
        """The per-iteration momentum for ``total_batch`` images per iteration (logged)."""
        if self.momentum is not None:
            momentum, source = self.momentum, 'set by momentum'
        else:
            momentum = 1.0 - self.decay ** (total_batch / self.decay_batch_size)
            source = f'1 - {self.decay} ** ({total_batch} / {self.decay_batch_size}) for a total batch of {total_batch}'
        print_log(f'EMA momentum {momentum:.4g} per iteration ({source})', logger='current')
        return momentum

    def before_save_checkpoint(self, runner, checkpoint: dict) -> None:
        checkpoint['ema_state_dict'] = self.ema_model.state_dict()

    def after_load_checkpoint(self, runner, checkpoint: dict) -> None:
        if 'ema_state_dict' in checkpoint:
            self.ema_model.load_state_dict(checkpoint['ema_state_dict'], strict=self.strict_load)
        else:  # weights without EMA (load_from a plain checkpoint): the EMA starts from them
            super().after_load_checkpoint(runner, checkpoint)

    def before_test_epoch(self, runner) -> None:
        """No swap: the model already holds the weights under test."""

    def after_test_epoch(self, runner, metrics=None) -> None:
        """No swap back."""

    def before_val_epoch(self, runner) -> None:
        """The loop validates the raw weights; the EMA ones are evaluated after it."""

    def after_val_epoch(self, runner, metrics=None) -> None:
        if metrics is None:
            return
        loop = runner.val_loop
        self._swap_ema_parameters()
        try:
            with torch.no_grad():
                for data_batch in loop.dataloader:
                    outputs = runner.model.val_step(data_batch)
                    loop.evaluator.process(data_samples=outputs, data_batch=data_batch)
            ema_metrics = loop.evaluator.evaluate(len(loop.dataloader.dataset))
        finally:
            self._swap_ema_parameters()
        metrics.update({f'ema/{k}': v for k, v in ema_metrics.items()})


@HOOKS.register_module()
class EpochSeedHook(Hook):
    """Reseed torch, numpy and random from (runner seed, epoch, rank) at every epoch start.

    A run resumed from an epoch-end checkpoint then draws exactly the random numbers an
    uninterrupted run draws (augmentation, Mixup, drop path, worker seeds), whatever consumed
    random numbers in between (validation, checkpointing).
    """

    priority = 'VERY_HIGH'

    def before_train_epoch(self, runner) -> None:
        seed = ((runner.seed or 0) + 100_003 * runner.epoch + 1_009 * get_rank()) % 2 ** 31
        random.seed(seed)
        np.random.seed(seed)
        torch.manual_seed(seed)


@HOOKS.register_module()
class UnreadableImageHook(Hook):
    """Count the training images a dataset replaced because they could not be read (``skip_unreadable``),
    log each path once, and stop with the list when more than ``max_fraction`` of the images a process
    trains on in one epoch (and more than ``min_count``) were unreadable. Removes the ``unreadable`` entry
    from each batch."""

    priority = 'VERY_HIGH'  # before anything reads the batch

    def __init__(self, max_fraction: float = 0.001, min_count: int = 5):
        if not 0 <= max_fraction <= 1 or min_count < 0:
            raise ValueError(f'UnreadableImageHook needs 0 <= max_fraction <= 1 and min_count >= 0, got '
                             f'{max_fraction}, {min_count}')
        self.max_fraction, self.min_count = max_fraction, min_count
        self.logged: set = set()
        self.epoch: set = set()

    def before_train_epoch(self, runner) -> None:
        self.epoch = set()

    def before_train_iter(self, runner, batch_idx: int, data_batch=None) -> None:
        if not isinstance(data_batch, dict):
            return
        paths = [p for p in data_batch.pop('unreadable', None) or () if p]
        for path in paths:
            if path not in self.logged:
                print_log(f'skipped an unreadable training image (replaced by the next one): {path}',
                          logger='current', level=logging.WARNING)
                self.logged.add(path)
        self.epoch.update(paths)
        if paths:
            runner.message_hub.update_scalar('train/unreadable_images', len(self.epoch))
        limit = max(self.min_count, self.max_fraction * len(runner.train_dataloader.dataset) / get_world_size())
        if len(self.epoch) > limit:
            listed = sorted(self.epoch)
            raise OSError(f'{len(listed)} training images could not be read in epoch {runner.epoch + 1}, more than '
                          f'the {limit:g} allowed (default_hooks.unreadable: max_fraction={self.max_fraction}, '
                          f'min_count={self.min_count}); replace or remove them: {listed[:50]}'
                          + (f' and {len(listed) - 50} more' if len(listed) > 50 else ''))
