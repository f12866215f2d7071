"""mmengine checkpoints that are safe, atomic, resumable and know which models they hold.

mmengine stores its MessageHub (HistoryBuffer objects with numpy arrays) in checkpoints, which
``torch.load(weights_only=True)`` refuses. Rather than allowlisting mmengine and numpy classes
(reconstructing them can need ``builtins.getattr``), :class:`ResumableCheckpointHook` stores that
state as tensors and plain data and rebuilds it on load. :class:`NaLaRunner` writes every
checkpoint atomically, records the definitions of the project's models in it, reads checkpoints
through :mod:`nalaformer.checkpoint` and checks recorded definitions when it loads one.
"""
import os
import os.path as osp

import numpy as np
import torch
from mmengine.dist import master_only
from mmengine.hooks import Hook
from mmengine.logging import HistoryBuffer
from mmengine.model import is_model_wrapper
from mmengine.registry import HOOKS, RUNNERS
from mmengine.runner import CheckpointLoader, Runner

from ..checkpoint import (
    Checkpoint, CorruptCheckpointError, NotResumableError, check_recorded_definitions, model_definitions,
    newest_readable_checkpoint,
)
from ..files import atomic_file, same_path

_HISTORY_BUFFER = '__history_buffer__'


def _to_plain(value):
    """HistoryBuffer / numpy -> tensors and plain data, recursively."""
    if isinstance(value, HistoryBuffer):
        log, count = value.data
        return {_HISTORY_BUFFER: True, 'log': torch.from_numpy(np.asarray(log, dtype=np.float64)),
                'count': torch.from_numpy(np.asarray(count, dtype=np.float64)), 'max_length': value.max_length}
    if isinstance(value, np.ndarray):
        return torch.from_numpy(value)
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, dict):
        return type(value)((k, _to_plain(v)) for k, v in value.items())
    if isinstance(value, (list, tuple)):
        return type(value)(_to_plain(v) for v in value)
    return value


def _from_plain(value):
    if isinstance(value, dict) and value.get(_HISTORY_BUFFER):
        return HistoryBuffer(value['log'].tolist(), value['count'].tolist(), value['max_length'])
    if isinstance(value, dict):
        return type(value)((k, _from_plain(v)) for k, v in value.items())
    return value


@HOOKS.register_module()
class ResumableCheckpointHook(Hook):
    """Store the message hub and meta as tensors/plain data; rebuild HistoryBuffers on load."""

    priority = 'LOWEST'  # after every other hook has added its state to the checkpoint

    def before_save_checkpoint(self, runner, checkpoint: dict) -> None:
        for key in ('message_hub', 'meta'):
            if key in checkpoint:
                checkpoint[key] = _to_plain(checkpoint[key])

    def after_load_checkpoint(self, runner, checkpoint: dict) -> None:
        if 'message_hub' in checkpoint:
            checkpoint['message_hub'] = _from_plain(checkpoint['message_hub'])


def load_runner_checkpoint(filename: str, map_location=None) -> dict:
    """mmengine's loader for local files: safe reading; a damaged file names the checkpoint to resume from."""
    try:
        return Checkpoint.read(filename).content
    except CorruptCheckpointError as e:
        directory = osp.dirname(osp.abspath(filename))
        previous = newest_readable_checkpoint(directory, exclude=[filename])
        advice = (f'the newest readable checkpoint in {directory} is {previous}: resume from it with '
                  f'--resume {previous}' if previous else
                  f'{directory} holds no other readable checkpoint: start again without --resume')
        raise CorruptCheckpointError(f'{e}; {advice}') from e


def check_resumable(filename: str) -> dict:
    """Raise :class:`NotResumableError` unless ``filename`` holds a training state that mmengine can resume
    (weights, optimizer, message hub, epoch and iteration: an ``epoch_*.pth`` / ``iter_*.pth`` of tools/train.py);
    returns its content."""
    content = load_runner_checkpoint(filename)
    meta = content.get('meta')
    if not (isinstance(content.get('state_dict'), dict) and isinstance(meta, dict) and 'epoch' in meta):
        raise NotResumableError(
            f'{filename} holds weights only, not a training state (optimizer, epoch, iteration), so --resume cannot '
            f'continue from it. To start a new training from these weights: --cfg-options model.pretrained={filename} '
            f'(dense tasks: model.backbone.init_cfg.checkpoint={filename}); load_from takes checkpoints written by '
            f'tools/train.py')
    if 'optimizer' not in content or 'message_hub' not in content:
        raise NotResumableError(
            f'{filename} holds no optimizer state (a best-metric checkpoint?), so --resume cannot continue from it: '
            f'resume from an epoch_*.pth or iter_*.pth of the run, or start a new training from its weights with '
            f'--cfg-options load_from={filename}')
    return content


@RUNNERS.register_module()
class NaLaRunner(Runner):
    """mmengine's Runner whose checkpoints are atomic (temporary file, then rename), record the
    definitions of the project's models (``meta.model_definitions``) and are checked against them on load."""

    def __init__(self, *args, **kwargs):
        # mmengine reads local checkpoints with a bare torch.load and no word on what went wrong; this
        # runner's (resume, load_from) go through nalaformer.checkpoint instead. mmengine keeps one
        # loader per scheme, so registering replaces it for the process: that is why it happens here.
        CheckpointLoader.register_scheme(prefixes='', loader=load_runner_checkpoint, force=True)
        super().__init__(*args, **kwargs)

    @master_only
    def dump_config(self) -> None:
        """mmengine's copy of the config in the work dir, written atomically; where the work dir holds a copy
        of another run's (an evaluation in a training run's work dir, a new run beside an earlier one) or the
        config file itself, it goes into this run's log folder instead: no run replaces another's record, nor
        the user's config by its merged copy."""
        name = osp.basename(self.cfg.filename) if self.cfg.filename else f'{self.timestamp}.py'
        path = osp.join(self.work_dir, name)
        if osp.exists(path) and (not self._resume or (self.cfg.filename and same_path(path, self.cfg.filename))):
            path = osp.join(self.log_dir, name)
        with atomic_file(path) as tmp:
            self.cfg.dump(str(tmp))

    def _unwrapped_model(self) -> torch.nn.Module:
        return self.model.module if is_model_wrapper(self.model) else self.model

    @master_only
    def save_checkpoint(self, out_dir: str, filename: str, *args, meta=None, **kwargs) -> None:
        meta = dict(meta or {}, model_definitions=model_definitions(self._unwrapped_model()))
        tmp_name = f'.{filename}.tmp'
        super().save_checkpoint(out_dir, tmp_name, *args, meta=meta, **kwargs)
        os.replace(osp.join(out_dir, tmp_name), osp.join(out_dir, filename))

    def load_checkpoint(self, filename: str, *args, **kwargs) -> dict:
        checkpoint = super().load_checkpoint(filename, *args, **kwargs)
        check_recorded_definitions(self._unwrapped_model(), Checkpoint(filename, checkpoint))
        return checkpoint
