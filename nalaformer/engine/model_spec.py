"""The one seam from a config to its timm model: which part of the config it is, and with which keywords.

Each task wrapper (a model class registered in an mmengine / OpenMMLab ``MODELS`` registry that builds a timm
model: :class:`~nalaformer.classification.TimmClassifier`, :class:`~nalaformer.sr.SRModel`, the dense
``NaLaBackbone`` and any added later) implements ``timm_model_spec(model_cfg, prefix)`` returning a
:class:`TimmModelSpec`; :func:`nalaformer.engine.launch.model_spec` finds the wrapper in a config and asks it.
Every command (keyword check, resume fit, export, analysis, test) asks there, and builds the model on the meta
device once (:meth:`TimmModelSpec.meta_model`).
"""
import difflib
import inspect
from dataclasses import dataclass, field
from typing import Dict, FrozenSet, Optional, Tuple

import timm
import torch

from ..errors import ConfigError

__all__ = ['TimmModelSpec', 'UnknownModelError', 'check_model_name']

# Keys of a model dict that are mmengine's (the registry's), not the wrapper's nor the model's.
REGISTRY_KEYS = frozenset({'type', '_scope_'})
_META_MODELS: Dict[str, torch.nn.Module] = {}  # timm name and kwargs -> the model built on the meta device


class UnknownModelError(ConfigError):
    """A timm model name that timm does not know (a ValueError, as the wrappers raised before)."""


def check_model_name(name, key: str = 'model.arch') -> None:
    """Raise :class:`UnknownModelError` naming ``key`` and similar timm names when ``name`` is not a timm model."""
    models = timm.list_models()
    if isinstance(name, str) and name in models:
        return
    close = difflib.get_close_matches(str(name), models, n=5, cutoff=0.75) or \
        timm.list_models(f'*{str(name).split("_")[0]}*')[:10]
    raise UnknownModelError(f'unknown timm model {name!r} ({key}); similar names: {close}')


@dataclass(frozen=True)
class TimmModelSpec:
    """The timm model of a config, as its wrapper builds it.

    Attributes:
        prefix: the config key of the wrapper's dict, with its dot (``'model.'``, ``'model.backbone.'``).
        name: the timm model name.
        kwargs: the keyword arguments the wrapper gives ``timm.create_model`` that belong to the model (the
            wrapper's own arguments left out, e.g. ``pretrained``, ``out_indices``).
        wrapper: the wrapper class; ``wrapper_args``: its own arguments.
        weight_options: the wrapper's arguments that load weights when it is built (``pretrained``,
            ``init_cfg``): a command that loads a checkpoint of its own sets them to None.
        weights_prefix: where the timm model's weights sit in the wrapper's state dict (``'model.'``), None
            when the wrapper holds them in another layout (a features-only backbone).
    """
    prefix: str
    name: str
    kwargs: Dict[str, object]
    wrapper: type
    wrapper_args: FrozenSet[str] = frozenset()
    weight_options: Tuple[str, ...] = ()
    weights_prefix: Optional[str] = None
    key: str = field(default='arch')  # the wrapper's argument naming the timm model

    @classmethod
    def of_wrapper(cls, wrapper: type, model_cfg: dict, prefix: str, name: str, model_args: Optional[dict] = None,
                   **fields) -> 'TimmModelSpec':
        """The spec of ``wrapper`` built from ``model_cfg``: every entry that is not one of the wrapper's own
        arguments goes to the model (as the wrapper's ``**model_kwargs``), and ``model_args`` (wrapper
        arguments it hands the model too, e.g. ``upscale``) are added."""
        own = frozenset(p for p in inspect.signature(wrapper).parameters if p not in ('self', 'model_kwargs'))
        kwargs = {k: v for k, v in dict(model_cfg).items() if k not in own and k not in REGISTRY_KEYS}
        return cls(prefix, name, {**kwargs, **(model_args or {})}, wrapper, own, **fields)

    def part(self, cfg) -> dict:
        """The wrapper's dict in ``cfg`` (a Config or dict), to read or change."""
        node = cfg
        for key in self.prefix.rstrip('.').split('.'):
            node = node[int(key)] if isinstance(node, (list, tuple)) else node[key]
        return node

    def meta_model(self) -> torch.nn.Module:
        """``timm.create_model(name, **kwargs)`` on the meta device (shapes and definition, no memory), built once
        per command; the model's own errors (TypeError, ValueError) propagate."""
        check_model_name(self.name, f'{self.prefix}{self.key}')
        cache_key = repr((self.name, sorted(self.kwargs.items())))
        if cache_key not in _META_MODELS:
            with torch.device('meta'):
                model = timm.create_model(self.name, **self.kwargs)
            while len(_META_MODELS) >= 8:  # the commands of one process (tests) ask for a few models at most
                _META_MODELS.pop(next(iter(_META_MODELS)))
            _META_MODELS[cache_key] = model
        return _META_MODELS[cache_key]
