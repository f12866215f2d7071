"""Timings of a dry run (:mod:`nalaformer.engine.dry_run`): per training and validation iteration, the time
waiting for data, the model step, and the other hooks' time; checkpoint writes; the losses and metrics.

Two hooks bracket every iteration, one that runs first and one that runs last among the runner's hooks:

    data  = first hook's before_iter  - previous iteration's last after_iter (or the epoch start)
    step  = first hook's after_iter   - last hook's before_iter          (forward, backward, optimizer)
    hooks = the rest of before_iter / after_iter (EMA, logging, ...), checkpoint writes excluded
    iteration = data + step + hooks

The first training iteration pays one-off costs (first allocations, lazy initialisation); the per-iteration
figures are the means over the others when there are others.
"""
import numbers
import time
from typing import Dict, List, Optional

import torch
from mmengine.hooks import Hook
from mmengine.runner import Runner

__all__ = ['DryRunProbe']


class _Edge(Hook):
    """Calls ``probe.event(stage, edge)`` at each stage it is registered for; ``edge`` 'first' or 'last'."""

    def __init__(self, probe: 'DryRunProbe', edge: str):
        self.probe, self.edge = probe, edge

    def before_train(self, runner) -> None:
        self.probe.event('epoch', self.edge)

    def before_train_epoch(self, runner) -> None:
        self.probe.event('epoch', self.edge)

    def before_train_iter(self, runner, batch_idx, data_batch=None) -> None:
        self.probe.event('before_iter', self.edge, 'train', data_batch)

    def after_train_iter(self, runner, batch_idx, data_batch=None, outputs=None) -> None:
        self.probe.event('after_iter', self.edge, 'train', outputs)

    def before_val(self, runner) -> None:
        self.probe.event('val_start', self.edge)

    def before_val_epoch(self, runner) -> None:
        self.probe.event('epoch', self.edge, 'val')

    def before_val_iter(self, runner, batch_idx, data_batch=None) -> None:
        self.probe.event('before_iter', self.edge, 'val', data_batch)

    def after_val_iter(self, runner, batch_idx, data_batch=None, outputs=None) -> None:
        self.probe.event('after_iter', self.edge, 'val', outputs)

    def after_val_epoch(self, runner, metrics=None) -> None:
        if self.edge == 'last':
            self.probe.metrics.update({k: float(v) for k, v in (metrics or {}).items() if _is_number(v)})

    def after_val(self, runner) -> None:
        self.probe.event('val_end', self.edge)


def _is_number(value) -> bool:
    """A metric value that is one number (Python, NumPy or a one-element tensor)."""
    return isinstance(value, numbers.Number) or (hasattr(value, 'ndim') and value.ndim == 0) or (
        torch.is_tensor(value) and value.numel() == 1)


def _loss(outputs) -> Optional[float]:
    """The total loss of a train step's log variables (``loss``, else the sum of the ``loss*`` entries)."""
    if not isinstance(outputs, dict):
        return None
    values = [outputs['loss']] if 'loss' in outputs else [v for k, v in outputs.items() if k.startswith('loss')]
    return float(sum(float(torch.as_tensor(v).detach().sum()) for v in values)) if values else None


def _batch_size(data_batch) -> Optional[int]:
    """The number of samples in a collated batch (``inputs``: a (B, ...) tensor or a list of B tensors)."""
    inputs = data_batch.get('inputs') if isinstance(data_batch, dict) else None
    return len(inputs) if isinstance(inputs, (list, tuple)) or torch.is_tensor(inputs) else None


def _mean(values: List[float]) -> Optional[float]:
    return sum(values) / len(values) if values else None


class DryRunProbe:
    """Records the runner's iterations (see the module docstring); :meth:`summary` gives the figures."""

    def __init__(self):
        self.mark: Dict[str, float] = {}  # split -> when its previous iteration (or epoch start) ended
        self.open: Dict[str, dict] = {}  # split -> the iteration under way
        self.iterations: Dict[str, List[dict]] = dict(train=[], val=[])
        self.checkpoint_s: List[float] = []
        self.checkpoint_names: List[str] = []
        self.losses: List[Optional[float]] = []
        self.metrics: Dict[str, float] = {}
        self.val_s: List[float] = []
        self.device = 'cpu'
        self._val_start = None

    def attach(self, runner: Runner) -> None:
        self.device = next(runner.model.parameters()).device.type
        runner.register_hook(_Edge(self, 'first'), priority='HIGHEST')
        runner.register_hook(_Edge(self, 'last'), priority='LOWEST')
        save = runner.save_checkpoint

        def timed_save(*args, **kwargs):
            self.checkpoint_names.append(str(kwargs.get('filename', args[1] if len(args) > 1 else '?')))
            start = time.perf_counter()
            try:
                return save(*args, **kwargs)
            finally:
                self.checkpoint_s.append(time.perf_counter() - start)

        runner.save_checkpoint = timed_save  # CheckpointHook calls runner.save_checkpoint

    def event(self, stage: str, edge: str, split: str = 'train', payload=None) -> None:
        """``payload``: the batch (before an iteration) or the step's outputs (after one)."""
        now = time.perf_counter()
        if stage == 'epoch' and edge == 'last':
            self.mark[split] = now
        elif stage == 'before_iter' and edge == 'first':
            self.open[split] = dict(data=now - self.mark.get(split, now), before_first=now,
                                    saved=sum(self.checkpoint_s), batch=_batch_size(payload))
        elif stage == 'before_iter':
            self.open[split]['before_last'] = now
        elif stage == 'after_iter' and edge == 'first':
            self.open[split]['after_first'] = now
        elif stage == 'after_iter':
            it = self.open.pop(split)
            hooks = (it['before_last'] - it['before_first']) + (now - it['after_first'])
            hooks -= sum(self.checkpoint_s) - it['saved']
            step = it['after_first'] - it['before_last']
            self.iterations[split].append(dict(data=it['data'], step=step, hooks=hooks,
                                               iteration=it['data'] + step + hooks, batch=it['batch']))
            self.mark[split] = now
            if split == 'train':
                self.losses.append(_loss(payload))
        elif stage == 'val_start' and edge == 'first':
            self._val_start = now
        elif stage == 'val_end' and edge == 'last' and self._val_start is not None:
            self.val_s.append(now - self._val_start)

    def _figures(self, split: str) -> dict:
        its = self.iterations[split]
        steady = its[1:] if split == 'train' and len(its) > 1 else its
        return dict(iterations=len(its), batch_sizes=sorted({i['batch'] for i in its if i['batch'] is not None}),
                    iteration_s=_mean([i['iteration'] for i in steady]), data_s=_mean([i['data'] for i in steady]),
                    step_s=_mean([i['step'] for i in steady]), hooks_s=_mean([i['hooks'] for i in steady]),
                    first_iteration_s=its[0]['iteration'] if its else None, per_iteration=its)

    def summary(self) -> dict:
        train, val = self._figures('train'), self._figures('val')
        train.update(losses=self.losses, last_loss=self.losses[-1] if self.losses else None)
        val.update(metrics=self.metrics, total_s=sum(self.val_s) if self.val_s else None)
        return dict(train=train, val=val, device=self.device,
                    checkpoints=dict(count=len(self.checkpoint_s), total_s=sum(self.checkpoint_s),
                                        names=self.checkpoint_names))
