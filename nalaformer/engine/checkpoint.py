"""mmengine checkpoints that are safe, atomic, resumable and know which models they hold.

mmengine stores its MessageHub (HistoryBuffer objects with numpy arrays) in checkpoints, which
``torch.load(weights_only=True)`` refuses. Rather than allowlisting mmengine and numpy classes
(reconstructing them can need ``builtins.getattr``), :class:`ResumableCheckpointHook` stores that
state as tensors and plain data and rebuilds it on load. :class:`NaLaRunner` writes every
checkpoint atomically, records the definitions of the project's models in it, reads checkpoints
through :mod:`nalaformer.checkpoint` and checks recorded definitions when it loads one.
"""
import copy
import os
import os.path as osp
import re

import numpy as np
import torch
from mmengine.dist import all_gather_object, get_world_size, is_main_process, master_only
from mmengine.hooks import Hook
from mmengine.logging import HistoryBuffer
from mmengine.model import is_model_wrapper
from mmengine.optim import OptimWrapperDict
from mmengine.registry import HOOKS, RUNNERS
from mmengine.runner import CheckpointLoader, Runner, load_state_dict

from ..checkpoint import (
    Checkpoint, CorruptCheckpointError, NotResumableError, check_recorded_definitions, model_definitions,
    newest_readable_checkpoint,
)
from ..files import atomic_file, same_path
from .containment import contained_checkpoint_hook
from .launch import model_spec
from .loops import capture_rng

# mmengine's loops -> the ones that resume from any iteration (nalaformer.engine.loops)
RESUMABLE_LOOPS = {'EpochBasedTrainLoop': 'ResumableEpochBasedTrainLoop',
                   'IterBasedTrainLoop': 'ResumableIterBasedTrainLoop'}

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


def compiled_part(model: torch.nn.Module, spec) -> torch.nn.Module:
    """The module of ``model`` that ``compile`` compiles: the timm model of the config's task wrapper
    (:class:`~nalaformer.engine.model_spec.TimmModelSpec` ``spec``), the wrapper itself where it holds the model in
    another layout (a dense backbone), ``model`` where the config has no such wrapper (``spec`` None)."""
    if spec is None:
        return model
    wrapper = model.get_submodule(spec.prefix.removeprefix('model.').rstrip('.'))
    return wrapper.get_submodule(spec.weights_prefix.rstrip('.')) if spec.weights_prefix else wrapper


@RUNNERS.register_module()
class NaLaRunner(Runner):
    """mmengine's Runner whose checkpoints are atomic (temporary file, then rename), record the
    definitions of the project's models (``meta.model_definitions``) and every rank's random-number
    state (``meta.rng_states``), are checked against the definitions on load, are deleted only inside the work
    dir (:class:`~nalaformer.engine.containment.ContainedCheckpointHook`), load with ``weights_only=True``
    (:class:`ResumableCheckpointHook`, added where a config names none), and whose training loops
    resume from any iteration (:mod:`nalaformer.engine.loops`); its ``auto_scale_lr`` counts gradient
    accumulation in the total batch and logs what it set."""

    def __init__(self, *args, **kwargs):
        self._resumed_rng_states = None
        self._compiled = False
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

    def register_hooks(self, default_hooks=None, custom_hooks=None) -> None:
        """mmengine's, with a :class:`ResumableCheckpointHook` added where the config names none: every checkpoint
        of this runner loads with ``weights_only=True``, whichever task plug-in's config it runs."""
        custom_hooks = list(custom_hooks or [])
        if not any(isinstance(hook, ResumableCheckpointHook)
                   or isinstance(hook, dict) and hook.get('type') in ('ResumableCheckpointHook', ResumableCheckpointHook)
                   for hook in custom_hooks):
            custom_hooks.append(dict(type='ResumableCheckpointHook'))
        super().register_hooks(default_hooks, custom_hooks)

    def register_hook(self, hook, priority=None) -> None:
        """mmengine's, with its ``CheckpointHook`` replaced by one that deletes only inside the work dir
        (:mod:`nalaformer.engine.containment`): configs keep naming ``CheckpointHook``."""
        super().register_hook(contained_checkpoint_hook(hook), priority)

    def _unwrapped_model(self) -> torch.nn.Module:
        return self.model.module if is_model_wrapper(self.model) else self.model

    def _maybe_compile(self, target: str) -> None:
        """mmengine's ``compile`` setting (True, or torch.compile's keywords; ``tools/train.py --compile``) for
        training, validation and testing alike: the network the task wrapper builds (the timm model, or a dense
        model's backbone; the whole model for configs without a wrapper of this project) is compiled in place
        (``nn.Module.compile``: its weights keep their names in checkpoints). mmengine compiles ``train_step``
        only, where the optimizer step breaks the graph."""
        options = self.cfg.get('compile')
        if not options or self._compiled:
            return
        network = compiled_part(self._unwrapped_model(), model_spec(self.cfg))
        settings = {} if options is True else dict(options)
        network.compile(**settings)
        self._compiled = True
        self.logger.info(f'compile: torch.compile of {type(network).__name__} ({target}, options {settings}): the '
                         f'first iterations of each mode and input shape are slow while it compiles')

    def val(self) -> dict:
        self._maybe_compile('val_step')
        return super().val()

    def test(self) -> dict:
        self._maybe_compile('test_step')
        return super().test()

    def build_train_loop(self, loop):
        if isinstance(loop, dict):
            loop = copy.deepcopy(loop)
            if 'type' not in loop and 'by_epoch' in loop:
                loop['type'] = 'EpochBasedTrainLoop' if loop.pop('by_epoch') else 'IterBasedTrainLoop'
            loop['type'] = RESUMABLE_LOOPS.get(loop.get('type'), loop.get('type'))
        return super().build_train_loop(loop)

    def save_checkpoint(self, out_dir: str, filename: str, *args, meta=None, **kwargs) -> None:
        # every rank calls this (mmengine's CheckpointHook does); only the main process writes
        rng_states = all_gather_object(capture_rng()) if get_world_size() > 1 else [capture_rng()]
        if not is_main_process():
            return
        meta = dict(meta or {}, model_definitions=model_definitions(self._unwrapped_model()), rng_states=rng_states)
        tmp_name = f'.{filename}.tmp'
        super().save_checkpoint(out_dir, tmp_name, *args, meta=meta, **kwargs)
        os.replace(osp.join(out_dir, tmp_name), osp.join(out_dir, filename))

    def load_checkpoint(self, filename: str, map_location='cpu', strict: bool = False,
                        revise_keys=((r'^module\.', ''),)) -> dict:
        """mmengine's ``load_checkpoint`` (``resume``, ``load_from``), with a local file read through
        :mod:`nalaformer.checkpoint` (safe, typed errors; mmengine's loader would ``torch.load`` it bare) and
        the recorded model definitions checked before the weights load. URLs go to mmengine's loaders. Tensors
        are read to the CPU and moved by ``load_state_dict`` (the optimizer's by the optimizer)."""
        checkpoint = (CheckpointLoader.load_checkpoint(filename, map_location) if '://' in str(filename)
                      else load_runner_checkpoint(filename))
        self.call_hook('after_load_checkpoint', checkpoint=checkpoint)
        model = self._unwrapped_model()
        check_recorded_definitions(model, Checkpoint(filename, checkpoint))
        state_dict = checkpoint.get('state_dict', checkpoint)
        for pattern, replacement in revise_keys:
            state_dict = {re.sub(pattern, replacement, k): v for k, v in state_dict.items()}
        load_state_dict(model, state_dict, strict=strict, logger=self.logger)
        self._has_loaded = True
        self.logger.info(f'Load checkpoint from {filename}')
        self._resumed_rng_states = checkpoint.get('meta', {}).get('rng_states')
        return checkpoint

    def resume(self, filename: str, *args, **kwargs) -> None:
        super().resume(filename, *args, **kwargs)
        if hasattr(self.train_loop, 'set_resumed_rng'):
            self.train_loop.set_resumed_rng(self._resumed_rng_states)

    def scale_lr(self, optim_wrapper, auto_scale_lr=None) -> None:
        """The linear scaling rule of ``auto_scale_lr`` (``tools/train.py --auto-scale-lr``), on the images per
        optimizer step: processes x batch size x gradient accumulation (mmengine's leaves the accumulation out).
        Logs the total batch and the learning rates it set; the EMA follows the batch by itself (DualEMAHook)."""
        if not (auto_scale_lr and auto_scale_lr.get('enable', False)):
            return
        loader = self._train_dataloader
        batch_size = loader['batch_size'] if isinstance(loader, dict) else loader.batch_size
        accumulation = self.cfg.get('optim_wrapper', {}).get('accumulative_counts', 1)
        total = self.world_size * batch_size * accumulation
        ratio = total / auto_scale_lr['base_batch_size']
        wrappers = optim_wrapper.values() if isinstance(optim_wrapper, OptimWrapperDict) else [optim_wrapper]
        set_lrs = []
        for wrapper in wrappers:
            for group in wrapper.optimizer.param_groups:
                group['lr'] *= ratio
                set_lrs.append(group['lr'])
        self.logger.info(
            f'auto_scale_lr: total batch {total} ({self.world_size} processes x {batch_size} images x {accumulation} '
            f'accumulation steps) / base_batch_size {auto_scale_lr["base_batch_size"]}: learning rates x {ratio:g}, '
            f'now {", ".join(f"{lr:g}" for lr in sorted(set(set_lrs)))} (the schedulers start from these)')
