"""Training loops that resume from any iteration exactly as an uninterrupted run continues.

mmengine's EpochBasedTrainLoop restarts a resumed epoch from its first batch, so a checkpoint written in
the middle of an epoch (preemption, ``iter_*.pth``) would train those batches twice. These loops advance
the data loader past the batches already trained (loading and dropping them, as mmengine's
IterBasedTrainLoop does, so that data-loader workers draw the same random numbers), then restore the
random-number state the checkpoint recorded when it was written (torch, CUDA, numpy, ``random``; one
per rank). :class:`~nalaformer.engine.checkpoint.NaLaRunner` uses them for ``by_epoch`` /
``EpochBasedTrainLoop`` / ``IterBasedTrainLoop`` configs.
"""
import logging
import random
from typing import List, Optional

import numpy as np
import torch
from mmengine.dist import get_rank
from mmengine.logging import print_log
from mmengine.registry import LOOPS
from mmengine.runner import EpochBasedTrainLoop, IterBasedTrainLoop

__all__ = ['ResumableEpochBasedTrainLoop', 'ResumableIterBasedTrainLoop', 'capture_rng', 'restore_rng']


def capture_rng() -> dict:
    """This process's random-number states as tensors and plain data (checkpoints hold nothing else)."""
    version, state, gauss = random.getstate()
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    return dict(torch=torch.get_rng_state(),
                cuda=torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
                numpy=dict(kind=kind, keys=torch.from_numpy(keys.astype(np.int64)), pos=int(pos),
                           has_gauss=int(has_gauss), cached=float(cached)),
                random=dict(version=version, state=torch.tensor(state, dtype=torch.int64), gauss=gauss))


def restore_rng(states: dict) -> None:
    """Set the random-number states :func:`capture_rng` returned."""
    torch.set_rng_state(states['torch'].cpu())  # a resumed checkpoint may have been mapped to the GPU
    if states['cuda'] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all([s.cpu() for s in states['cuda']])
    n = states['numpy']
    np.random.set_state((n['kind'], n['keys'].cpu().numpy().astype(np.uint32), n['pos'], n['has_gauss'], n['cached']))
    r = states['random']
    random.setstate((r['version'], tuple(r['state'].tolist()), r['gauss']))


class _ResumeState:
    """The random-number state to restore once the loader has been advanced past the trained batches."""

    def __init__(self):
        self.rng_states: Optional[List[dict]] = None

    def set_resumed_rng(self, rng_states: Optional[List[dict]]) -> None:
        """Called by the runner with the checkpoint's per-rank states (None: an older checkpoint)."""
        self.rng_states = rng_states

    def restore_pending_rng(self) -> None:
        states, self.rng_states = self.rng_states, None
        if states is None:
            print_log('the checkpoint records no random-number state: the resumed run continues from the right '
                      'batch but draws other random numbers than an uninterrupted run would',
                      logger='current', level=logging.WARNING)
        elif get_rank() < len(states):
            restore_rng(states[get_rank()])


@LOOPS.register_module()
class ResumableEpochBasedTrainLoop(EpochBasedTrainLoop, _ResumeState):
    """mmengine's EpochBasedTrainLoop, resumable from a checkpoint written in the middle of an epoch."""

    def __init__(self, *args, **kwargs):
        EpochBasedTrainLoop.__init__(self, *args, **kwargs)
        _ResumeState.__init__(self)

    def run_epoch(self) -> None:
        self.runner.call_hook('before_train_epoch')
        self.runner.model.train()
        trained = self._iter - self._epoch * len(self.dataloader)  # > 0: resumed inside this epoch
        if trained > 0:
            print_log(f'resuming inside epoch {self._epoch + 1}: advancing the data loader past the {trained} '
                      f'batches already trained', logger='current')
        for idx, data_batch in enumerate(self.dataloader):
            if idx < trained:
                if idx == trained - 1:
                    self.restore_pending_rng()
                continue
            self.run_iter(idx, data_batch)
        self.runner.call_hook('after_train_epoch')
        self._epoch += 1


class _RestoreAfter:
    """An iterator that restores the resumed random-number state after its first ``n`` items."""

    def __init__(self, iterator, n: int, loop: _ResumeState):
        self.iterator, self.n, self.loop = iterator, n, loop

    def __iter__(self):
        return self

    def __next__(self):
        item = next(self.iterator)
        self.n -= 1
        if self.n == 0:
            self.loop.restore_pending_rng()
        return item


@LOOPS.register_module()
class ResumableIterBasedTrainLoop(IterBasedTrainLoop, _ResumeState):
    """mmengine's IterBasedTrainLoop (which advances the loader on resume) that also restores the
    random-number state after advancing."""

    def __init__(self, *args, **kwargs):
        IterBasedTrainLoop.__init__(self, *args, **kwargs)
        _ResumeState.__init__(self)

    def run(self):
        if self._iter > 0:
            self.dataloader_iterator = _RestoreAfter(self.dataloader_iterator, self._iter, self)
        return super().run()
