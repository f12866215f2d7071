"""Loading checkpoints into models: the one path every tool takes, and the options of timm's ``pretrained=True``.

A checkpoint is read once (:class:`~nalaformer.checkpoint.reading.Checkpoint`), its weights are picked and
given the model's own keys once (:meth:`~nalaformer.checkpoint.reading.Checkpoint.model_weights`), its
recorded definition is checked, and the weights are handed to the model family once (its ``load_weights``,
which applies the family's state-dict layout). The checkpoint code asks the model about layouts (its
``architecture_of`` names what a state dict looks like); the model families never import back beyond
reading and these loading helpers.
"""
import contextlib
import contextvars
import warnings
from dataclasses import dataclass
from typing import Iterator, List, Optional, Sequence, Tuple, Union

import torch.nn as nn

from .definitions import check_definition, definition_modules, unwrap
from .errors import CheckpointError, MissingCheckpointError
from .reading import Checkpoint, PathLike, StateDict

__all__ = ['shape_mismatches', 'check_shapes', 'check_state_dict_fits', 'check_recorded_definitions',
           'load_checkpoint_into', 'loading_options', 'pretrained_options', 'pretrained_weights', 'pretrained_kwargs',
           'LoadReport', 'load_starting_weights', 'check_starting_weights', 'check_checkpoint_file', 'config_key_error']


def shape_mismatches(state_dict: StateDict, own: StateDict) -> List[str]:
    """``'key: (shape) vs (model's shape)'`` for each tensor of ``state_dict`` whose key the model's state dict
    ``own`` holds with another shape. The one shape check: every check of a checkpoint against a model uses it."""
    return [f'{key}: {tuple(value.shape)} vs {tuple(own[key].shape)}' for key, value in state_dict.items()
            if key in own and own[key].shape != value.shape]


def check_shapes(state_dict: StateDict, own: StateDict, hint: str = '') -> None:
    """Raise :class:`CheckpointError` naming the tensors of ``state_dict`` whose shapes differ from the model's
    (``own``, its state dict); ``hint`` (e.g. ' (another upscale?)') says what that may mean."""
    mismatched = shape_mismatches(state_dict, own)
    if mismatched:
        raise CheckpointError(f'checkpoint tensors have the wrong shape for this model{hint}: {mismatched[:5]}')


def check_state_dict_fits(model: nn.Module, state_dict: StateDict) -> None:
    """Raise CheckpointError when tensors of ``state_dict`` have other shapes than ``model``'s.

    When the mismatch is inside a model of this project whose family can name architectures
    (``architecture_of``), the message says what the checkpoint looks like and what the model is.
    """
    mismatched = shape_mismatches(state_dict, model.state_dict())
    if not mismatched:
        return
    message = f'checkpoint does not fit the model: {len(mismatched)} tensors differ in shape, e.g. {mismatched[:3]}'
    for name, module in definition_modules(model):
        prefix = f'{name}.' if name else ''
        if mismatched[0].startswith(prefix) and hasattr(module, 'architecture_of'):
            theirs = {k[len(prefix):]: v for k, v in state_dict.items() if k.startswith(prefix)}
            with contextlib.suppress(CheckpointError):  # not that family's layout after all: the shapes say enough
                message += (f'; the checkpoint looks like {module.architecture_of(theirs)}, the model is '
                            f'{module.architecture_of(module.state_dict())}')
            break
    raise CheckpointError(message)


def check_recorded_definitions(model: nn.Module, checkpoint: Checkpoint, accept: bool = False,
                               cfg_prefix: str = 'model.') -> None:
    """:func:`~nalaformer.checkpoint.definitions.check_definition` of every model a runner checkpoint records,
    at its path inside ``model``."""
    for definition in checkpoint.definitions:
        try:
            module = model.get_submodule(definition['module'])
        except AttributeError:
            raise CheckpointError(f'{checkpoint.path} holds a model at {definition["module"]!r}, which this '
                                  f'model lacks: was it written by another config?') from None
        check_definition(definition, module, accept, str(checkpoint.path), cfg_prefix)


def load_checkpoint_into(model: nn.Module, checkpoint: Checkpoint, ema: bool = False,
                         accept_definition_change: bool = False, cfg_prefix: str = 'model.') -> None:
    """Load a checkpoint into a (wrapped) model for evaluation, checking definitions and fit.

    A runner checkpoint loads strictly into the model that wrote it (every recorded definition checked).
    Any other file (the release's, a converted one, a bare state dict, a timm folder) holds one model of this
    project: its weights go to that model's ``load_weights`` (the family's layout and variant check) and must
    cover all of it, classifier included.
    """
    target = unwrap(model)
    if checkpoint.is_runner_checkpoint:
        check_recorded_definitions(target, checkpoint, accept_definition_change, cfg_prefix)
        state_dict = checkpoint.weights(ema)
        check_state_dict_fits(target, state_dict)
        result = target.load_state_dict(state_dict, strict=False)
        missing, unexpected = result.missing_keys, result.unexpected_keys
    else:
        modules = definition_modules(target)
        if len(modules) != 1:
            raise CheckpointError(f'{checkpoint.path} holds the weights of one model, but the config builds '
                                  f'{len(modules)} models of this project: load it through the backbone init_cfg')
        name, module = modules[0]
        state_dict, definition = checkpoint.model_weights(ema)
        check_definition(definition, module, accept_definition_change, str(checkpoint.path), cfg_prefix)
        result = module.load_weights(state_dict, str(checkpoint.path))
        missing, unexpected = [f'{name}.{k}' if name else k for k in result.missing_keys], []
    if missing or unexpected:
        raise CheckpointError(f'{checkpoint.path} does not hold every weight of the model: missing {missing[:10]}, '
                              f'unexpected {unexpected[:10]} (a checkpoint for another number of classes or task?)')


_LOADING = contextvars.ContextVar('nalaformer_pretrained_loading', default={})


@contextlib.contextmanager
def loading_options(**options) -> Iterator[None]:
    """Options for the ``load_pretrained`` that timm calls while building a model (it passes only the file)."""
    token = _LOADING.set(options)
    try:
        yield
    finally:
        _LOADING.reset(token)


def pretrained_options(ema: Optional[bool], accept_definition_change: Optional[bool]) -> Tuple[bool, bool]:
    """Explicit arguments of ``load_pretrained``, else those of the enclosing :func:`loading_options`."""
    options = _LOADING.get()
    return (options.get('ema', False) if ema is None else ema,
            options.get('accept_definition_change', False) if accept_definition_change is None
            else accept_definition_change)


def pretrained_weights(model: nn.Module, checkpoint: Union[PathLike, Checkpoint], ema: Optional[bool] = None,
                       accept_definition_change: Optional[bool] = None) -> StateDict:
    """The weights a model's ``load_pretrained`` should load (its own keys: the file read once, its weights
    picked once, wrapper prefixes stripped once), after the definition check."""
    ema, accept = pretrained_options(ema, accept_definition_change)
    if not isinstance(checkpoint, Checkpoint):
        checkpoint = Checkpoint.read(checkpoint)
    state_dict, definition = checkpoint.model_weights(ema)
    check_definition(definition, model, accept, str(checkpoint.path))
    return state_dict


def pretrained_kwargs(variant: str, kwargs: dict) -> Tuple[dict, dict]:
    """Split timm kwargs for ``pretrained=True`` into the model's and :func:`loading_options`'.

    ``pretrained_ema=True`` loads the checkpoint's EMA weights, ``accept_definition_change=True`` a
    checkpoint recorded with other ``attn_types`` / ``kernel_kwargs``. No weights are hosted, so a
    local file, state dict or timm folder (``timm.create_model('local-dir:DIR')``) is required; files and
    folders are read by the model's own ``load_pretrained`` (timm's ``custom_load``), which is safe,
    checks the recorded definition and names what is wrong with a checkpoint. A model named
    ``hf-hub:...`` is loaded by timm.
    """
    kwargs = dict(kwargs)
    options = dict(ema=kwargs.pop('pretrained_ema', False),
                   accept_definition_change=kwargs.pop('accept_definition_change', False))
    overlay = dict(kwargs.get('pretrained_cfg_overlay') or {})
    cfg = kwargs.get('pretrained_cfg')
    source = cfg.get('source') if isinstance(cfg, dict) else None  # set by timm for 'local-dir:' / 'hf-hub:' names
    if source == 'hf-hub':
        return kwargs, options
    if source == 'local-dir' and not overlay:
        overlay = dict(file=cfg['file'], source=None)  # the folder, read like any checkpoint
    if not (overlay.get('file') or overlay.get('state_dict')):
        raise ValueError(
            f'{variant}: no weights are hosted for download; pass a local checkpoint with '
            f"pretrained_cfg_overlay=dict(file='path/to/checkpoint.pth' or '.safetensors')")
    overlay.setdefault('custom_load', bool(overlay.get('file')))
    return {**kwargs, 'pretrained_cfg_overlay': overlay}, options


# ---------------------------------------------------------------- starting a run from pretrained weights

def _examples(keys: Sequence[str], at_most: int = 5) -> str:
    return f' ({", ".join(keys[:at_most])}{", ..." if len(keys) > at_most else ""})' if keys else ''


@dataclass(frozen=True)
class LoadReport:
    """What a model took from the checkpoint it starts from: the file, which weights (EMA or raw, of which run
    checkpoint), and how many of the model's keys it filled; :meth:`line` is the one log line of every start."""
    key: str
    path: str
    weights: str
    matched: int
    missing: Tuple[str, ...]
    unexpected: Tuple[str, ...]

    def line(self) -> str:
        return (f'{self.key}: loaded {self.path} ({self.weights}): {self.matched} keys matched, '
                f'{len(self.missing)} missing{_examples(self.missing)}, '
                f'{len(self.unexpected)} unexpected{_examples(self.unexpected)}')


def config_key_error(error: CheckpointError, key: str, path: PathLike) -> CheckpointError:
    """``error`` (same type) as one line that starts with the config ``key`` naming the file and says how to set it:
    a missing file also how to write one from a training run (docs/journey.md)."""
    if isinstance(error, MissingCheckpointError):
        advice = (f'write it from an ImageNet run with python3 tools/convert_checkpoint.py '
                  f'work_dirs/<config>/epoch_<N>.pth {path} (docs/journey.md), or set --cfg-options {key}=PATH')
    else:
        advice = f'set --cfg-options {key}=PATH to a checkpoint of this model'
    return type(error)(f'{key}: {error}; {advice}')


def _enter(model: nn.Module, checkpoint: Checkpoint, ema: bool, accept_definition_change: bool, cfg_prefix: str):
    """The checkpoint's weights (raw or EMA) handed to ``model``'s family (its layout and variant check) once,
    after the definition check; ``load_state_dict``'s result."""
    state_dict, definition = checkpoint.model_weights(ema)
    check_definition(definition, model, accept_definition_change, str(checkpoint.path), cfg_prefix)
    return model.load_weights(state_dict, str(checkpoint.path))


def load_starting_weights(model: nn.Module, path: PathLike, key: str, ema: bool = False,
                          accept_definition_change: bool = False, cfg_prefix: str = 'model.') -> LoadReport:
    """Load the weights a run starts from (a model's ``pretrained``, a backbone's ``init_cfg``) into ``model``, a
    timm model of this project: the file read once, raw or ``ema`` weights, the definition checked (overrides named
    under ``cfg_prefix``), the family's layout applied. A checkpoint error names the config ``key``
    (:func:`config_key_error`). Returns what was loaded."""
    checkpoint = check_checkpoint_file(path, key)
    try:
        result = _enter(model, checkpoint, ema, accept_definition_change, cfg_prefix)
    except CheckpointError as e:
        raise config_key_error(e, key, path) from None
    return LoadReport(key, str(path), checkpoint.describe_weights(ema),
                      len(model.state_dict()) - len(result.missing_keys), tuple(result.missing_keys),
                      tuple(result.unexpected_keys))


def check_checkpoint_file(path: PathLike, key: str) -> Checkpoint:
    """The checkpoint at ``path`` (config ``key``), read; a missing file or one that is no checkpoint raises the
    checkpoint error naming ``key``."""
    try:
        if not path:
            raise MissingCheckpointError('no checkpoint is given')
        return Checkpoint.read(path)
    except CheckpointError as e:
        raise config_key_error(e, key, path) from None


def check_starting_weights(model: nn.Module, path: PathLike, key: str, ema: bool = False,
                           accept_definition_change: bool = False, cfg_prefix: str = 'model.') -> None:
    """Before a run writes anything: the file at config ``key`` exists, is a checkpoint, holds the weights asked
    for, records a definition ``model`` computes and, for a model of this project (``load_weights``), fits its
    variant. ``model`` is built on the meta device: loading into it checks shapes and keys and copies nothing.
    Errors as :func:`load_starting_weights`'."""
    checkpoint = check_checkpoint_file(path, key)
    if not hasattr(model, 'load_weights'):  # another timm model: timm's loader checks it when the run starts
        return
    try:
        with warnings.catch_warnings():
            warnings.simplefilter('ignore')  # torch warns that copying into a meta tensor does nothing
            _enter(model, checkpoint, ema, accept_definition_change, cfg_prefix)
    except CheckpointError as e:
        raise config_key_error(e, key, path) from None
