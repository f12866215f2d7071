"""Model definitions: what a checkpoint records about the model it holds, and the check when loading it.

Attention kernels have no parameters, so nothing in a state dict tells ``nala`` from ``relu`` attention.
Every checkpoint the project writes records, under ``meta.model_definitions``, each model's timm name and
the kwargs that change its function but not its state dict (the model class's ``definition_args``, e.g.
``attn_types`` and ``kernel_kwargs``). Loading such a checkpoint into a model that computes something else
fails naming both, unless accepted explicitly. A file without definitions (the release's, a bare state
dict) loads into whatever model is built.
"""
import inspect
import json
import logging
from typing import List, Optional, Tuple

import torch.nn as nn

from ..ops.kernels import kernel_function
from .errors import DefinitionMismatchError

__all__ = ['LOADING_KWARGS', 'plain', 'model_definition', 'definition_modules', 'model_definitions', 'definition_args',
           'describe_definition', 'check_definition', 'unwrap']

_logger = logging.getLogger(__name__)

# timm.create_model kwargs of this project that say how to load weights, not what the model is.
LOADING_KWARGS = ('pretrained_ema', 'accept_definition_change')


def unwrap(model: nn.Module) -> nn.Module:
    """The model inside DDP / test-time-augmentation wrappers (their ``module``)."""
    while isinstance(getattr(model, 'module', None), nn.Module):
        model = model.module
    return model


def plain(value):
    """Tuples -> lists, recursively: the JSON form definitions are stored and compared in."""
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    return value


def _is_plain_data(value) -> bool:
    try:
        json.dumps(value)
    except (TypeError, ValueError):
        return False
    return True


def model_definition(model: nn.Module) -> dict:
    """``{'architecture': timm name, 'model_args': ...}``: the arguments that rebuild the model
    (``timm.models.get_model_args``, as in a timm hub folder's config.json), with each of the model's
    ``definition_args`` (what it computes but its state dict does not show) written out."""
    from timm.models import get_model_args
    architecture = (getattr(model, 'pretrained_cfg', None) or {}).get('architecture')
    args = {k: plain(v) for k, v in get_model_args(model).items() if k not in LOADING_KWARGS}
    dropped = sorted(k for k, v in args.items() if not _is_plain_data(v))
    if dropped:  # checkpoints hold plain data only (they are read without unpickling objects)
        _logger.warning(f'model arguments {dropped} are not plain data and are not recorded in checkpoints')
    args = {k: v for k, v in args.items() if k not in dropped}
    args.update({name: plain(getattr(model, name)) for name in model.definition_args})
    return {'architecture': architecture, 'model_args': args}


def definition_modules(model: nn.Module) -> List[Tuple[str, nn.Module]]:
    """(name, module) of every model of this project inside ``model`` (itself: name '')."""
    return [(name, module) for name, module in model.named_modules() if hasattr(module, 'definition_args')]


def model_definitions(model: nn.Module) -> List[dict]:
    """What a checkpoint of ``model`` records: :func:`model_definition` of each project model inside it,
    with its ``module`` path (DDP / TTA wrappers unwrapped)."""
    model = unwrap(model)
    return [dict(model_definition(module), module=name) for name, module in definition_modules(model)]


def definition_args(model_args: dict, model_cls: type) -> dict:
    """The ``definition_args`` of ``model_cls`` out of recorded ``model_args``; one left out (a folder written
    for a default model) is the class's default."""
    defaults = inspect.signature(model_cls).parameters
    return {name: plain(model_args[name] if name in model_args else defaults[name].default)
            for name in model_cls.definition_args}


def _function(model_args: dict) -> dict:
    """What definition arguments compute: kernels compared through :func:`kernel_function` (defaults
    filled in, fused implementations equal to the reference)."""
    args = dict(model_args)
    if 'attn_types' in args:
        attn_types = args.pop('attn_types')
        kernel_kwargs = args.pop('kernel_kwargs', None) or [None] * len(attn_types)
        args['attn_types'] = [kernel_function(attn_type, kwargs)
                              for attn_type, kwargs in zip(attn_types, kernel_kwargs)]
    return args


def describe_definition(architecture: Optional[str], args: dict) -> str:
    return f'{architecture or "model"}({", ".join(f"{k}={v!r}" for k, v in args.items())})'


def _cfg_option(key: str, value) -> str:
    """How ``value`` is written on an mmengine ``--cfg-options`` command line (dicts cannot be)."""
    def written(v):
        if isinstance(v, list):
            parts = [written(x) for x in v]
            return None if None in parts else f'[{",".join(parts)}]'
        return None if isinstance(v, dict) else str(v)
    if isinstance(value, list) and all(v is None for v in value):
        value = None
    text = written(value)
    return f'{key}="{text}"' if text is not None else f'{key}={value!r} (in the config file)'


def check_definition(recorded: Optional[dict], model: nn.Module, accept: bool = False, source: str = 'checkpoint',
                     cfg_prefix: str = 'model.') -> None:
    """Raise :class:`DefinitionMismatchError` when ``model`` computes another function than ``recorded``.

    ``recorded`` None (a file without definitions) always passes; ``accept`` turns a mismatch into a
    warning. ``cfg_prefix`` is where the model's kwargs sit in a config, for the suggested override.
    """
    if recorded is None:
        return
    theirs = definition_args(recorded['model_args'], type(model))
    own = {name: plain(getattr(model, name)) for name in model.definition_args}
    if _function(theirs) == _function(own):
        return
    architecture = (getattr(model, 'pretrained_cfg', None) or {}).get('architecture')
    message = (f'{source} was trained as {describe_definition(recorded.get("architecture"), theirs)} but the model is '
               f'{describe_definition(architecture, own)}')
    if accept:
        _logger.warning(f'{message}; loading anyway (accept_definition_change)')
        return
    overrides = ' '.join(_cfg_option(f'{cfg_prefix}{k}', v) for k, v in theirs.items())
    kwargs = ', '.join(f'{k}={v!r}' for k, v in theirs.items())
    raise DefinitionMismatchError(
        f'{message}. Attention kernels have no weights, so these would load and silently compute another '
        f'function. Build the model the checkpoint describes (tools: --cfg-options {overrides}; Python: '
        f'timm.create_model({recorded.get("architecture")!r}, {kwargs})), or accept the difference explicitly '
        f'(tools/test.py --accept-definition-change; accept_definition_change=True in timm.create_model, '
        f'load_pretrained or a backbone init_cfg).')
