"""Safe, atomic mmengine checkpoints that resume under torch.load(weights_only=True).

mmengine stores its MessageHub (HistoryBuffer objects with numpy arrays) in checkpoints and
loads with a bare torch.load, which torch >= 2.6 restricts to tensors and plain data. Rather
than allowlisting mmengine and numpy classes (reconstructing them can need
``builtins.getattr``), :class:`ResumableCheckpointHook` stores that state as tensors and plain
data and rebuilds it on load. :class:`NaLaRunner` writes every checkpoint to a temporary file
and renames it into place, and local checkpoints are read with ``weights_only=True`` (plus
``argparse.Namespace``, which the release's checkpoints carry).
"""
import argparse
import os
import os.path as osp
from typing import Dict

import numpy as np
import torch
from mmengine.dist import master_only
from mmengine.hooks import Hook
from mmengine.logging import HistoryBuffer
from mmengine.registry import HOOKS, RUNNERS
from mmengine.runner import CheckpointLoader, Runner

from ..checkpoint import CheckpointError, describe_architecture

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


def _load_local_weights_only(filename: str, map_location=None):
    if not osp.isfile(filename):
        raise FileNotFoundError(f'checkpoint {filename} does not exist')
    try:
        with torch.serialization.safe_globals([argparse.Namespace]):
            return torch.load(filename, map_location=map_location, weights_only=True)
    except Exception as e:
        raise CheckpointError(
            f'{filename} cannot be loaded with torch.load(weights_only=True): {e}. Only tensors and plain data '
            f'are read from checkpoints; re-save the weights alone or convert with tools/convert_checkpoint.py.') from e


CheckpointLoader.register_scheme(prefixes='', loader=_load_local_weights_only, force=True)


def check_state_dict_fits(model: torch.nn.Module, state_dict: Dict[str, torch.Tensor]) -> None:
    """Raise CheckpointError when tensors of ``state_dict`` have other shapes than ``model``'s.

    When the mismatch is inside a NaLaFormer backbone, the message names the variant the
    checkpoint looks like.
    """
    own = getattr(model, 'module', model).state_dict()  # unwrap DDP
    mismatched = [k for k, v in state_dict.items() if k in own and own[k].shape != v.shape]
    if not mismatched:
        return
    message = f'checkpoint does not fit the model: {len(mismatched)} tensors differ in shape, e.g. {mismatched[:3]}'
    first = mismatched[0]
    if 'layers.' in first:  # inside a NaLaFormer: say which variant the checkpoint is
        prefix = first[:first.index('layers.')]
        theirs = {k[len(prefix):]: v for k, v in state_dict.items() if k.startswith(prefix)}
        mine = {k[len(prefix):]: v for k, v in own.items() if k.startswith(prefix)}
        try:
            from ..models.nalaformer import _name_architecture
            message += (f'; the checkpoint looks like {_name_architecture(describe_architecture(theirs))}, '
                        f'the model is {_name_architecture(describe_architecture(mine))}')
        except (CheckpointError, KeyError):
            pass  # not a NaLaFormer layout after all: the shapes above say enough
    raise CheckpointError(message)


@RUNNERS.register_module()
class NaLaRunner(Runner):
    """mmengine Runner whose checkpoints are written atomically (temporary file, then rename)."""

    @master_only
    def save_checkpoint(self, out_dir: str, filename: str, *args, **kwargs) -> None:
        tmp_name = f'.{filename}.tmp'
        super().save_checkpoint(out_dir, tmp_name, *args, **kwargs)
        os.replace(osp.join(out_dir, tmp_name), osp.join(out_dir, filename))
