"""What the model families share: per-stage arguments and attention kernels, timm default cfgs, building a
variant (with pretrained weights) and loading a checkpoint into it.

Each family file (:mod:`~nalaformer.models.nalaformer`, :mod:`~nalaformer.models.nala_swin`,
:mod:`~nalaformer.models.nala_sr`) keeps what is its own: the architecture, its variants' ``MODEL_ARGS``,
its state-dict layout (``checkpoint_filter_fn``) and its timm entrypoints, written out as timm writes them.
"""
import logging
from typing import Callable, Dict, Iterable, Mapping, Optional, Sequence, Tuple, Type, Union

import torch
import torch.nn as nn
from timm.data import IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD
from timm.layers import trunc_normal_
from timm.models import build_model_with_cfg, generate_default_cfgs

from ..checkpoint.errors import CheckpointError
from ..checkpoint.loading import loading_options, pretrained_kwargs
from ..ops.kernels import build_attention_kernel

__all__ = ['per_stage', 'per_stage_kernels', 'resolve_attn_types', 'model_cfgs', 'build_model', 'load_weights',
           'drop_other_classifier', 'trunc_normal_init', 'set_stage_grad_checkpointing']

_logger = logging.getLogger(__name__)

StateDict = Dict[str, torch.Tensor]
FilterFn = Callable[[StateDict, nn.Module], StateDict]


def per_stage(value, num_stages: int, name: str) -> tuple:
    """``value`` once per stage: a single value (None, a number, a string or a dict) for every stage, or a
    sequence with one entry per stage (any other length is an error naming ``name``)."""
    if value is None or isinstance(value, (str, int, float, Mapping)):
        return (value,) * num_stages
    value = tuple(value)
    if len(value) != num_stages:
        raise ValueError(f'{name} has {len(value)} entries but the model has {num_stages} stages: {list(value)}')
    return value


def per_stage_kernels(attn_types: Union[str, Sequence[str]],
                      kernel_kwargs: Union[None, Mapping, Sequence[Optional[Mapping]]],
                      num_stages: int) -> Tuple[Tuple[str, ...], Tuple[Optional[dict], ...]]:
    """The ``attn_types`` / ``kernel_kwargs`` of every model family, one entry per stage.

    attn_types: one kernel name for every stage, or one per stage. kernel_kwargs: None, one dict for
    every stage, or one dict (or None) per stage, e.g. ``(dict(alpha=5.), dict(alpha=5.), None, None)``.
    """
    attn_types = per_stage(attn_types, num_stages, 'attn_types')
    kernel_kwargs = per_stage(kernel_kwargs, num_stages, 'kernel_kwargs')
    return attn_types, tuple(None if kwargs is None else dict(kwargs) for kwargs in kernel_kwargs)


def resolve_attn_types(attn_types: Union[str, Sequence[str]],
                       kernel_kwargs: Union[None, Mapping, Sequence[Optional[Mapping]]],
                       num_stages: int, own_attn_type: str, own_meaning: str, family: str, unit: str = 'stage'
                       ) -> Tuple[Tuple[str, ...], Tuple[Optional[dict], ...]]:
    """:func:`per_stage_kernels`, checked for a family with a kind of stage of its own besides the kernels.

    Each ``attn_type`` is ``own_attn_type`` (the family's own kind, ``own_meaning``, e.g. NaLa-Swin's
    ``'shifted_window'``; it takes no kernel arguments) or a registered kernel that takes its ``unit``'s (stage
    or group) ``kernel_kwargs``. Errors (ValueError) name ``family`` and its own kind.
    """
    if attn_types is None:
        raise ValueError(f"attn_types=None is ambiguous; write attn_types={own_attn_type!r} for {own_meaning}, "
                         f"or a kernel name such as 'nala'")
    attn_types, kernel_kwargs = per_stage_kernels(attn_types, kernel_kwargs, num_stages)
    for index, (attn_type, kwargs) in enumerate(zip(attn_types, kernel_kwargs)):
        if attn_type == own_attn_type:
            if kwargs:
                raise ValueError(
                    f'{unit} {index} is {own_attn_type!r} ({own_meaning}), which takes no kernel_kwargs, got {kwargs}; '
                    f'give kernel_kwargs per {unit} with None for it, e.g. '
                    f'kernel_kwargs=(dict(power=3.), dict(power=3.), None, None)')
            continue
        try:
            build_attention_kernel(attn_type, **(kwargs or {}))
        except ValueError as err:
            raise ValueError(f'{err}; {family} also takes {own_attn_type!r} ({own_meaning})') from None
    return attn_types, kernel_kwargs


def model_cfgs(variants: Iterable[str], first_conv: str, classifier: str, paper_name: str, **kwargs) -> dict:
    """timm's default cfgs of ``variants``, models of the paper trained on ImageNet-1k at 224 x 224
    (``kwargs`` add keys)."""
    return generate_default_cfgs({variant: {
        'url': '',
        'num_classes': 1000, 'input_size': (3, 224, 224), 'pool_size': (7, 7),
        'crop_pct': 0.875, 'interpolation': 'bicubic', 'fixed_input_size': False,
        'mean': IMAGENET_DEFAULT_MEAN, 'std': IMAGENET_DEFAULT_STD,
        'first_conv': first_conv, 'classifier': classifier,
        'paper_ids': 'arXiv:2506.21137', 'paper_name': paper_name,
        **kwargs,
    } for variant in variants})


def build_model(model_cls: Type[nn.Module], variant: str, pretrained: bool, model_args: Mapping,
                filter_fn: FilterFn, **kwargs) -> nn.Module:
    """A family's ``variant`` built by timm's ``build_model_with_cfg`` from its ``model_args`` updated by
    ``kwargs``, with features at its four stages.

    With ``pretrained``, ``pretrained_ema`` / ``accept_definition_change`` in ``kwargs`` reach the
    model's ``load_pretrained`` (see :func:`nalaformer.checkpoint.loading.pretrained_kwargs`).
    """
    options = {}
    if pretrained:
        kwargs, options = pretrained_kwargs(variant, kwargs)
    with loading_options(**options):
        return build_model_with_cfg(
            model_cls, variant, pretrained,
            pretrained_filter_fn=filter_fn,
            feature_cfg=dict(out_indices=(0, 1, 2, 3), feature_cls='getter'),
            **{**model_args, **kwargs},
        )


def trunc_normal_init(module: nn.Module, layer_type: Type[nn.Module]):
    """For ``model.apply``: a ``layer_type`` module's weight truncated normal (std .02), its bias zero."""
    if isinstance(module, layer_type):
        trunc_normal_(module.weight, std=.02)
        if module.bias is not None:
            nn.init.zeros_(module.bias)


def set_stage_grad_checkpointing(model: nn.Module, stages: Iterable[nn.Module], enable: Union[bool, str]):
    """``model.set_grad_checkpointing(enable)`` of a family whose ``stages`` recompute in backward: True
    whole blocks, ``'selective'`` all but the matrix products (:mod:`nalaformer.models.recompute`)."""
    if enable not in (True, False, 'selective'):
        raise ValueError(f"grad checkpointing is True, False or 'selective', got {enable!r}")
    model.grad_checkpointing = enable
    for stage in stages:
        stage.grad_checkpointing = enable


def load_weights(model: nn.Module, state_dict: StateDict, filter_fn: FilterFn, source: str = 'checkpoint',
                 strict: bool = True, missing_hint: str = ''):
    """Load weights with the model's own keys (:meth:`nalaformer.checkpoint.reading.Checkpoint.model_weights`)
    into ``model`` through its family's ``filter_fn`` (the family's layout); returns ``load_state_dict``'s result.

    The classifier may be missing (the filter leaves out one of another number of classes). Other
    weights the model has and the checkpoint lacks raise :class:`CheckpointError` naming ``source`` (ending in
    ``missing_hint``), or with ``strict=False`` keep their init, with a warning. Weights the model
    lacks (stages or head of a model pruned for feature extraction) are ignored, with a log line.
    """
    result = model.load_state_dict(filter_fn(state_dict, model), strict=False)
    missing = [k for k in result.missing_keys if not k.startswith('head.')]
    if missing and strict:
        raise CheckpointError(f'{source} lacks weights of this model: {missing[:10]}{missing_hint}')
    if missing:
        _logger.warning(f'{source}: {len(missing)} weights not in the checkpoint keep their init: {missing[:10]}')
    if result.unexpected_keys:
        _logger.info(f'{source}: ignored weights this model does not have: {result.unexpected_keys[:10]}')
    return result


def drop_other_classifier(state_dict: StateDict, own: StateDict, classifier: str) -> StateDict:
    """``state_dict`` without the weight and bias of ``classifier`` where the model's (``own``) differ in
    shape or are absent: another number of classes (fine-tuning) keeps the model's fresh classifier."""
    for key in (f'{classifier}.weight', f'{classifier}.bias'):
        if key in state_dict and (key not in own or own[key].shape != state_dict[key].shape):
            del state_dict[key]
    return state_dict
