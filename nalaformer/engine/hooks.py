"""Hooks: EMA evaluated beside the raw weights, and per-epoch reseeding for exact resume."""
import random

import numpy as np
import torch
from mmengine.dist import get_rank
from mmengine.hooks import EMAHook, Hook
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
    """

    priority = 'HIGHEST'

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
