"""NaLa-SR: lightweight super-resolution, where the paper's token-heavy claim lives (70K+ tokens).

Our reading of the authors' only public SR code, ZacharyMeng/PolaFormerPP ``downstream/sr``
(``basicsr/archs/mambairv2light_arch.py``, configs ``options/*/mambairv2/*lightSR_x{3,4}.yml``): MambaIRv2-Light
with its Mamba scan replaced by a global linear attention. Read from that code and kept here:

* shallow features: 3x3 conv 3 -> 48, LayerNorm over channels;
* 4 residual groups x 5 layers, each group closed by a 3x3 conv and a skip; every layer is
    - 16x16 window softmax attention (Swin's, relative position bias, 4 heads; odd layers shift by 8)
      + a conv-gated MLP (mlp ratio 1: Linear, GELU, half gates the other through LayerNorm and a 5x5 depthwise
      conv, Linear), the layer's input added back scaled by a learnable vector (init 1e-4) on top of the skips, then
    - the *global slot* over all H*W tokens: 1x1 projection, x * sigmoid(3x3 depthwise conv(x)), attention
      (4 heads), LayerNorm, Linear; + another conv-gated MLP, with its own input scale;
* LayerNorm, 3x3 conv and a skip from the shallow features; pixel-shuffle-direct upsampler (one 3x3 conv to
  3 * scale^2 channels, PixelShuffle);
* inputs in [0, 1] minus the DIV2K RGB mean (added back at the output), mirror-padded to whole windows and
  cropped back (so any size works);
* 939,440 parameters at x4 there (their test log), 937,520 here; x2 921,932, x3 928,427.

Ours, not theirs: the attention inside the global slot is the NaLaFormer release's block
(:class:`~nalaformer.models.layers.NaLaAttention`: qkvg projection, 5x5 LePE on v, 2D RoPE per head-dim part,
LayerNorm, SiLU gate, out projection) around any kernel of :mod:`nalaformer.ops.kernels`; theirs is PolaFormer++'s
(polarity-split exp feature maps with two learnable (heads, 2d) scales, RoPE over the 2d features, LePE, the
output times g with no activation and no LayerNorm): the 96 parameters per layer of the difference. Not known: the network, kernel and
training behind the paper's SR numbers (69 GB -> 5.3 GB, 195 -> 124 ms, "same PSNR/SSIM"), and its SR tables;
the released SR code computes PolaFormer++, not NaLa, and ships no weights.

The global slot's kernel is chosen per group by ``attn_types`` (one name or one per group), with
``kernel_kwargs`` as in every family: ``'nala'`` (default), ``'nala_cos'``, ``'const_power'``, ``'relu'``,
``'softmax'`` (PyTorch's fused SDPA: O(N) memory), ``'softmax_explicit'`` (stores the N x N matrix, as a plain
softmax transformer does), ... :data:`WINDOW_ONLY` (``'none'``) removes a group's global attention (its gated MLP
stays): a windowed SR transformer, the memory floor.

    timm.create_model('nalasr_light', upscale=2)                                   # NaLa in the global slot
    timm.create_model('nalasr_light', upscale=4, attn_types='softmax_explicit')    # the quadratic reference
    model.forward_tiled(lr, tile=192, overlap=16)                                  # any image in bounded memory
"""
from typing import Callable, Dict, List, Mapping, Optional, Sequence, Tuple, Union

import torch
import torch.nn as nn
from timm.layers import to_2tuple
from timm.models import generate_default_cfgs, register_model
from timm.models.swin_transformer import WindowAttention, window_partition, window_reverse

from ..checkpoint.errors import CheckpointError
from ..checkpoint.loading import check_shapes, pretrained_weights
from ..checkpoint.reading import Checkpoint, strip_wrapper_prefixes
from .family import build_model, load_weights, resolve_attn_types, set_stage_grad_checkpointing, trunc_normal_init
from .layers import NaLaAttention, RoPE2d
from .nala_swin import shifted_window_mask
from .recompute import recompute

__all__ = ['NaLaSR', 'SRLayer', 'GlobalAttention', 'ConvGatedMLP', 'WINDOW_ONLY', 'MODEL_ARGS', 'SCALES',
           'checkpoint_filter_fn', 'tiled_upscale', 'mirror_pad']

# The attn_types name of a group without global attention (window attention only).
WINDOW_ONLY = 'none'
SCALES = (2, 3, 4)
# RGB mean of DIV2K's training images (BasicSR / MambaIRv2), subtracted from the input, added to the output.
DIV2K_RGB_MEAN = (0.4488, 0.4371, 0.4040)

MODEL_ARGS = {
    # MambaIRv2-Light's lightSR configs (train_MambaIRv2_lightSR_x{3,4}.yml): embed 48, depths 5 x 4, 4 heads,
    # window 16, mlp ratio 1.
    'nalasr_light': dict(embed_dim=48, depths=(5, 5, 5, 5), num_heads=4, window_size=16, mlp_ratio=1.),
}


def mirror_pad(x: torch.Tensor, height: int, width: int) -> torch.Tensor:
    """Pad (B, C, h, w) to (B, C, height, width) at the bottom and right by mirroring (edge pixel repeated),
    any amount: the image is followed by its flipped copy as often as needed (MambaIRv2's padding)."""
    while x.shape[-2] < height:
        x = torch.cat([x, x.flip(-2)], dim=-2)
    while x.shape[-1] < width:
        x = torch.cat([x, x.flip(-1)], dim=-1)
    return x[..., :height, :width]


class ConvGatedMLP(nn.Module):
    """fc1 -> GELU -> halves (a, b) -> a * dwconv5x5(LayerNorm(b)) -> fc2 (MambaIRv2's GatedMLP).

    ``forward(x)``: (B, H, W, C) -> (B, H, W, C).
    """

    def __init__(self, dim: int, hidden_dim: int, kernel_size: int = 5):
        super().__init__()
        if hidden_dim % 2:
            raise ValueError(f'the gated MLP splits its hidden dim in two halves, got {hidden_dim}')
        self.fc1 = nn.Linear(dim, hidden_dim)
        self.act = nn.GELU()
        self.gate_norm = nn.LayerNorm(hidden_dim // 2)
        self.gate_conv = nn.Conv2d(hidden_dim // 2, hidden_dim // 2, kernel_size, padding=kernel_size // 2,
                                   groups=hidden_dim // 2)
        self.fc2 = nn.Linear(hidden_dim // 2, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a, b = self.act(self.fc1(x)).chunk(2, dim=-1)
        b = self.gate_conv(self.gate_norm(b).permute(0, 3, 1, 2)).permute(0, 2, 3, 1)
        return self.fc2(a * b)


class GlobalAttention(nn.Module):
    """The global slot: x -> Linear -> x * sigmoid(dwconv3x3(x)) -> NaLaAttention (any kernel, over all
    H*W tokens) -> LayerNorm -> Linear (MambaIRv2's attentive state-space module with attention for the scan).

    ``forward(x, rope)``: x (B, H, W, C), rope (2, H*W, C / heads) -> (B, H, W, C).
    """

    def __init__(self, dim: int, num_heads: int, attn_type: str = 'nala', kernel_kwargs: Optional[dict] = None):
        super().__init__()
        self.in_proj = nn.Linear(dim, dim)
        self.cpe = nn.Conv2d(dim, dim, 3, padding=1, groups=dim)
        self.attn = NaLaAttention(dim, num_heads, attn_type, kernel_kwargs)
        self.out_norm = nn.LayerNorm(dim)
        self.out_proj = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor, rope: torch.Tensor) -> torch.Tensor:
        x = self.in_proj(x).permute(0, 3, 1, 2)
        x = x * torch.sigmoid(self.cpe(x))
        x = self.attn(x, rope).permute(0, 2, 3, 1)
        return self.out_proj(self.out_norm(x))


class SRLayer(nn.Module):
    """One layer: shifted-window attention + gated MLP, then global attention + gated MLP.

    As in MambaIRv2-Light, each half adds its input scaled by a learnable per-channel vector (init 1e-4) on
    top of its residual branches: ``y = x + attn(LN(x)); y = y + mlp(LN(y)); x = scale * x + y``.
    ``attn_type`` :data:`WINDOW_ONLY` drops the global attention (the second gated MLP stays).

    ``forward(x, mask, rope)``: x (B, Hp, Wp, C) with Hp, Wp multiples of the window; mask: the shifted
    windows' (windows, area, area) mask (used by shifted layers); rope as :class:`GlobalAttention`'s.
    """

    def __init__(self, dim: int, num_heads: int, window_size: int, shift: bool, mlp_ratio: float,
                 attn_type: str = 'nala', kernel_kwargs: Optional[dict] = None, layer_scale: float = 1e-4):
        super().__init__()
        self.window_size = to_2tuple(window_size)
        self.shift_size = tuple(w // 2 for w in self.window_size) if shift else (0, 0)
        hidden = int(dim * mlp_ratio)
        self.norm1 = nn.LayerNorm(dim)
        self.window_attn = WindowAttention(dim, num_heads, window_size=window_size)
        self.norm2 = nn.LayerNorm(dim)
        self.mlp1 = ConvGatedMLP(dim, hidden)
        self.scale1 = nn.Parameter(torch.full((dim,), layer_scale))
        if attn_type == WINDOW_ONLY:
            self.norm3 = self.global_attn = None
        else:
            self.norm3 = nn.LayerNorm(dim)
            self.global_attn = GlobalAttention(dim, num_heads, attn_type, kernel_kwargs)
        self.norm4 = nn.LayerNorm(dim)
        self.mlp2 = ConvGatedMLP(dim, hidden)
        self.scale2 = nn.Parameter(torch.full((dim,), layer_scale))

    def windows(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        B, H, W, C = x.shape
        shifted = any(self.shift_size)
        if shifted:
            x = torch.roll(x, shifts=(-self.shift_size[0], -self.shift_size[1]), dims=(1, 2))
        windows = window_partition(x, self.window_size).flatten(1, 2)
        windows = self.window_attn(windows, mask if shifted else None)
        x = window_reverse(windows.unflatten(1, self.window_size), self.window_size, H, W)
        if shifted:
            x = torch.roll(x, shifts=self.shift_size, dims=(1, 2))
        return x

    def forward(self, x: torch.Tensor, mask: torch.Tensor, rope: torch.Tensor) -> torch.Tensor:
        y = x + self.windows(self.norm1(x), mask)
        y = y + self.mlp1(self.norm2(y))
        x = self.scale1 * x + y
        y = x if self.global_attn is None else x + self.global_attn(self.norm3(x), rope)
        y = y + self.mlp2(self.norm4(y))
        return self.scale2 * x + y


class ResidualGroup(nn.Module):
    """``depth`` layers, a 3x3 conv and a skip: (B, H, W, C) -> (B, H, W, C)."""

    def __init__(self, dim: int, depth: int, num_heads: int, window_size: int, mlp_ratio: float, attn_type: str,
                 kernel_kwargs: Optional[dict]):
        super().__init__()
        self.grad_checkpointing = False
        self.layers = nn.ModuleList([
            SRLayer(dim, num_heads, window_size, shift=i % 2 == 1, mlp_ratio=mlp_ratio, attn_type=attn_type,
                    kernel_kwargs=kernel_kwargs)
            for i in range(depth)])
        self.conv = nn.Conv2d(dim, dim, 3, padding=1)

    def forward(self, x: torch.Tensor, mask: torch.Tensor, rope: torch.Tensor) -> torch.Tensor:
        y = x
        for layer in self.layers:
            if self.grad_checkpointing and not torch.jit.is_scripting():
                y = recompute(layer, y, mask, rope, selective=self.grad_checkpointing == 'selective')
            else:
                y = layer(y, mask, rope)
        return self.conv(y.permute(0, 3, 1, 2)).permute(0, 2, 3, 1) + x


def _tile_starts(length: int, tile: int, overlap: int) -> List[int]:
    if length <= tile:
        return [0]
    starts = list(range(0, length - tile, tile - overlap))
    return starts + [length - tile]


def _owned(starts: List[int], length: int, tile: int) -> List[Tuple[int, int]]:
    """The part [a, b) of the axis each tile writes: overlaps are split at their middle."""
    cuts = [(nxt + start + tile) // 2 for start, nxt in zip(starts, starts[1:])]
    return list(zip([0, *cuts], [*cuts, length]))


def tiled_upscale(upscale_fn: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor, scale: int, tile: int,
                  overlap: int) -> torch.Tensor:
    """``upscale_fn`` applied to overlapping tiles of x, stitched: (B, C, h, w) -> (B, C', s*h, s*w).

    Tiles are ``tile`` x ``tile`` LR pixels (less where the image is smaller), ``overlap`` pixels shared with
    each neighbour (the last tile of a row or column is moved back to end at the border); each output pixel
    comes from the one tile it lies deepest in (overlaps are split at their middle). A function whose output
    pixel depends only on input pixels within ``overlap // 2`` gives exactly its whole-image result.
    """
    if tile < 1 or not 0 <= overlap < tile:
        raise ValueError(f'tiles need tile >= 1 and 0 <= overlap < tile (LR pixels), got tile={tile}, '
                         f'overlap={overlap}')
    h, w = x.shape[-2:]
    th, tw = min(tile, h), min(tile, w)
    rows, cols = _tile_starts(h, tile, overlap), _tile_starts(w, tile, overlap)
    out = None
    for top, (r0, r1) in zip(rows, _owned(rows, h, th)):
        for left, (c0, c1) in zip(cols, _owned(cols, w, tw)):
            y = upscale_fn(x[..., top:top + th, left:left + tw])
            if out is None:
                out = y.new_empty(*y.shape[:-2], h * scale, w * scale)
            out[..., r0 * scale:r1 * scale, c0 * scale:c1 * scale] = \
                y[..., (r0 - top) * scale:(r1 - top) * scale, (c0 - left) * scale:(c1 - left) * scale]
    return out


class NaLaSR(nn.Module):
    """Lightweight SR network with window attention and a global attention slot of any kernel.

    Args:
        upscale: scale factor, 2, 3 or 4. in_chans: image channels (3: RGB in [0, 1]).
        embed_dim: channels. depths: layers per residual group. num_heads: heads of both attentions
            (head dim embed_dim / num_heads, a multiple of 4 for the 2D RoPE).
        window_size: window of the window attention; inputs are padded to multiples of it.
        mlp_ratio: hidden width of the gated MLPs (half of it gates the other half).
        attn_types: the global slot's kernel per group, one name for all or one per group; :data:`WINDOW_ONLY`
            for none. kernel_kwargs: its arguments (one dict for all groups, or one dict or None per group).

    ``forward(x)``: (B, in_chans, h, w) -> (B, in_chans, upscale*h, upscale*w), any h, w; the output is not
    clamped to [0, 1]. ``forward_tiled(x, tile, overlap)``: the same, tile by tile (inference).
    """
    # Arguments that change what the model computes but not its state dict: checkpoints record them.
    definition_args = ('attn_types', 'kernel_kwargs')

    def __init__(
            self,
            upscale: int = 2,
            in_chans: int = 3,
            embed_dim: int = 48,
            depths: Sequence[int] = (5, 5, 5, 5),
            num_heads: int = 4,
            window_size: int = 16,
            mlp_ratio: float = 1.,
            attn_types: Union[str, Sequence[str]] = 'nala',
            kernel_kwargs: Union[None, Mapping, Sequence[Optional[Mapping]]] = None,
    ):
        super().__init__()
        if upscale not in SCALES:
            raise ValueError(f'upscale must be one of {SCALES} (the pixel-shuffle upsampler), got {upscale!r}')
        if embed_dim % num_heads or (embed_dim // num_heads) % 4:
            raise ValueError(f'embed_dim / num_heads must be a whole multiple of 4 (2D RoPE), got {embed_dim} / '
                             f'{num_heads}')
        self.attn_types, self.kernel_kwargs = resolve_attn_types(
            attn_types, kernel_kwargs, len(depths), WINDOW_ONLY, 'window attention only', 'NaLa-SR', unit='group')
        self.upscale = upscale
        self.in_chans = in_chans
        self.window_size = window_size
        self.num_features = embed_dim
        self.grad_checkpointing = False
        mean = DIV2K_RGB_MEAN if in_chans == 3 else (0.,) * in_chans
        self.register_buffer('mean', torch.tensor(mean).view(1, in_chans, 1, 1), persistent=False)

        self.conv_first = nn.Conv2d(in_chans, embed_dim, 3, padding=1)
        self.embed_norm = nn.LayerNorm(embed_dim)
        self.rope = RoPE2d(embed_dim // num_heads)
        self.groups = nn.ModuleList([
            ResidualGroup(embed_dim, depth, num_heads, window_size, mlp_ratio, attn_type, kwargs)
            for depth, attn_type, kwargs in zip(depths, self.attn_types, self.kernel_kwargs)])
        self.norm = nn.LayerNorm(embed_dim)
        self.conv_after_body = nn.Conv2d(embed_dim, embed_dim, 3, padding=1)
        self.upsample = nn.Sequential(nn.Conv2d(embed_dim, in_chans * upscale ** 2, 3, padding=1),
                                      nn.PixelShuffle(upscale))
        self.apply(self._init_weights)

    @staticmethod
    def _init_weights(m: nn.Module):
        # As MambaIRv2: Linear trunc_normal(0.02) with zero bias; convolutions keep PyTorch's default.
        trunc_normal_init(m, nn.Linear)
        if isinstance(m, nn.LayerNorm):
            nn.init.ones_(m.weight)
            nn.init.zeros_(m.bias)

    @torch.jit.ignore
    def no_weight_decay_keywords(self) -> set:
        return {'relative_position_bias_table'}

    @torch.jit.ignore
    def set_grad_checkpointing(self, enable: Union[bool, str] = True):
        """True: recompute whole layers in backward; ``'selective'``: all but the matrix products."""
        set_stage_grad_checkpointing(self, self.groups, enable)

    @torch.jit.ignore
    def load_pretrained(self, checkpoint: Union[str, Checkpoint], ema: Optional[bool] = None,
                        accept_definition_change: Optional[bool] = None):
        """Load a checkpoint of this family (.pth, .safetensors, a timm folder, a tools/train.py run) safely.

        A checkpoint recorded with other ``attn_types`` / ``kernel_kwargs`` fails unless
        ``accept_definition_change``; one of another scale or width fails naming the tensors.
        """
        return self.load_weights(pretrained_weights(self, checkpoint, ema, accept_definition_change), str(checkpoint))

    @torch.jit.ignore
    def load_weights(self, state_dict: Dict[str, torch.Tensor], source: str = 'checkpoint'):
        """Load weights with this model's own keys (:func:`checkpoint_filter_fn`); all of them, no more."""
        hint = ' (another depth, or attn_types with / without global attention?)'
        result = load_weights(self, state_dict, checkpoint_filter_fn, source, missing_hint=hint)
        if result.unexpected_keys:
            raise CheckpointError(f'{source} is not a checkpoint of this NaLa-SR model: it has weights the model '
                                  f'lacks, {result.unexpected_keys[:10]}{hint}')
        return result

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        """Deep features of the shallow features x (B, C, Hp, Wp), Hp, Wp multiples of the window."""
        tokens = self.embed_norm(x.permute(0, 2, 3, 1))
        rope = self.rope(x)
        mask = shifted_window_mask(tokens, to_2tuple(self.window_size), to_2tuple(self.window_size // 2))
        for group in self.groups:
            tokens = group(tokens, mask, rope)
        return self.norm(tokens).permute(0, 3, 1, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() != 4 or x.shape[1] != self.in_chans:
            raise ValueError(f'expected images (B, {self.in_chans}, H, W), got shape {tuple(x.shape)}')
        h, w = x.shape[-2:]
        size = self.window_size
        x = mirror_pad(x, -(-h // size) * size, -(-w // size) * size) - self.mean
        features = self.conv_first(x)
        features = self.conv_after_body(self.forward_features(features)) + features
        out = self.upsample(features) + self.mean
        return out[..., :h * self.upscale, :w * self.upscale]

    @torch.no_grad()
    def forward_tiled(self, x: torch.Tensor, tile: int, overlap: int) -> torch.Tensor:
        """Inference tile by tile (:func:`tiled_upscale`; ``tile`` and ``overlap`` in LR pixels): memory of one
        tile whatever the image size. Equal to ``forward`` when one tile covers the image. Otherwise pixels
        differ: the global attention of each tile sees only that tile (every pixel of it, not only the seams,
        changes) and window attention near seams sees other neighbours and other window borders."""
        return tiled_upscale(self, x, self.upscale, tile, overlap)


def checkpoint_filter_fn(state_dict, model: NaLaSR):
    """Check the tensors' shapes (the model's own keys) against ``model``: a checkpoint of another scale or width
    fails naming the tensors (e.g. ``upsample.0.weight`` for the scale). Wrapper prefixes (DDP, torch.compile,
    our runners) are stripped for callers that pass a wrapped state dict."""
    state_dict = strip_wrapper_prefixes(state_dict)
    check_shapes(state_dict, model.state_dict(), hint=' (another upscale or width?)')
    return state_dict


def _cfg(**kwargs) -> dict:
    return {
        'url': '', 'input_size': (3, 64, 64), 'fixed_input_size': False,
        'num_classes': -1,  # timm then passes no num_classes: an SR network has no classifier
        'mean': (0., 0., 0.), 'std': (1., 1., 1.), 'interpolation': 'bicubic', 'crop_pct': 1.0,
        'first_conv': 'conv_first', 'classifier': None,
        'paper_ids': 'arXiv:2506.21137',
        'paper_name': 'NaLaFormer: Norm-Aware Linear Attention for Transformer Models (super-resolution)',
        'origin_url': 'https://github.com/ZacharyMeng/PolaFormerPP/tree/main/downstream/sr',
        **kwargs,
    }


default_cfgs = generate_default_cfgs({'nalasr_light': _cfg()})

def _create_nala_sr(variant: str, pretrained: bool = False, **kwargs) -> NaLaSR:
    return build_model(NaLaSR, variant, pretrained, MODEL_ARGS[variant], checkpoint_filter_fn, **kwargs)


@register_model
def nalasr_light(pretrained: bool = False, **kwargs) -> NaLaSR:
    """NaLa-SR light (MambaIRv2-Light topology, 0.92M params at x2); ``upscale`` 2 (default), 3 or 4."""
    return _create_nala_sr('nalasr_light', pretrained=pretrained, **kwargs)
