"""NaLa-Swin: the paper's Swin-T protocol for comparing attention kernels.

The paper's controlled comparisons (v1 Tables 5 and 6) put the attention under study into a
Swin Transformer: stages 1-2 use that linear attention *globally* (one window covering the whole
feature map) plus a depthwise convolution on v, stages 3-4 keep Swin's shifted-window softmax
attention. Stages are chosen as in NaLaFormer, by per-stage ``attn_types`` and ``kernel_kwargs``;
the default is ``('nala', 'nala', 'shifted_window', 'shifted_window')``, ``attn_types='nala'``
makes every stage linear and ``attn_types='shifted_window'`` is exactly timm's Swin (it reproduces
``swin_tiny_patch4_window7_224`` bit for bit when given its weights).

* ``'shifted_window'`` (:data:`SHIFTED_WINDOW`) stages are timm's own Swin pieces
  (``SwinTransformerBlock`` with ``WindowAttention`` and its relative position bias, ``PatchMerging``,
  ``PatchEmbed``); the one change is an attention mask for shifted windows built by a function that
  torch.fx and TorchScript handle at any input size. They take no kernel arguments.
* Any other name is a kernel of :mod:`nalaformer.ops.kernels` (``'nala'``, ``'nala_cos'``,
  ``'const_power'``, ``'relu'``, ``'focused'``, ``'polarity'``, ``'softmax'`` for global softmax, ...;
  that stage's ``kernel_kwargs`` are its arguments) run by :class:`GlobalAttentionBlock`: Swin's block
  layout (norm1 -> attention -> norm2 -> MLP, same parameter names) with
  :class:`GlobalLinearAttention`: qkv -> the kernel over all H*W tokens with the 2D RoPE of
  :func:`nalaformer.ops.nala.rope_table`, plus a depthwise conv on v (5x5 by default, like the
  release's LePE; ``dwc_kernel_size=3`` for 3x3, 0 removes it).

Any input size works by default (``dynamic_img_size=True``): global stages need no window
divisibility, window stages pad to whole windows and build their masks per input, as timm's
Swin does for dense prediction; the patch embedding pads sizes that are not multiples of 4.
``dynamic_img_size=False`` gives Swin's fixed input size with precomputed masks.

    timm.create_model('nala_swin_tiny')                                  # global NaLa in stages 1-2
    timm.create_model('nala_swin_tiny', attn_types=('relu', 'relu', SHIFTED_WINDOW, SHIFTED_WINDOW),
                      kernel_kwargs=(dict(power=3), dict(power=3), None, None))
    timm.create_model('nala_swin_tiny', attn_types=SHIFTED_WINDOW)        # plain Swin-T
"""
import math
import re
from typing import Any, Dict, List, Mapping, Optional, Sequence, Set, Tuple, Type, Union

import torch
import torch.nn as nn
from timm.layers import (
    ClassifierHead, DropPath, Mlp, PatchEmbed, calculate_drop_path_rates, get_device_dtype,
    register_notrace_function, to_2tuple,
)
from timm.models import named_apply, register_model
from timm.models._features import feature_take_indices  # not exported by timm
from timm.models._input import update_model_input_size  # not exported by timm
from timm.models.swin_transformer import (
    PatchMerging, SwinTransformerBlock, calc_stage_window_sizes, resolve_stage_window_sizes, resolve_window_args,
    window_partition,
)
from timm.models.swin_transformer import checkpoint_filter_fn as swin_checkpoint_filter_fn
from timm.models.vision_transformer import get_init_weights_vit

from ..checkpoint.errors import CheckpointError
from ..checkpoint.loading import check_shapes, pretrained_weights
from ..checkpoint.reading import Checkpoint, strip_wrapper_prefixes
from ..ops.kernels import build_attention_kernel
from .family import build_model, drop_other_classifier, load_weights, model_cfgs, per_stage, resolve_attn_types
from .layers import RoPE2d
from .recompute import recompute

__all__ = ['NaLaSwinTransformer', 'GlobalLinearAttention', 'GlobalAttentionBlock', 'ShiftedWindowBlock',
           'NaLaSwinStage', 'MODEL_ARGS', 'SHIFTED_WINDOW', 'checkpoint_filter_fn']

_int_or_tuple_2_t = Union[int, Tuple[int, int]]

# Swin-T/S/B (Liu et al. 2021). drop_path_rate defaults to 0 as in timm's entrypoints; the configs set
# Swin's recipe value.
MODEL_ARGS: Dict[str, dict] = {
    'nala_swin_tiny': dict(embed_dim=96, depths=(2, 2, 6, 2), num_heads=(3, 6, 12, 24)),
    'nala_swin_small': dict(embed_dim=96, depths=(2, 2, 18, 2), num_heads=(3, 6, 12, 24)),
    'nala_swin_base': dict(embed_dim=128, depths=(2, 2, 18, 2), num_heads=(4, 8, 16, 32)),
}
# The attn_types name of Swin's shifted-window softmax stage; every other name is a kernel run globally.
SHIFTED_WINDOW = 'shifted_window'


# ----------------------------------------------------------------------------------------------
# Global stages: a kernel of nalaformer.ops.kernels over the whole map
# ----------------------------------------------------------------------------------------------
class GlobalLinearAttention(nn.Module):
    """Attention over all H*W tokens of a stage with a kernel of :mod:`nalaformer.ops.kernels`.

    x -> qkv (Linear C -> 3C) -> ``kernel(q, k, v, rope)`` per head (2D RoPE for this map's H, W)
      -> + depthwise conv(v) -> proj.

    Args:
        dim: channels C. num_heads: heads (head dim must be a multiple of 4 for the 2D RoPE).
        attn_type: registered kernel name. kernel_kwargs: its arguments (e.g. ``dict(power=3)``).
        dwc_kernel_size: depthwise conv on v added to the output (0: none).

    ``forward(x)``: (B, H, W, C) -> (B, H, W, C), any H, W.
    """
    use_dwc: torch.jit.Final[bool]

    def __init__(self, dim: int, num_heads: int, head_dim: Optional[int] = None, attn_type: str = 'nala',
                 kernel_kwargs: Optional[dict] = None, dwc_kernel_size: int = 5, qkv_bias: bool = True,
                 proj_drop: float = 0., device=None, dtype=None):
        super().__init__()
        dd = dict(device=device, dtype=dtype)
        self.num_heads = num_heads
        self.head_dim = head_dim or dim // num_heads
        attn_dim = self.head_dim * num_heads
        self.qkv = nn.Linear(dim, attn_dim * 3, bias=qkv_bias, **dd)
        self.kernel = build_attention_kernel(attn_type, **(kernel_kwargs or {}))
        self.rope = RoPE2d(self.head_dim, channels_last=True, angle_buffer=False)  # Swin's state dict has no angles
        self.use_dwc = dwc_kernel_size > 0
        self.dwc = nn.Conv2d(attn_dim, attn_dim, dwc_kernel_size, padding=dwc_kernel_size // 2, groups=attn_dim,
                             **dd) if self.use_dwc else nn.Identity()
        self.proj = nn.Linear(attn_dim, dim, **dd)
        self.proj_drop = nn.Dropout(proj_drop)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, H, W, C = x.shape
        qkv = self.qkv(x).reshape(B, H * W, 3, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4)
        q, k, v = qkv.unbind(0)  # (B, heads, N, d) each
        out = self.kernel(q, k, v, self.rope(x)).to(v.dtype)
        out = out.transpose(1, 2).reshape(B, H, W, -1)
        if self.use_dwc:
            v_map = v.transpose(1, 2).reshape(B, H, W, -1).permute(0, 3, 1, 2)
            out = out + self.dwc(v_map).permute(0, 2, 3, 1)
        return self.proj_drop(self.proj(out))


class GlobalAttentionBlock(nn.Module):
    """Swin's block (pre-norm attention and MLP, same parameter names) with :class:`GlobalLinearAttention`.

    ``forward(x)``: (B, H, W, C) -> (B, H, W, C).
    """

    def __init__(self, dim: int, input_resolution: _int_or_tuple_2_t, num_heads: int = 4,
                 head_dim: Optional[int] = None, attn_type: str = 'nala', kernel_kwargs: Optional[dict] = None,
                 dwc_kernel_size: int = 5, mlp_ratio: float = 4., qkv_bias: bool = True, proj_drop: float = 0.,
                 drop_path: float = 0., act_layer: Type[nn.Module] = nn.GELU,
                 norm_layer: Type[nn.Module] = nn.LayerNorm, device=None, dtype=None):
        super().__init__()
        dd = dict(device=device, dtype=dtype)
        self.dim = dim
        self.input_resolution = to_2tuple(input_resolution)
        self.norm1 = norm_layer(dim, **dd)
        self.attn = GlobalLinearAttention(dim, num_heads, head_dim, attn_type, kernel_kwargs, dwc_kernel_size,
                                          qkv_bias, proj_drop, **dd)
        self.drop_path1 = DropPath(drop_path) if drop_path > 0. else nn.Identity()
        self.norm2 = norm_layer(dim, **dd)
        self.mlp = Mlp(in_features=dim, hidden_features=int(dim * mlp_ratio), act_layer=act_layer, drop=proj_drop,
                       **dd)
        self.drop_path2 = DropPath(drop_path) if drop_path > 0. else nn.Identity()

    def set_input_size(self, feat_size: Tuple[int, int], window_size: Tuple[int, int],
                       always_partition: Optional[bool] = None):
        """Global attention has no windows: only the recorded resolution changes."""
        self.input_resolution = feat_size

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, H, W, C = x.shape
        x = x + self.drop_path1(self.attn(self.norm1(x)))
        x = x.reshape(B, -1, C)
        x = x + self.drop_path2(self.mlp(self.norm2(x)))
        return x.reshape(B, H, W, C)


# ----------------------------------------------------------------------------------------------
# Shifted-window stages: timm's block, with a mask that fx and TorchScript build at any size
# ----------------------------------------------------------------------------------------------
@register_notrace_function  # its sizes come from the input's shape
def shifted_window_mask(x: torch.Tensor, window_size: Tuple[int, int], shift_size: Tuple[int, int]) -> torch.Tensor:
    """Swin's SW-MSA mask for a (B, Hp, Wp, C) map padded to whole windows: (windows, area, area), 0 / -100.

    Tokens from different regions of the cyclically shifted map ([0, Hp - ws), [Hp - ws, Hp - shift),
    [Hp - shift, Hp) per axis) must not attend to each other.
    """
    height, width = x.shape[1], x.shape[2]
    rows = torch.arange(height, device=x.device)
    cols = torch.arange(width, device=x.device)
    row_region = (rows >= height - window_size[0]).long() + (rows >= height - shift_size[0]).long()
    col_region = (cols >= width - window_size[1]).long() + (cols >= width - shift_size[1]).long()
    regions = row_region[:, None] * 3 + col_region[None, :]
    windows = window_partition(regions[None, :, :, None], window_size).reshape(-1, window_size[0] * window_size[1])
    differ = windows.unsqueeze(1) != windows.unsqueeze(2)
    return torch.zeros_like(differ, dtype=x.dtype).masked_fill(differ, -100.0)


class ShiftedWindowBlock(SwinTransformerBlock):
    """timm's ``SwinTransformerBlock``; only its mask is built by :func:`shifted_window_mask` (same values)."""

    def get_attn_mask(self, x: Optional[torch.Tensor] = None, device: Optional[torch.device] = None,
                      dtype: Optional[torch.dtype] = None) -> Optional[torch.Tensor]:
        if not any(self.shift_size):
            return None
        if x is not None:
            return shifted_window_mask(x, self.window_size, self.shift_size)
        # precomputed for the construction-time resolution (dynamic_mask=False)
        height = math.ceil(self.input_resolution[0] / self.window_size[0]) * self.window_size[0]
        width = math.ceil(self.input_resolution[1] / self.window_size[1]) * self.window_size[1]
        padded = torch.zeros((1, height, width, 1), device=device, dtype=dtype)
        return shifted_window_mask(padded, self.window_size, self.shift_size)


class NaLaSwinStage(nn.Module):
    """One Swin stage (timm's layout: PatchMerging ``downsample`` first, then ``blocks``) of either kind.

    ``attn_type``: :data:`SHIFTED_WINDOW` (Swin's blocks, alternating shift) or a registered kernel's name
    (:class:`GlobalAttentionBlock` with that kernel; ``kernel_kwargs`` are its arguments).
    ``forward(x)``: (B, H, W, C_in) -> (B, ceil(H/2), ceil(W/2), C_out) (no downsampling in stage 0).
    """

    def __init__(self, dim: int, out_dim: int, input_resolution: Tuple[int, int], depth: int,
                 attn_type: str = SHIFTED_WINDOW, downsample: bool = True, num_heads: int = 4,
                 head_dim: Optional[int] = None, window_size: _int_or_tuple_2_t = 7, always_partition: bool = False,
                 dynamic_mask: bool = False, kernel_kwargs: Optional[dict] = None, dwc_kernel_size: int = 5,
                 mlp_ratio: float = 4., qkv_bias: bool = True, proj_drop: float = 0., attn_drop: float = 0.,
                 drop_path: Union[List[float], float] = 0., norm_layer: Type[nn.Module] = nn.LayerNorm,
                 device=None, dtype=None):
        super().__init__()
        dd = dict(device=device, dtype=dtype)
        self.dim = dim
        self.attn_type = attn_type
        self.input_resolution = input_resolution
        self.output_resolution = tuple((i + 1) // 2 for i in input_resolution) if downsample else input_resolution
        self.depth = depth
        self.grad_checkpointing = False
        window_size = to_2tuple(window_size)
        shift_size = tuple(w // 2 for w in window_size)
        drop_path = drop_path if isinstance(drop_path, list) else [drop_path] * depth
        if downsample:
            self.downsample = PatchMerging(dim=dim, out_dim=out_dim, norm_layer=norm_layer, **dd)
        else:
            assert dim == out_dim
            self.downsample = nn.Identity()
        if attn_type == SHIFTED_WINDOW:
            blocks = [ShiftedWindowBlock(
                dim=out_dim, input_resolution=self.output_resolution, num_heads=num_heads, head_dim=head_dim,
                window_size=window_size, shift_size=0 if i % 2 == 0 else shift_size,
                always_partition=always_partition, dynamic_mask=dynamic_mask, mlp_ratio=mlp_ratio,
                qkv_bias=qkv_bias, proj_drop=proj_drop, attn_drop=attn_drop, drop_path=drop_path[i],
                norm_layer=norm_layer, **dd) for i in range(depth)]
        else:
            blocks = [GlobalAttentionBlock(
                dim=out_dim, input_resolution=self.output_resolution, num_heads=num_heads, head_dim=head_dim,
                attn_type=attn_type, kernel_kwargs=kernel_kwargs, dwc_kernel_size=dwc_kernel_size,
                mlp_ratio=mlp_ratio, qkv_bias=qkv_bias, proj_drop=proj_drop, drop_path=drop_path[i],
                norm_layer=norm_layer, **dd) for i in range(depth)]
        self.blocks = nn.Sequential(*blocks)

    def set_input_size(self, feat_size: Tuple[int, int], window_size: _int_or_tuple_2_t,
                       always_partition: Optional[bool] = None):
        self.input_resolution = feat_size
        if isinstance(self.downsample, nn.Identity):
            self.output_resolution = feat_size
        else:
            self.output_resolution = tuple((i + 1) // 2 for i in feat_size)
        for block in self.blocks:
            block.set_input_size(feat_size=self.output_resolution, window_size=window_size,
                                 always_partition=always_partition)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.downsample(x)
        if self.grad_checkpointing and not torch.jit.is_scripting():
            for block in self.blocks:
                x = recompute(block, x)
        else:
            x = self.blocks(x)
        return x


# ----------------------------------------------------------------------------------------------
# The model
# ----------------------------------------------------------------------------------------------
class NaLaSwinTransformer(nn.Module):
    """Swin Transformer whose stages use a global attention kernel or Swin's shifted windows.

    Args (beyond Swin's own: img_size, patch_size, in_chans, num_classes, global_pool, embed_dim,
    depths, num_heads, head_dim, window_size, always_partition, mlp_ratio, qkv_bias, drop_rate,
    proj_drop_rate, attn_drop_rate, drop_path_rate, embed_layer, norm_layer, weight_init):
        attn_types: per-stage :data:`SHIFTED_WINDOW` or a kernel name of :mod:`nalaformer.ops.kernels` run
            globally (a single name applies to every stage); default ``('nala', 'nala', 'shifted_window',
            'shifted_window')``, the paper's protocol; ``'shifted_window'``: plain Swin.
        kernel_kwargs: the kernels' arguments: None, one dict for every stage, or one dict (or None) per
            stage, e.g. ``(dict(power=3.), dict(power=3.), None, None)`` for 'relu' stages 1-2;
            shifted-window stages take none.
        dwc_kernel_size: depthwise conv on v in global stages (5 as the release's LePE; 3 for 3x3; 0: none).
        dynamic_img_size: accept any input size (default); False fixes it to img_size like timm's Swin.

    Shapes: ``forward_features`` (B, in_chans, H, W) -> (B, ceil(H/32), ceil(W/32), C4) (NHWC, like
    timm's Swin); ``forward_intermediates`` gives NCHW maps at strides 4/8/16/32.
    ``img_size`` only sets the default window sizes of later stages (clamped to the feature size,
    as Swin does) when ``dynamic_img_size``.
    """
    # Arguments that change what the model computes but not its state dict (checkpoints record them).
    definition_args = ('attn_types', 'kernel_kwargs')

    def __init__(
            self,
            img_size: _int_or_tuple_2_t = 224,
            patch_size: int = 4,
            in_chans: int = 3,
            num_classes: int = 1000,
            global_pool: str = 'avg',
            embed_dim: int = 96,
            depths: Tuple[int, ...] = (2, 2, 6, 2),
            num_heads: Tuple[int, ...] = (3, 6, 12, 24),
            head_dim: Optional[int] = None,
            window_size: _int_or_tuple_2_t = 7,
            attn_types: Union[str, Sequence[str]] = ('nala', 'nala', SHIFTED_WINDOW, SHIFTED_WINDOW),
            kernel_kwargs: Union[None, Mapping, Sequence[Optional[Mapping]]] = None,
            dwc_kernel_size: int = 5,
            always_partition: bool = False,
            dynamic_img_size: bool = True,
            mlp_ratio: float = 4.,
            qkv_bias: bool = True,
            drop_rate: float = 0.,
            proj_drop_rate: float = 0.,
            attn_drop_rate: float = 0.,
            drop_path_rate: float = 0.,
            embed_layer: Type[nn.Module] = PatchEmbed,
            norm_layer: Type[nn.Module] = nn.LayerNorm,
            weight_init: str = '',
            device=None,
            dtype=None,
    ):
        super().__init__()
        dd = dict(device=device, dtype=dtype)
        self.num_classes = num_classes
        self.in_chans = in_chans
        self.global_pool = global_pool
        self.output_fmt = 'NHWC'
        self.dynamic_img_size = dynamic_img_size
        self.num_layers = len(depths)
        self.attn_types, self.kernel_kwargs = resolve_attn_types(
            attn_types, kernel_kwargs, self.num_layers, SHIFTED_WINDOW, "Swin's shifted-window softmax", 'NaLa-Swin')
        self.embed_dim = embed_dim
        self.num_features = int(embed_dim * 2 ** (self.num_layers - 1))
        self.feature_info = []
        embed_dims = [int(embed_dim * 2 ** i) for i in range(self.num_layers)]

        self.patch_embed = embed_layer(
            img_size=img_size, patch_size=patch_size, in_chans=in_chans, embed_dim=embed_dims[0],
            norm_layer=norm_layer, strict_img_size=not dynamic_img_size, dynamic_img_pad=dynamic_img_size,
            output_fmt='NHWC', **dd)
        patch_grid = self.patch_embed.grid_size

        head_dims = per_stage(head_dim, self.num_layers, 'head_dim')
        window_sizes = resolve_stage_window_sizes(window_size, self.num_layers)
        self._ref_window_sizes = window_sizes  # set_input_size() scales these with the patch grid
        self._ref_grid_size = tuple(patch_grid)
        mlp_ratios = per_stage(mlp_ratio, self.num_layers, 'mlp_ratio')
        dpr = calculate_drop_path_rates(drop_path_rate, depths, stagewise=True)
        layers = []
        in_dim = embed_dims[0]
        scale = 1
        for i in range(self.num_layers):
            layers.append(NaLaSwinStage(
                dim=in_dim, out_dim=embed_dims[i],
                input_resolution=((patch_grid[0] + scale - 1) // scale, (patch_grid[1] + scale - 1) // scale),
                depth=depths[i], attn_type=self.attn_types[i], downsample=i > 0, num_heads=num_heads[i],
                head_dim=head_dims[i], window_size=window_sizes[i], always_partition=always_partition,
                dynamic_mask=dynamic_img_size, kernel_kwargs=self.kernel_kwargs[i],
                dwc_kernel_size=dwc_kernel_size, mlp_ratio=mlp_ratios[i], qkv_bias=qkv_bias,
                proj_drop=proj_drop_rate, attn_drop=attn_drop_rate, drop_path=dpr[i], norm_layer=norm_layer, **dd))
            in_dim = embed_dims[i]
            if i > 0:
                scale *= 2
            self.feature_info.append(dict(num_chs=embed_dims[i], reduction=patch_size * scale, module=f'layers.{i}'))
        self.layers = nn.Sequential(*layers)

        self.norm = norm_layer(self.num_features, **dd)
        self.head = ClassifierHead(self.num_features, num_classes, pool_type=global_pool, drop_rate=drop_rate,
                                   input_fmt=self.output_fmt, **dd)
        self.head_hidden_size = self.head.num_features
        self.weight_init_mode = 'reset' if weight_init == 'skip' else weight_init
        if weight_init != 'skip':
            self.init_weights(needs_reset=False)

    @torch.jit.ignore
    def init_weights(self, mode: str = '', needs_reset: bool = True) -> None:
        """timm's Swin init: trunc_normal(0.02) Linear weights, zero biases ('jax', 'moco' also accepted)."""
        mode = mode or self.weight_init_mode
        assert mode in ('jax', 'jax_nlhb', 'moco', 'reset', '')
        head_bias = -math.log(self.num_classes) if 'nlhb' in mode else 0.
        named_apply(get_init_weights_vit(mode, head_bias=head_bias, needs_reset=needs_reset), self)

    @torch.jit.ignore
    def no_weight_decay(self) -> Set[str]:
        return {n for n, _ in self.named_parameters() if 'relative_position_bias_table' in n}

    @torch.jit.ignore
    def set_input_size(
            self,
            img_size: Optional[Tuple[int, int]] = None,
            patch_size: Optional[Tuple[int, int]] = None,
            window_size: Optional[Union[_int_or_tuple_2_t, Sequence[_int_or_tuple_2_t]]] = None,
            window_ratio: Optional[Union[int, Sequence[int]]] = None,
            always_partition: Optional[bool] = None,
    ) -> None:
        """As timm's Swin: new image size / patch size; window stages rescale their windows (global ones have none)."""
        window_size, window_ratio = resolve_window_args(window_size, window_ratio, len(self.layers))
        if img_size is not None or patch_size is not None:
            self.patch_embed.set_input_size(img_size=img_size, patch_size=patch_size)
        if patch_size is not None:
            for index, info in enumerate(self.feature_info):
                info['reduction'] = max(self.patch_embed.patch_size) * 2 ** index
        patch_grid = tuple(self.patch_embed.grid_size)
        window_sizes = calc_stage_window_sizes(patch_grid, self._ref_window_sizes, self._ref_grid_size,
                                               window_size=window_size, window_ratio=window_ratio)
        if window_size is not None or window_ratio is not None:
            self._ref_window_sizes = window_sizes
            self._ref_grid_size = patch_grid
        for index, stage in enumerate(self.layers):
            stage_scale = 2 ** max(index - 1, 0)
            stage.set_input_size(feat_size=tuple((g + stage_scale - 1) // stage_scale for g in patch_grid),
                                 window_size=window_sizes[index], always_partition=always_partition)
        update_model_input_size(self, self.patch_embed.img_size, patch_size=patch_size, window_size=window_sizes,
                                always_partition=always_partition)

    @torch.jit.ignore
    def group_matcher(self, coarse: bool = False) -> Dict[str, Any]:
        return dict(
            stem=r'^patch_embed',
            blocks=r'^layers\.(\d+)' if coarse else [
                (r'^layers\.(\d+).downsample', (0,)),
                (r'^layers\.(\d+)\.\w+\.(\d+)', None),
                (r'^norm', (99999,)),
            ],
        )

    @torch.jit.ignore
    def set_grad_checkpointing(self, enable: bool = True) -> None:
        if enable not in (True, False):
            raise ValueError(f"NaLa-Swin's grad checkpointing is True or False (whole blocks), got {enable!r}; "
                             "'selective' is NaLaFormer's")
        for stage in self.layers:
            stage.grad_checkpointing = enable

    @torch.jit.ignore
    def get_classifier(self) -> nn.Module:
        return self.head.fc

    def reset_classifier(self, num_classes: int, global_pool: Optional[str] = None) -> None:
        dd = get_device_dtype(self)
        self.num_classes = num_classes
        self.head.reset(num_classes, pool_type=global_pool, in_features=self.num_features, **dd)
        self.head_hidden_size = self.head.num_features
        if global_pool is not None:
            self.global_pool = global_pool

    @torch.jit.ignore
    def load_pretrained(self, checkpoint: Union[str, Checkpoint], ema: Optional[bool] = None,
                        accept_definition_change: Optional[bool] = None, strict: bool = True):
        """Load a checkpoint of this family, or a timm / original Swin checkpoint, safely (.pth or .safetensors).

        ``strict=False`` accepts weights this model has and the checkpoint lacks (e.g. starting a
        model with global stages from plain Swin weights: their depthwise convs stay freshly initialised).
        """
        state_dict = pretrained_weights(self, checkpoint, ema, accept_definition_change)
        return self.load_weights(state_dict, str(checkpoint), strict)

    @torch.jit.ignore
    def load_weights(self, state_dict: Dict[str, torch.Tensor], source: str = 'checkpoint', strict: bool = True):
        """Load weights with this model's own keys through the family's layout (:func:`checkpoint_filter_fn`)."""
        return load_weights(self, state_dict, checkpoint_filter_fn, source, strict,
                            missing_hint='. A plain Swin checkpoint has no depthwise convs for linear stages: load it '
                                         'with load_pretrained(path, strict=False).')

    def forward_intermediates(
            self,
            x: torch.Tensor,
            indices: Optional[Union[int, List[int]]] = None,
            norm: bool = False,
            stop_early: bool = False,
            output_fmt: str = 'NCHW',
            intermediates_only: bool = False,
    ) -> Union[List[torch.Tensor], Tuple[torch.Tensor, List[torch.Tensor]]]:
        """Stage outputs (NCHW, strides 4/8/16/32; ``indices``: which, or the last n) and the final features.

        ``norm`` applies the final norm to the last stage's map (the only one it is sized for).
        """
        assert output_fmt in ('NCHW',), 'Output shape must be NCHW.'
        intermediates = []
        take_indices, max_index = feature_take_indices(len(self.layers), indices)
        x = self.patch_embed(x)
        num_stages = len(self.layers)
        if torch.jit.is_scripting() or not stop_early:
            stages = self.layers
        else:
            stages = self.layers[:max_index + 1]
        i = 0
        for i, stage in enumerate(stages):
            x = stage(x)
            if i in take_indices:
                x_inter = self.norm(x) if norm and i == num_stages - 1 else x
                intermediates.append(x_inter.permute(0, 3, 1, 2).contiguous())
        if intermediates_only:
            return intermediates
        if i == num_stages - 1:
            x = self.norm(x)
        return x, intermediates

    def prune_intermediate_layers(self, indices: Union[int, List[int]] = 1, prune_norm: bool = False,
                                  prune_head: bool = True) -> List[int]:
        """Drop the stages after the last requested one (and the norm/head they feed)."""
        take_indices, max_index = feature_take_indices(len(self.layers), indices)
        prune_end = max_index < len(self.layers) - 1
        if prune_norm or prune_end:
            self.norm = nn.Identity()
        self.layers = self.layers[:max_index + 1]
        self._ref_window_sizes = self._ref_window_sizes[:max_index + 1]
        if prune_end:
            self.num_features = self.head_hidden_size = self.feature_info[max_index]['num_chs']
        if prune_head or prune_end:
            self.reset_classifier(0, '')
        return take_indices

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        x = self.patch_embed(x)
        x = self.layers(x)
        return self.norm(x)

    def forward_head(self, x: torch.Tensor, pre_logits: bool = False) -> torch.Tensor:
        return self.head(x, pre_logits=True) if pre_logits else self.head(x)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.forward_head(self.forward_features(x))


# ----------------------------------------------------------------------------------------------
# Checkpoints
# ----------------------------------------------------------------------------------------------
_STAGE_KEY = re.compile(r'^layers\.(\d+)\.')


def checkpoint_filter_fn(state_dict: Dict[str, torch.Tensor], model: NaLaSwinTransformer) -> Dict[str, torch.Tensor]:
    """Map a state dict of this family, of timm's Swin or of the original Swin release onto ``model``.

    With the model's own keys: drops relative position tables of stages that are linear in ``model``;
    runs timm's Swin filter (original layout -> timm's, patch embedding and relative position
    tables resized to the model); drops a classifier of another number of classes. Raises
    :class:`CheckpointError` for tensors of the wrong shape or weights of stages/blocks the model
    does not have (another variant), except whole stages, norm and head a pruned model lacks. Wrapper
    prefixes (DDP, torch.compile, our runners) are stripped for callers that pass a wrapped state dict.
    """
    state_dict = strip_wrapper_prefixes(state_dict)
    own = model.state_dict()

    # Relative position tables of stages that are linear here have no module to go to (timm's filter
    # would look one up to resize it); the rest go through timm's Swin filter.
    state_dict = {k: v for k, v in state_dict.items()
                  if not k.endswith(('relative_position_index', 'attn_mask'))
                  and not (k.endswith('relative_position_bias_table') and k not in own)}
    state_dict = drop_other_classifier(swin_checkpoint_filter_fn(state_dict, model), own, 'head.fc')
    check_shapes(state_dict, own)
    num_stages = len(model.layers)
    foreign = [k for k in state_dict if k not in own and not k.startswith(('norm.', 'head.'))
               and not (_STAGE_KEY.match(k) and int(_STAGE_KEY.match(k).group(1)) >= num_stages)]
    if foreign:
        raise CheckpointError(
            f'checkpoint has weights this model lacks, so it is for another architecture '
            f'(variant, depths or attn_types): {foreign[:5]}')
    return state_dict


default_cfgs = model_cfgs(MODEL_ARGS, first_conv='patch_embed.proj', classifier='head.fc',
                          paper_name='NaLaFormer: Norm-Aware Linear Attention for Transformer Models (Swin-T protocol)')

def _create_nala_swin(variant: str, pretrained: bool = False, **kwargs) -> NaLaSwinTransformer:
    return build_model(NaLaSwinTransformer, variant, pretrained, MODEL_ARGS[variant], checkpoint_filter_fn, **kwargs)


@register_model
def nala_swin_tiny(pretrained: bool = False, **kwargs) -> NaLaSwinTransformer:
    """NaLa-Swin-T: Swin-T with global NaLa attention in stages 1-2 (the paper's Swin-T protocol)."""
    return _create_nala_swin('nala_swin_tiny', pretrained=pretrained, **kwargs)


@register_model
def nala_swin_small(pretrained: bool = False, **kwargs) -> NaLaSwinTransformer:
    """NaLa-Swin-S: Swin-S layout (depths 2-2-18-2) with global NaLa attention in stages 1-2."""
    return _create_nala_swin('nala_swin_small', pretrained=pretrained, **kwargs)


@register_model
def nala_swin_base(pretrained: bool = False, **kwargs) -> NaLaSwinTransformer:
    """NaLa-Swin-B: Swin-B layout (dim 128, depths 2-2-18-2) with global NaLa attention in stages 1-2."""
    return _create_nala_swin('nala_swin_base', pretrained=pretrained, **kwargs)
