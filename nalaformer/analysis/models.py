"""Model specs for the analysis tools: names, kwargs, config files, benchmark entries, clear errors.

A spec is a timm model name, optionally with keyword arguments in call syntax, or the path
of a Python config file with a ``model = dict(...)`` entry::

    nalaformer_t
    nalaformer_t(attn_types='nala')
    swin_tiny_patch4_window7_224
    configs/nalaformer/nalaformer-t_8xb128_in1k.py
"""
import ast
import difflib
import inspect
import runpy
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Dict, FrozenSet, Optional, Tuple

import timm
import torch
import torch.nn as nn
from timm.models import get_pretrained_cfg_value

import nalaformer  # noqa: F401  (registers the nalaformer_* models in timm)
from ..errors import ConfigError

__all__ = ['ModelSpecError', 'ModelSpec', 'VARIANTS', 'parse_model_spec', 'parse_entry', 'check_model_name',
           'model_parameters', 'create_model']

# Where OpenMMLab model dicts name the timm model: ours (TimmClassifier, NaLaBackbone) use ``arch``,
# mmpretrain's TIMMBackbone ``model_name``; a dict may also be the timm model itself (``type``).
NAME_KEYS = ('arch', 'model_name', 'type')
# Prefixes of a benchmark's model entry: our model on another NaLa backend, or the release's model.
BACKEND_VARIANTS = ('fused', 'reference')
VARIANTS = (*BACKEND_VARIANTS, 'release')


class ModelSpecError(ConfigError):
    """An unknown model, an unreadable config, or an argument the model does not take or a value it rejects; the
    message says what to do instead."""


@dataclass(frozen=True)
class ModelSpec:
    """A timm model name with its kwargs; ``label`` is how results name it."""
    name: str
    kwargs: Dict[str, object] = field(default_factory=dict)
    label: str = ''

    def __post_init__(self):
        if not self.label:
            object.__setattr__(self, 'label', self.name)


def parse_model_spec(spec: str) -> ModelSpec:
    """Parse ``name``, ``name(key=value, ...)`` (Python literals) or a config file path."""
    if spec.endswith('.py'):
        return _spec_from_config(Path(spec))
    name, kwargs = spec.strip(), {}
    if '(' in name:
        name, args = name.split('(', 1)
        kwargs = _literal_kwargs(args, spec)
    check_model_name(name)
    return ModelSpec(name, kwargs, spec.strip())


def parse_entry(text: str) -> Tuple[ModelSpec, Optional[str]]:
    """A benchmark's model entry: its spec (labelled with the whole entry) and its :data:`VARIANTS` prefix, if any
    (``fused:<spec>``, ``reference:<spec>``, ``release:<spec>``)."""
    variant, _, rest = text.partition(':')
    if variant not in VARIANTS or not rest:
        return parse_model_spec(text), None
    spec = parse_model_spec(rest)
    return ModelSpec(spec.name, spec.kwargs, text.strip()), variant


def _literal_kwargs(args: str, spec: str) -> Dict[str, object]:
    try:
        call = ast.parse(f'f({args}', mode='eval').body
        if call.args:
            raise ValueError('positional arguments are not allowed')
        return {kw.arg: ast.literal_eval(kw.value) for kw in call.keywords}
    except (SyntaxError, ValueError) as e:
        raise ModelSpecError(
            f"cannot parse model spec {spec!r} ({e}); write it as name(key=value, ...) with Python "
            f"literals, e.g. \"nalaformer_t(attn_types='nala')\"") from None


def check_model_name(name: str):
    """Raise :class:`ModelSpecError` listing close timm names when ``name`` is not a model."""
    if timm.is_model(name):
        return
    known = timm.list_models()
    close = sorted(set(timm.list_models(f'*{name}*')[:10]) | set(difflib.get_close_matches(name, known, n=5)))
    hint = f'close names: {", ".join(close)}' if close else "see timm.list_models('*pattern*')"
    raise ModelSpecError(f'unknown model {name!r}; {hint}')


def _spec_from_config(path: Path) -> ModelSpec:
    """The timm model of a config: where a task wrapper of this project builds it, the wrapper's answer
    (:func:`nalaformer.engine.launch.model_spec`, the one seam every command asks); in other configs
    (mmpretrain's TIMMBackbone, a bare timm ``type``), ``model`` or ``model['backbone']`` naming one in a
    :data:`NAME_KEYS` entry, with the entries of that dict the model takes (:func:`model_parameters`)."""
    if not path.is_file():
        raise ModelSpecError(f'config file {path} does not exist')
    model_cfg, spec = _read_config_model(path)
    if spec is not None:
        check_model_name(spec.name)
        part = '' if spec.prefix == 'model.' else ' (backbone only)'
        return ModelSpec(spec.name, dict(spec.kwargs), f'{path.name}: {spec.name}{part}')
    for candidate in (model_cfg, model_cfg.get('backbone')):
        if not isinstance(candidate, dict):
            continue
        name = next((candidate[k] for k in NAME_KEYS if isinstance(candidate.get(k), str)
                     and timm.is_model(candidate[k])), None)
        if name:
            taken = model_parameters(name)
            kwargs = {k: v for k, v in candidate.items() if k in taken}
            part = '' if candidate is model_cfg else ' (backbone only)'
            return ModelSpec(name, kwargs, f'{path.name}: {name}{part}')
    raise ModelSpecError(
        f"{path}: neither model nor model['backbone'] names a timm model in {NAME_KEYS} "
        f'(got {model_cfg!r:.200})')


def _read_config_model(path: Path):
    """The config's ``model`` dict and, when mmengine can read the config, its timm model spec (or None)."""
    try:
        from mmengine.config import Config
    except ImportError:
        namespace = runpy.run_path(str(path))
        if '_base_' in namespace:
            raise ModelSpecError(
                f'{path} inherits _base_ files; reading it needs mmengine (pip install mmengine), '
                f'or pass the timm model name instead') from None
        model, spec = namespace.get('model'), None
    else:
        from ..engine.launch import model_spec
        cfg = Config.fromfile(str(path))
        model = cfg.to_dict().get('model')
        spec = model_spec(cfg) if isinstance(model, dict) else None
    if not isinstance(model, dict):
        raise ModelSpecError(f'{path} has no `model = dict(type=..., ...)` entry')
    return dict(model), spec


@lru_cache(maxsize=None)
def model_parameters(name: str) -> FrozenSet[str]:
    """The keyword arguments the class of timm model ``name`` takes by name (its ``__init__``'s parameters).

    The class is found by building the model on the meta device (no memory, no weights), or, where the meta
    device cannot build it, on the CPU.
    """
    try:
        with torch.device('meta'):
            model_class = type(timm.create_model(name))
    except (RuntimeError, NotImplementedError):  # e.g. an .item() while building
        model_class = type(timm.create_model(name))
    kinds = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    return frozenset(p.name for p in inspect.signature(model_class).parameters.values() if p.kind in kinds)


def create_model(spec: ModelSpec, img_size: Optional[Tuple[int, int]] = None,
                 checkpoint: Optional[str] = None, **kwargs) -> nn.Module:
    """timm model of ``spec`` (random init unless ``checkpoint``), built for ``img_size`` (H, W).

    Models with a fixed input size (ViT, Swin: ``fixed_input_size`` in their timm cfg) get
    ``img_size`` at construction; the others accept any size as they are.
    """
    kwargs = {**spec.kwargs, **kwargs}
    if img_size is not None and get_pretrained_cfg_value(spec.name, 'fixed_input_size'):
        kwargs.setdefault('img_size', tuple(img_size))
    if checkpoint:
        kwargs['pretrained_cfg_overlay'] = dict(file=str(checkpoint))
    try:
        return timm.create_model(spec.name, pretrained=bool(checkpoint), **kwargs)
    except (TypeError, ValueError) as e:  # a kwarg the model does not take, or a value it rejects
        raise ModelSpecError(f'{spec.label}: {e}') from None
