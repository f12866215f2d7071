"""NaLaFormer: a hierarchical vision backbone with norm-aware linear attention.

Paper: "NaLaFormer: Norm-Aware Linear Attention for Transformer Models" (arXiv 2506.21137),
ICML 2026 version "Norm x Direction: Restoring the Missing Query Norm in Vision Linear
Attention". The models here reproduce the authors' release numerically and keep its
state-dict layout, so its checkpoints load as they are:

    timm.create_model('nalaformer_t', pretrained=True, pretrained_cfg_overlay=dict(file='nala_t.pth'))

Per-stage attention kernels (``attn_types``) default to the release's hybrid
``('nala', 'nala', 'softmax', 'softmax')``; ``attn_types='nala'`` makes every stage NaLa.

For inference, ``timm.utils.reparameterize_model(model.eval())`` returns a copy with the folds of
:mod:`nalaformer.models.layers` (residual depthwise convs, LayerScale, the stem's and downsamplings'
BatchNorms): the same outputs up to float rounding, less work. The head's BatchNorm stays (it follows a
per-token Linear on a 1/32-scale map: under 0.1% of the time). That copy is for inference only: its state
dict lacks the ``gamma_*`` and folded BatchNorm entries.
"""
import re
from typing import Dict, List, Mapping, Optional, Sequence, Tuple, Union

import torch
import torch.nn as nn
from timm.layers import SelectAdaptivePool2d, calculate_drop_path_rates
from timm.models import register_model
from timm.models._features import feature_take_indices

from ..checkpoint.definitions import definition_args, plain
from ..checkpoint.errors import CheckpointError
from ..checkpoint.loading import check_shapes, pretrained_weights, shape_mismatches
from ..checkpoint.reading import Checkpoint, strip_wrapper_prefixes
from .family import (
    build_model, drop_other_classifier, load_weights, model_cfgs, per_stage, per_stage_kernels,
    set_stage_grad_checkpointing, trunc_normal_init,
)
from .layers import NaLaStage, Stem

__all__ = ['NaLaFormer', 'MODEL_ARGS', 'checkpoint_filter_fn', 'describe_architecture', 'variant_of',
           'name_architecture']

RELEASE_ATTN_TYPES = ('nala', 'nala', 'softmax', 'softmax')

# The release's architectures. Drop path is 0 unless asked, as in timm; the training recipe's
# rates (XT/T 0.1, S 0.15, B 0.4, L 0.55) are stated in the configs.
MODEL_ARGS: Dict[str, dict] = {
    'nalaformer_xt': dict(embed_dims=(32, 64, 128, 384), depths=(2, 2, 2, 2), num_heads=(1, 2, 4, 12),
                          mlp_ratios=(3.5,) * 4, layer_scale_init_values=(1., 1., 1., 1.)),
    'nalaformer_t': dict(embed_dims=(64, 128, 256, 512), depths=(2, 2, 6, 2), num_heads=(1, 2, 4, 8),
                         mlp_ratios=(4.,) * 4, layer_scale_init_values=(1., 1., 1., 1.)),
    'nalaformer_s': dict(embed_dims=(64, 128, 320, 512), depths=(3, 5, 9, 3), num_heads=(1, 2, 5, 8),
                         mlp_ratios=(3.5,) * 4, layer_scale_init_values=(1., 1., 1., 1.)),
    'nalaformer_b': dict(embed_dims=(96, 192, 384, 512), depths=(4, 6, 12, 6), num_heads=(1, 2, 6, 8),
                         mlp_ratios=(4.,) * 4, layer_scale_init_values=(1., 1., 1e-6, 1e-6)),
    'nalaformer_l': dict(embed_dims=(96, 192, 448, 640), depths=(4, 7, 19, 8), num_heads=(1, 2, 7, 10),
                         mlp_ratios=(3.5,) * 4, layer_scale_init_values=(1e-6,) * 4),
}


class NaLaFormer(nn.Module):
    """NaLaFormer backbone and classifier.

    Args:
        in_chans: input channels. num_classes: classes (0 drops the classifier).
        global_pool: timm pooling type ('avg' as released, '' for none).
        embed_dims, depths, num_heads, mlp_ratios: per-stage widths, block counts, heads, FFN ratios.
        attn_types: per-stage kernel names (a single name applies to every stage).
        kernel_kwargs: extra arguments of the kernels: one dict for every stage, or one dict (or None)
            per stage, e.g. ``(dict(alpha=5.), dict(alpha=5.), None, None)`` with
            ``attn_types=('nala_cos', 'nala_cos', 'softmax', 'softmax')``.
        layer_scale_init_values: per-stage LayerScale init (None, or None entries, disables it).
        head_hidden_size: width of the per-token projection before the classifier (1024).
        conv_mixers: False removes the convolutional token mixing of every block (CPE, LePE, the FFN's
            depthwise conv), so that attention is the only way tokens interact (a study variant; the
            stem and the downsampling convolutions stay).
        drop_rate: dropout before the classifier. drop_path_rate: stochastic depth, linear over blocks.

    Shapes: ``forward_features`` (B, in_chans, H, W) -> (B, embed_dims[-1], H/32, W/32) (convs round
    up odd sizes); ``forward_head`` -> (B, num_classes), or (B, head_hidden_size) with pre_logits.
    """
    # Arguments that change what the model computes but not its state dict: checkpoints record them.
    definition_args = ('attn_types', 'kernel_kwargs')

    def __init__(
            self,
            in_chans: int = 3,
            num_classes: int = 1000,
            global_pool: str = 'avg',
            embed_dims: Sequence[int] = (64, 128, 256, 512),
            depths: Sequence[int] = (2, 2, 6, 2),
            num_heads: Sequence[int] = (1, 2, 4, 8),
            mlp_ratios: Union[float, Sequence[float]] = 4.,
            attn_types: Union[str, Sequence[str]] = RELEASE_ATTN_TYPES,
            kernel_kwargs: Union[None, Mapping, Sequence[Optional[Mapping]]] = None,
            layer_scale_init_values: Union[None, float, Sequence[Optional[float]]] = 1.,
            head_hidden_size: int = 1024,
            conv_mixers: bool = True,
            drop_rate: float = 0.,
            drop_path_rate: float = 0.,
            device=None,
            dtype=None,
    ):
        super().__init__()
        dd = dict(device=device, dtype=dtype)
        num_stages = len(depths)
        embed_dims = per_stage(embed_dims, num_stages, 'embed_dims')
        num_heads = per_stage(num_heads, num_stages, 'num_heads')
        mlp_ratios = per_stage(mlp_ratios, num_stages, 'mlp_ratios')
        attn_types, kernel_kwargs = per_stage_kernels(attn_types, kernel_kwargs, num_stages)
        layer_scale_init_values = per_stage(layer_scale_init_values, num_stages, 'layer_scale_init_values')
        self.num_classes = num_classes
        self.in_chans = in_chans
        self.drop_rate = drop_rate
        self.attn_types = attn_types
        self.kernel_kwargs = kernel_kwargs
        self.num_features = embed_dims[-1]
        self.head_hidden_size = head_hidden_size
        self.grad_checkpointing = False

        self.patch_embed = Stem(in_chans, embed_dims[0], **dd)
        dpr = calculate_drop_path_rates(drop_path_rate, list(depths), stagewise=True)
        self.layers = nn.ModuleList()
        self.feature_info = []
        for i in range(num_stages):
            self.layers.append(NaLaStage(
                embed_dims[i], depths[i], num_heads[i], mlp_ratios[i], attn_types[i],
                out_dim=embed_dims[i + 1] if i + 1 < num_stages else None,
                drop_path=dpr[i],
                layer_scale_init_value=layer_scale_init_values[i],
                kernel_kwargs=kernel_kwargs[i], conv_mixers=conv_mixers, **dd))
            self.feature_info.append(dict(num_chs=embed_dims[i], reduction=4 * 2 ** i, module=f'layers.{i}'))

        # Head as released: per-token Linear -> BatchNorm -> Swish -> pool -> 1x1 conv classifier.
        self.proj = nn.Linear(self.num_features, head_hidden_size, **dd)
        self.norm = nn.BatchNorm2d(head_hidden_size, **dd)
        self.act = nn.SiLU()
        self.global_pool = SelectAdaptivePool2d(pool_type=global_pool)
        self.head_drop = nn.Dropout(drop_rate)
        self.head = self._make_classifier(num_classes)
        self.apply(self._init_weights)

    def _make_classifier(self, num_classes: int) -> nn.Module:
        if num_classes <= 0:
            return nn.Identity()
        ref = self.proj.weight if isinstance(self.proj, nn.Linear) else next(self.parameters())
        in_chs = self.head_hidden_size * self.global_pool.feat_mult()
        return nn.Conv2d(in_chs, num_classes, 1, device=ref.device, dtype=ref.dtype)

    @staticmethod
    def _init_weights(m: nn.Module):
        # As released: only convolutions are re-initialised; Linear keeps PyTorch's default init.
        trunc_normal_init(m, nn.Conv2d)

    @torch.jit.ignore
    def no_weight_decay(self) -> set:
        # As released (its list names absolute_pos_embed, which the model does not have): timm's optimizer
        # factory exempts norms and biases (ndim <= 1, .bias) only; LayerScale, shape (1, C, 1, 1), decays.
        return set()

    @torch.jit.ignore
    def group_matcher(self, coarse: bool = False) -> dict:
        return dict(
            stem=r'^patch_embed',
            blocks=r'^layers\.(\d+)' if coarse else [
                (r'^layers\.(\d+)\.downsample', (0,)),
                (r'^layers\.(\d+)\.blocks\.(\d+)', None),
                (r'^layers\.(\d+)\.RoPE', (0,)),
                (r'^proj|^norm', (99999,)),
            ],
        )

    @torch.jit.ignore
    def set_grad_checkpointing(self, enable: Union[bool, str] = True):
        """True: recompute whole blocks in backward; ``'selective'``: recompute all but the matrix
        products (:mod:`nalaformer.models.recompute`: less memory than none, less time than True)."""
        set_stage_grad_checkpointing(self, self.layers, enable)

    @torch.jit.ignore
    def get_classifier(self) -> nn.Module:
        return self.head

    def reset_classifier(self, num_classes: int, global_pool: Optional[str] = None):
        self.num_classes = num_classes
        if global_pool is not None:
            self.global_pool = SelectAdaptivePool2d(pool_type=global_pool).train(self.training)
        self.head = self._make_classifier(num_classes).train(self.training)

    @torch.jit.ignore
    def load_pretrained(self, checkpoint: Union[str, Checkpoint], ema: Optional[bool] = None,
                        accept_definition_change: Optional[bool] = None):
        """Load a checkpoint of ours or of the release (.pth, .safetensors or a timm folder) with clear errors.

        ``ema``: its EMA weights (an error if it has none). A checkpoint recorded with other
        ``attn_types`` / ``kernel_kwargs`` fails unless ``accept_definition_change``. A classifier of
        another number of classes is left out (fine-tuning): see the returned missing keys.
        """
        return self.load_weights(pretrained_weights(self, checkpoint, ema, accept_definition_change), str(checkpoint))

    @torch.jit.ignore
    def load_weights(self, state_dict: Dict[str, torch.Tensor], source: str = 'checkpoint'):
        """Load weights with this model's own keys through the family's layout (:func:`checkpoint_filter_fn`)."""
        return load_weights(self, state_dict, checkpoint_filter_fn, source)

    @staticmethod
    def architecture_of(state_dict: Dict[str, torch.Tensor]) -> str:
        """What a NaLaFormer state dict is: 'nalaformer_t (embed_dims=[...], ...)' or 'an unknown configuration
        (...)'; :class:`CheckpointError` when it is not a NaLaFormer state dict."""
        return name_architecture(describe_architecture(state_dict))

    @classmethod
    def release_definition(cls, state_dict: Dict[str, torch.Tensor]) -> dict:
        """The definition of a NaLaFormer state dict that records none (the release's ``.pth``): its
        architecture read off the tensors, the release's hybrid attention written out."""
        arch = describe_architecture(state_dict)
        variant = variant_of(arch)
        args = dict(arch) if variant is None else {}
        for name, key, dim in (('in_chans', 'patch_embed.proj.0.weight', 1), ('head_hidden_size', 'proj.weight', 0)):
            if key not in state_dict:
                raise CheckpointError(f'it lacks {key}, so it is not a whole NaLaFormer')
            args[name] = state_dict[key].shape[dim]
        args['num_classes'] = state_dict['head.weight'].shape[0] if 'head.weight' in state_dict else 0
        if not any('.gamma_1' in k for k in state_dict):
            args['layer_scale_init_values'] = None
        args.update(definition_args({}, cls))  # the release's hybrid, written out
        return dict(architecture=variant or 'nalaformer_t', model_args=plain(args))

    def forward_intermediates(
            self,
            x: torch.Tensor,
            indices: Optional[Union[int, List[int]]] = None,
            norm: bool = False,
            stop_early: bool = False,
            output_fmt: str = 'NCHW',
            intermediates_only: bool = False,
    ) -> Union[List[torch.Tensor], Tuple[torch.Tensor, List[torch.Tensor]]]:
        """Stage outputs at strides 4/8/16/32 (``indices``: which, or the last n), and the final map.

        ``norm`` is accepted for timm compatibility; the stages have no output norm.
        """
        if output_fmt != 'NCHW':
            raise ValueError(f"output_fmt must be 'NCHW', got {output_fmt!r}")
        take_indices, max_index = feature_take_indices(len(self.layers), indices)
        stages = self.layers if not (stop_early or torch.jit.is_scripting()) else self.layers[:max_index + 1]
        intermediates = []
        x = self.patch_embed(x)
        for i, stage in enumerate(stages):
            x = stage(x)
            if i in take_indices:
                intermediates.append(x.contiguous())  # channels-first, as callers expect of (B, C, H, W)
            if stage.downsample is not None:
                x = stage.downsample(x)
        if intermediates_only:
            return intermediates
        return x, intermediates

    def prune_intermediate_layers(self, indices: Union[int, List[int]] = 1, prune_norm: bool = False,
                                  prune_head: bool = True) -> List[int]:
        """Drop the stages after the last requested one (and the head) for feature extraction."""
        take_indices, max_index = feature_take_indices(len(self.layers), indices)
        self.layers = self.layers[:max_index + 1]
        if self.layers[-1].downsample is not None:
            self.layers[-1].downsample = None
        if prune_head:
            self.proj = nn.Identity()
            self.norm = nn.Identity()
            self.reset_classifier(0, '')
        return take_indices

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        x = self.patch_embed(x)
        for stage in self.layers:
            x = stage(x)
            if stage.downsample is not None:
                x = stage.downsample(x)
        return x

    def forward_head(self, x: torch.Tensor, pre_logits: bool = False) -> torch.Tensor:
        x = self.proj(x.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)
        x = self.head_drop(self.global_pool(self.act(self.norm(x))))
        if not pre_logits:
            x = self.head(x)
        return x if self.global_pool.is_identity() else x.flatten(1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.forward_head(self.forward_features(x))


def describe_architecture(state_dict: Dict[str, torch.Tensor]) -> dict:
    """Per-stage embed_dims, depths, num_heads and mlp_ratios read off a NaLaFormer state dict."""
    depths: Dict[int, int] = {}
    for key in state_dict:
        m = re.match(r'layers\.(\d+)\.blocks\.(\d+)\.', key)
        if m:
            stage, block = int(m.group(1)), int(m.group(2))
            depths[stage] = max(depths.get(stage, 0), block + 1)
    if not depths:
        raise CheckpointError('this is not a NaLaFormer state dict: it has no layers.<i>.blocks.<j> entries')
    stages = range(max(depths) + 1)
    dims, heads, ratios = [], [], []
    try:
        for i in stages:
            dim = state_dict[f'layers.{i}.blocks.0.norm1.norm.weight'].shape[0]
            head_dim = 2 * state_dict[f'layers.{i}.RoPE.angle'].shape[0]
            dims.append(dim)
            heads.append(dim // head_dim)
            ratios.append(state_dict[f'layers.{i}.blocks.0.ffn.fc1.weight'].shape[0] / dim)
    except KeyError as e:
        raise CheckpointError(f'this is not a NaLaFormer state dict: it lacks {e.args[0]}') from None
    return dict(embed_dims=tuple(dims), depths=tuple(depths.get(i, 0) for i in stages),
                num_heads=tuple(heads), mlp_ratios=tuple(ratios))


def variant_of(arch: dict) -> Optional[str]:
    """The NaLaFormer variant with this architecture (:func:`describe_architecture`), or None."""
    for name, args in MODEL_ARGS.items():
        if all(tuple(arch.get(k, ())) == tuple(args[k]) for k in ('embed_dims', 'depths', 'num_heads', 'mlp_ratios')):
            return name
    return None


def name_architecture(arch: dict) -> str:
    """'nalaformer_t (embed_dims=[...], ...)' or 'an unknown configuration (...)'."""
    variant = variant_of(arch)
    described = ', '.join(f'{k}={list(v) if isinstance(v, tuple) else v}' for k, v in arch.items())
    return f'{variant} ({described})' if variant else f'an unknown configuration ({described})'


def checkpoint_filter_fn(state_dict: Dict[str, torch.Tensor], model: NaLaFormer) -> Dict[str, torch.Tensor]:
    """Map a release-layout (or our own) state dict, with the model's own keys, onto ``model``.

    The layouts are identical, so this only drops a classifier of another number of classes (fine-tuning)
    and checks the architecture: a checkpoint of another variant raises :class:`CheckpointError` naming the
    variant it looks like. Wrapper prefixes (DDP, torch.compile, our runners) are stripped for callers that
    pass a wrapped state dict (on the load path the keys are already the model's own).
    """
    state_dict = strip_wrapper_prefixes(state_dict)
    own = model.state_dict()
    state_dict = drop_other_classifier(state_dict, own, 'head')
    if shape_mismatches(state_dict, own) or set(own) - set(state_dict) - {'head.weight', 'head.bias'}:
        theirs = describe_architecture(state_dict)
        mine = describe_architecture(own)
        if theirs != mine:
            raise CheckpointError(
                f'checkpoint is for another architecture: it looks like {name_architecture(theirs)} '
                f'but the model is {name_architecture(mine)}. Create the model that matches the checkpoint '
                f'(e.g. timm.create_model({variant_of(theirs) or "<variant>"!r}, ...)).')
    check_shapes(state_dict, own)
    return state_dict


default_cfgs = model_cfgs(MODEL_ARGS, first_conv='patch_embed.proj.0', classifier='head',
                          paper_name='NaLaFormer: Norm-Aware Linear Attention for Transformer Models',
                          origin_url='https://github.com/ZacharyMeng/NaLaFormer')

def _create_nalaformer(variant: str, pretrained: bool = False, **kwargs) -> NaLaFormer:
    return build_model(NaLaFormer, variant, pretrained, MODEL_ARGS[variant], checkpoint_filter_fn, **kwargs)


@register_model
def nalaformer_xt(pretrained: bool = False, **kwargs) -> NaLaFormer:
    """NaLaFormer-XT: 6.14M params as released (the paper's table says 8M)."""
    return _create_nalaformer('nalaformer_xt', pretrained=pretrained, **kwargs)


@register_model
def nalaformer_t(pretrained: bool = False, **kwargs) -> NaLaFormer:
    """NaLaFormer-T: 15.91M params as released (mlp ratio 4; the paper's 15M matches 3.5)."""
    return _create_nalaformer('nalaformer_t', pretrained=pretrained, **kwargs)


@register_model
def nalaformer_s(pretrained: bool = False, **kwargs) -> NaLaFormer:
    """NaLaFormer-S: 25.65M params."""
    return _create_nalaformer('nalaformer_s', pretrained=pretrained, **kwargs)


@register_model
def nalaformer_b(pretrained: bool = False, **kwargs) -> NaLaFormer:
    """NaLaFormer-B: 52.00M params."""
    return _create_nalaformer('nalaformer_b', pretrained=pretrained, **kwargs)


@register_model
def nalaformer_l(pretrained: bool = False, **kwargs) -> NaLaFormer:
    """NaLaFormer-L: 95.43M params."""
    return _create_nalaformer('nalaformer_l', pretrained=pretrained, **kwargs)
