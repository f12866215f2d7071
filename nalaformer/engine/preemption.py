"""Preemption: on SIGTERM (what Slurm and most clusters send before they kill a job) or another chosen
signal, finish the current iteration, write an iteration checkpoint and stop.

:class:`PreemptionHook` is on by default in every runtime (``default_hooks.preemption``). The
checkpoint (``iter_<N>.pth``, written atomically, recorded in ``last_checkpoint``) holds everything an
epoch checkpoint holds plus each rank's random-number state, so ``tools/train.py CONFIG --resume``
continues exactly as the uninterrupted run would have (see :mod:`nalaformer.engine.loops`). Once the resumed
run writes a newer regular checkpoint, the preemption checkpoint is deleted with the checkpoints beyond
``max_keep_ckpts`` (:mod:`nalaformer.engine.containment`; kept when that is -1, keep all). In
distributed runs every rank learns of the signal at the same iteration (an all-reduce of the flag),
the checkpoint is written once, and all ranks stop together. Data-loader workers ignore these signals,
so a signal sent to the whole process group does not kill them in the middle of the iteration.
"""
import os
import os.path as osp
import signal
import threading
from typing import Sequence, Union

import torch
from mmengine.dist import all_reduce, barrier, get_world_size, is_main_process
from mmengine.hooks import Hook
from mmengine.logging import print_log
from mmengine.registry import HOOKS

__all__ = ['PreemptionHook', 'Preempted', 'PREEMPTION_CHECKPOINTS']

# The message hub's list of the preemption checkpoints of a run (file names in its work dir).
PREEMPTION_CHECKPOINTS = 'preemption_ckpts'


class Preempted(RuntimeError):
    """The run stopped on a signal after writing an iteration checkpoint (``exit_code``: 128 + signal)."""

    def __init__(self, message: str, signum: int):
        super().__init__(message)
        self.exit_code = 128 + signum


class IgnoreSignals:
    """A data-loader ``worker_init_fn`` that makes workers ignore ``signals``, then calls ``then``."""

    def __init__(self, signals: Sequence[int], then=None):
        self.signals, self.then = list(signals), then

    def __call__(self, worker_id: int) -> None:
        for signum in self.signals:
            signal.signal(signum, signal.SIG_IGN)
        if self.then is not None:
            self.then(worker_id)


def _signal_number(value: Union[str, int]) -> int:
    try:
        return int(getattr(signal, value) if isinstance(value, str) else signal.Signals(value))
    except (AttributeError, ValueError):
        raise ValueError(f'unknown signal {value!r} in PreemptionHook(signals=...); use names such as '
                         f'"SIGTERM" or "SIGUSR1"') from None


@HOOKS.register_module()
class PreemptionHook(Hook):
    """See the module docstring. ``signals``: signal names (or numbers) that mean "save and stop"."""

    priority = 'LOWEST'  # after every other hook has finished the iteration (EMA, schedulers, logging)

    def __init__(self, signals: Sequence[Union[str, int]] = ('SIGTERM',)):
        self.signals = [_signal_number(s) for s in signals]
        self.received = 0
        self._previous = {}

    def _receive(self, signum, frame) -> None:
        if not self.received:
            print_log(f'received {signal.Signals(signum).name}: finishing this iteration, then writing a '
                      f'checkpoint and stopping', logger='current')
        self.received = signum

    def before_train(self, runner) -> None:
        if threading.current_thread() is not threading.main_thread():
            print_log('PreemptionHook: not in the main thread, so signals cannot be caught; preemption saves '
                      'nothing', logger='current', level='WARNING')
            return
        self._previous = {s: signal.signal(s, self._receive) for s in self.signals}
        for loader in (runner.train_dataloader, getattr(runner, '_val_dataloader', None)):
            if isinstance(loader, torch.utils.data.DataLoader) and loader.num_workers > 0:
                loader.worker_init_fn = IgnoreSignals(self.signals, loader.worker_init_fn)

    def after_train(self, runner) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        self._previous = {}

    def _agreed_signal(self) -> int:
        flag = torch.tensor(float(self.received))
        if get_world_size() > 1:
            all_reduce(flag, op='max')
        return int(flag)

    def _stop(self, runner, iteration: int, epoch: int) -> None:
        signum = self._agreed_signal()
        if not signum:
            return
        filename = f'iter_{iteration}.pth'
        # named (not a path: the work dir may be copied or moved) so that the checkpoint hook deletes it once a
        # newer regular checkpoint exists, as it deletes the checkpoints beyond max_keep_ckpts
        earlier = runner.message_hub.get_info(PREEMPTION_CHECKPOINTS) or []
        runner.message_hub.update_info(PREEMPTION_CHECKPOINTS, [*earlier, filename])
        runner.save_checkpoint(runner.work_dir, filename, meta=dict(epoch=epoch, iter=iteration))
        path = osp.join(runner.work_dir, filename)
        if is_main_process():
            tmp = osp.join(runner.work_dir, '.last_checkpoint.tmp')
            with open(tmp, 'w') as f:
                f.write(path)
            os.replace(tmp, osp.join(runner.work_dir, 'last_checkpoint'))
        barrier()
        raise Preempted(f'stopped on {signal.Signals(signum).name} after iteration {iteration}: wrote {path}; '
                        f'continue with the same command and --resume (or --resume {path})', signum)

    def after_train_iter(self, runner, batch_idx: int, data_batch=None, outputs=None) -> None:
        # the loop counts this iteration after the hooks: the checkpoint holds `iter + 1` trained iterations
        self._stop(runner, runner.iter + 1, runner.epoch)

    def after_val_iter(self, runner, batch_idx: int, data_batch=None, outputs=None) -> None:
        # validation during training runs between iterations, which the loop has already counted
        if self._previous:
            self._stop(runner, runner.iter, runner.epoch)
