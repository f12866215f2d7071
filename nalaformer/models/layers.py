"""Building blocks of NaLaFormer as released, on (B, C, H, W) maps.

Module and parameter names follow the authors' release so that its checkpoints load
without renaming (``qkvg``, ``lepe``, ``cpe1``, ``norm1.norm``, ``RoPE.angle``, ...).

Inside a stage the maps are kept channels-last in memory (``torch.channels_last``: the (B, H*W, C)
token matrix of the linear layers and the (B, C, H, W) map of the convolutions are then views of
one another), so that no block copies between the two layouts; values are as in channels-first.

At inference (no autograd graph recorded: ``torch.no_grad`` / ``torch.inference_mode``) the blocks do
their element-wise work in place on the temporaries they made themselves (never on their input or on
anything autograd keeps), which lowers the peak memory: the plain ops' operations, results equal up to
float rounding. As with timm's in-place activations, a forward hook that keeps a submodule's output
(``qkvg``, ``fc1``, ``cpe1``, ``attn``, ``ffn``, ...) sees it overwritten later: clone it in the hook, or run within
``inplace_inference(False)``.

Inference reparameterization (timm's convention: ``timm.utils.reparameterize_model(model)`` calls every
module's ``reparameterize()`` / ``fuse()``): a residual around a depthwise conv becomes one conv (+1 at
the kernel's centre tap), LayerScale is folded into the branch's last Linear, and each BatchNorm into the
conv or Linear before it. The folds are exact up to float rounding and use BatchNorm's running
statistics. A reparameterized model is for inference only: its state dict differs from the trained
model's (no ``gamma_*``, no BatchNorm entries, other values in the convs that absorbed a residual), so
it takes neither training nor the release's checkpoints.
"""
import contextlib
import contextvars
from typing import Iterator, List, Optional, Sequence

import torch
import torch.nn as nn
import torch.nn.functional as F
from timm.layers import DropPath, register_notrace_module
from torch.nn.utils.fusion import fuse_conv_bn_weights

from ..ops.kernels import build_attention_kernel
from ..ops.nala import rope_angles, rope_table
from .recompute import recompute

__all__ = ['LayerNorm2d', 'NaLaAttention', 'ConvFFN', 'NaLaBlock', 'RoPE2d', 'NaLaStage', 'Downsample', 'Stem',
           'fold_batchnorm', 'fold_scale', 'inplace_inference']

_inplace = contextvars.ContextVar('nalaformer_inplace_inference', default=True)


@contextlib.contextmanager
def inplace_inference(enabled: bool) -> Iterator[None]:
    """Within the block (in this thread or task), whether inference may overwrite the blocks' temporaries
    (default True; False runs the plain out-of-place ops, e.g. for hooks that keep submodule outputs)."""
    token = _inplace.set(bool(enabled))
    try:
        yield
    finally:
        _inplace.reset(token)


def _in_place(x: torch.Tensor) -> bool:
    """Whether a module may overwrite the temporaries it made while computing on x: at inference only.

    Not while torch.fx traces (the graph would keep the in-place ops whatever the grad mode it later runs
    in) nor under torch.compile / torch.export (which plan memory themselves).
    """
    if torch.jit.is_scripting():
        return not torch.is_grad_enabled()
    else:
        return not (torch.is_grad_enabled() or torch.compiler.is_compiling() or isinstance(x, torch.fx.Proxy)) \
            and _inplace.get()


def _add(x: torch.Tensor, fresh: torch.Tensor, in_place: bool) -> torch.Tensor:
    """x + fresh, written into ``fresh`` (a temporary of the caller's, of the result's shape) when in_place and
    that keeps the plain op's dtype: the same values either way (float addition commutes exactly)."""
    if in_place and torch.promote_types(fresh.dtype, x.dtype) == fresh.dtype:
        return fresh.add_(x)
    return x + fresh


def _mul(x: torch.Tensor, fresh: torch.Tensor, in_place: bool) -> torch.Tensor:
    """x * fresh, written into ``fresh`` as :func:`_add` does."""
    if in_place and torch.promote_types(fresh.dtype, x.dtype) == fresh.dtype:
        return fresh.mul_(x)
    return x * fresh


def _fold_dtype(t: torch.Tensor) -> torch.dtype:
    return torch.float32 if t.device.type == 'mps' else torch.float64  # MPS has no float64


@torch.no_grad()
def fold_batchnorm(conv: nn.Conv2d, bn: nn.Module) -> bool:
    """Fold an eval-mode BatchNorm (its running statistics) into the conv before it, in place
    (``torch.nn.utils.fusion.fuse_conv_bn_weights``): ``bn(conv(x)) == conv(x)`` afterwards, up to float
    rounding. The caller then drops ``bn``. Returns False, changing nothing, when ``bn`` keeps no running
    statistics (nothing to fold).
    """
    if not isinstance(bn, nn.modules.batchnorm._BatchNorm) or bn.running_mean is None or bn.running_var is None:
        return False
    conv.weight, conv.bias = fuse_conv_bn_weights(conv.weight, conv.bias, bn.running_mean, bn.running_var, bn.eps,
                                                  bn.weight, bn.bias)
    return True


@torch.no_grad()
def fold_scale(linear: nn.Linear, scale: torch.Tensor):
    """Fold a per-output-channel scale (LayerScale's gamma, any shape with out_features elements) into
    ``linear`` in place: ``linear(x) * scale`` (over its output channels) == ``linear(x)`` afterwards."""
    dtype = _fold_dtype(linear.weight)
    scale = scale.reshape(-1).to(dtype)
    linear.weight.copy_(linear.weight.to(dtype) * scale[:, None])
    if linear.bias is not None:
        linear.bias.copy_(linear.bias.to(dtype) * scale)


def _weight_in_format_of(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """A depthwise weight (C, 1, k, k) with the strides of x's memory format.

    Both formats give such a weight the same strides except for its size-1 dim, and PyTorch's CPU
    convolution reads them: given a channels-first-strided weight it converts a channels-last input to
    channels-first and back (measured: 14.7 ms vs 1.7 ms for C 256 at 112x112, one thread).
    """
    if x.dim() == 4 and x.is_contiguous(memory_format=torch.channels_last) and not x.is_contiguous():
        return weight.to(memory_format=torch.channels_last)
    return weight


@register_notrace_module  # its layout test is control flow: a leaf for torch.fx
class DepthwiseConv2d(nn.Conv2d):
    """k x k depthwise convolution, 'same' padding, run in its input's memory format.

    Where its owner adds its input to its output (x + conv(x)), :meth:`fold_identity` (inference
    reparameterization) makes that one convolution, whose kernel has +1 at its centre tap: ``forward``
    then computes x + conv(x) itself and ``identity_in_kernel`` tells the owner to add nothing.
    """

    def __init__(self, dim: int, kernel_size: int, device=None, dtype=None):
        super().__init__(dim, dim, kernel_size, padding=kernel_size // 2, groups=dim, device=device, dtype=dtype)
        self.identity_in_kernel = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self._conv_forward(x, _weight_in_format_of(x, self.weight), self.bias)

    @torch.no_grad()
    def fold_identity(self):
        """Make ``forward`` compute x + conv(x) by adding 1 at the kernel's centre tap (inference only;
        idempotent). Exact up to float rounding: the centre tap w becomes the float nearest to w + 1."""
        if self.identity_in_kernel:
            return
        k0, k1 = self.kernel_size[0] // 2, self.kernel_size[1] // 2
        self.weight[:, 0, k0, k1] += 1
        self.identity_in_kernel = True


def depthwise_conv(dim: int, kernel_size: int, device=None, dtype=None) -> DepthwiseConv2d:
    return DepthwiseConv2d(dim, kernel_size, device=device, dtype=dtype)


class LayerNorm2d(nn.Module):
    """LayerNorm over the channels of a (B, C, H, W) map (the release's ``norm1.norm`` layout)."""

    def __init__(self, dim: int, eps: float = 1e-6, device=None, dtype=None):
        super().__init__()
        self.norm = nn.LayerNorm(dim, eps=eps, device=device, dtype=dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(x.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)


class NaLaAttention(nn.Module):
    """Gated attention block of the release around a kernel from :mod:`nalaformer.ops.kernels`.

    tokens -> Linear(C, 4C) -> q, k, v, g;  y = kernel(q, k, v) + LePE(v)  (5x5 depthwise conv);
    out = out_proj(LayerNorm(y) * SiLU(g)).  ``attn_type='nala'`` is the release's norm-aware
    linear attention, ``'softmax'`` its softmax blocks; any registered kernel name works.

    Args:
        dim: channels C. num_heads: heads (head dim C / heads must be divisible by 4 for RoPE).
        attn_type: kernel name. kernel_kwargs: extra arguments of the kernel (e.g. alpha).
        lepe: False drops LePE, so the kernel is the only way tokens interact.

    ``forward(x, rope=None)``: x (B, C, H, W) -> (B, C, H, W). ``rope`` is the (2, H*W, C/heads)
    table of :func:`rope_table`; when None it is computed for this x's H, W.
    """

    def __init__(self, dim: int, num_heads: int, attn_type: str = 'nala', kernel_kwargs: Optional[dict] = None,
                 lepe: bool = True, device=None, dtype=None):
        super().__init__()
        if dim % num_heads:
            raise ValueError(f'dim {dim} is not divisible by num_heads {num_heads}')
        dd = dict(device=device, dtype=dtype)
        self.num_heads = num_heads
        self.head_dim = dim // num_heads
        self.qkvg = nn.Linear(dim, dim * 4, **dd)
        self.act = nn.SiLU()
        self.lepe = depthwise_conv(dim, 5, **dd) if lepe else None
        self.out_proj = nn.Linear(dim, dim, **dd)
        self.ln = nn.LayerNorm(dim, **dd)
        self.kernel = build_attention_kernel(attn_type, **(kernel_kwargs or {}))

    def split_heads(self, x: torch.Tensor) -> torch.Tensor:
        """(B, N, C) -> (B, heads, N, head_dim)."""
        return x.unflatten(-1, (self.num_heads, self.head_dim)).transpose(1, 2)

    def forward(self, x: torch.Tensor, rope: Optional[torch.Tensor] = None) -> torch.Tensor:
        B, C, H, W = x.shape
        in_place = _in_place(x)  # SiLU(g), the LePE sum and the gating in the temporaries that hold them
        if rope is None:
            rope = rope_table(rope_angles(self.head_dim, device=x.device), H, W)
        q, k, v, g = self.qkvg(x.flatten(2).transpose(1, 2)).chunk(4, dim=-1)
        y = self.kernel(self.split_heads(q), self.split_heads(k), self.split_heads(v), rope)
        y = y.transpose(1, 2).flatten(2).to(v.dtype)
        if self.lepe is not None:
            y = _add(y, self.lepe(v.contiguous().transpose(1, 2).reshape(B, C, H, W)).flatten(2).transpose(1, 2),
                     in_place)
        g = F.silu(g, inplace=True) if in_place else self.act(g)  # g: a slice of qkvg's output, used once
        out = self.out_proj(_mul(g, self.ln(y), in_place))
        return out.transpose(1, 2).reshape(B, C, H, W)


class _GeluConvResidual(torch.autograd.Function):
    """h = GELU(a); h + depthwise_conv(h), storing only ``a`` for backward and recomputing GELU(a) there.

    Autograd would keep both ``a`` (for GELU) and ``h`` (for the convolution's weight gradient): two of
    the ConvFFN's three (B, 4C, H, W) activations. Same values as the plain ops.
    """

    @staticmethod
    def forward(ctx, a: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, padding: int) -> torch.Tensor:
        h = F.gelu(a)
        ctx.save_for_backward(a, weight)
        ctx.padding = padding
        return h + F.conv2d(h, _weight_in_format_of(h, weight), bias, padding=padding, groups=weight.shape[0])

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        a, weight = ctx.saved_tensors
        h = F.gelu(a)
        padding = [ctx.padding, ctx.padding]
        # Under autocast the forward's convolution ran in a's dtype; backward runs outside autocast (autograd
        # casts the weight's and bias's gradients back to their dtype).
        grad_h, grad_weight, grad_bias = torch.ops.aten.convolution_backward(
            grad, h, _weight_in_format_of(h, weight).to(h.dtype), [weight.shape[0]], [1, 1], padding, [1, 1], False,
            [0, 0], weight.shape[0], [True, ctx.needs_input_grad[1], ctx.needs_input_grad[2]])
        return torch.ops.aten.gelu_backward(grad_h + grad, a), grad_weight, grad_bias, None


@register_notrace_module  # _GeluConvResidual is opaque to torch.fx: a leaf
class ConvFFN(nn.Module):
    """fc1 -> GELU -> (3x3 depthwise conv + residual) -> fc2 on a (B, C, H, W) map; ``conv=False``: a plain
    per-token MLP (no depthwise conv).

    In training the GELU output is recomputed in backward (:class:`_GeluConvResidual`) instead of stored; at
    inference GELU and the residual sum are done in place on fc1's output and the conv's output.

    ``reparameterize()`` (inference only) folds the residual into the depthwise conv's kernel.
    """

    def __init__(self, dim: int, hidden_dim: int, conv: bool = True, device=None, dtype=None):
        super().__init__()
        dd = dict(device=device, dtype=dtype)
        self.act = nn.GELU()
        self.fc1 = nn.Linear(dim, hidden_dim, **dd)
        self.fc2 = nn.Linear(hidden_dim, dim, **dd)
        self.dwconv = depthwise_conv(hidden_dim, 3, **dd) if conv else None

    def mix(self, a: torch.Tensor, in_place: bool = False) -> torch.Tensor:
        """GELU(a) + dwconv(GELU(a)) for the hidden map a (B, hidden, H, W).

        ``in_place`` (inference only): a is a temporary the caller gives up; GELU overwrites it.
        """
        if in_place:
            h = torch.ops.aten.gelu_(a, approximate=self.act.approximate)
        else:
            if self.dwconv is not None and not self.dwconv.identity_in_kernel and not torch.jit.is_scripting():
                if torch.is_grad_enabled():
                    return _GeluConvResidual.apply(a, self.dwconv.weight, self.dwconv.bias, self.dwconv.padding[0])
            h = self.act(a)
        if self.dwconv is None:
            return h
        y = self.dwconv(h)
        return y if self.dwconv.identity_in_kernel else _add(h, y, in_place)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, C, H, W = x.shape
        a = self.fc1(x.flatten(2).transpose(1, 2)).transpose(1, 2).reshape(B, -1, H, W)
        h = self.mix(a, _in_place(x))
        return self.fc2(h.flatten(2).transpose(1, 2)).transpose(1, 2).reshape(B, C, H, W)

    @torch.no_grad()
    def reparameterize(self):
        """Fold the residual around the depthwise conv into its kernel, h + dwconv(h) -> dwconv(h) (+1 at its
        centre tap), for inference (timm's ``reparameterize_model``). In place and idempotent; the module is
        then for inference only (its ``dwconv.weight`` is not the trained one)."""
        if self.dwconv is not None:
            self.dwconv.fold_identity()


class NaLaBlock(nn.Module):
    """x += cpe1(x); x += gamma_1 attn(LN(x)); x += cpe2(x); x += gamma_2 ffn(LN(x)).

    ``layer_scale_init_value=None`` drops the LayerScale parameters (gamma_1, gamma_2).
    ``conv_mixers=False`` drops the convolutional token mixers (cpe1, cpe2, the attention's LePE, the FFN's
    depthwise conv): attention is then the only way tokens interact.

    At inference the residual sums are written into the branch outputs (never into the block's input).
    ``reparameterize()`` makes the deploy block: x + cpe(x) becomes one depthwise conv, gamma_1 / gamma_2
    are folded into ``attn.out_proj`` / ``ffn.fc2`` and set to None. A reparameterized block is for
    inference only; its state dict has no ``gamma_*`` and other cpe / dwconv weights.
    """

    def __init__(self, dim: int, num_heads: int, mlp_ratio: float, attn_type: str = 'nala',
                 kernel_kwargs: Optional[dict] = None, drop_path: float = 0.,
                 layer_scale_init_value: Optional[float] = 1.0, conv_mixers: bool = True, device=None, dtype=None):
        super().__init__()
        dd = dict(device=device, dtype=dtype)
        if layer_scale_init_value is None:
            self.gamma_1 = None
            self.gamma_2 = None
        else:
            self.gamma_1 = nn.Parameter(torch.full((1, dim, 1, 1), float(layer_scale_init_value), **dd))
            self.gamma_2 = nn.Parameter(torch.full((1, dim, 1, 1), float(layer_scale_init_value), **dd))
        self.norm1 = LayerNorm2d(dim, **dd)
        self.attn = NaLaAttention(dim, num_heads, attn_type, kernel_kwargs, lepe=conv_mixers, **dd)
        self.drop_path = DropPath(drop_path) if drop_path > 0. else nn.Identity()
        self.norm2 = LayerNorm2d(dim, **dd)
        self.ffn = ConvFFN(dim, int(mlp_ratio * dim), conv=conv_mixers, **dd)
        self.cpe1 = depthwise_conv(dim, 3, **dd) if conv_mixers else None
        self.cpe2 = depthwise_conv(dim, 3, **dd) if conv_mixers else None

    def forward(self, x: torch.Tensor, rope: torch.Tensor) -> torch.Tensor:
        in_place = _in_place(x)  # each sum into its branch's fresh output
        if self.cpe1 is not None:
            y = self.cpe1(x)
            x = y if self.cpe1.identity_in_kernel else _add(x, y, in_place)
        y = self.attn(self.norm1(x), rope)
        if self.gamma_1 is not None:
            y = _mul(self.gamma_1, y, in_place)
        x = _add(x, self.drop_path(y), in_place)
        if self.cpe2 is not None:
            y = self.cpe2(x)
            x = y if self.cpe2.identity_in_kernel else _add(x, y, in_place)
        y = self.ffn(self.norm2(x))
        if self.gamma_2 is not None:
            y = _mul(self.gamma_2, y, in_place)
        return _add(x, self.drop_path(y), in_place)

    @torch.no_grad()
    def reparameterize(self):
        """The inference block (timm's ``reparameterize_model``): cpe1 / cpe2 absorb their residual (+1 at the
        kernel's centre tap), LayerScale is folded into the last Linear of its branch (gamma_1 into
        ``attn.out_proj``, gamma_2 into ``ffn.fc2``, then None), and the FFN's own residual conv is folded
        (:meth:`ConvFFN.reparameterize`). In place and idempotent; exact up to float rounding in the weights'
        dtype. Fold in float32 and cast afterwards, if at all: in float16 a tiny LayerScale (1e-6, as
        nalaformer_b / _l are initialised) times the Linear's weights can underflow to 0, and in bf16 / float16
        a centre tap w + 1 keeps fewer of w's bits than w alone."""
        for cpe in (self.cpe1, self.cpe2):
            if cpe is not None:
                cpe.fold_identity()
        if self.gamma_1 is not None:
            fold_scale(self.attn.out_proj, self.gamma_1)
            self.gamma_1 = None
        if self.gamma_2 is not None:
            fold_scale(self.ffn.fc2, self.gamma_2)
            self.gamma_2 = None
        self.ffn.reparameterize()


@register_notrace_module  # the table depends on the input's H and W
class RoPE2d(nn.Module):
    """Builds the 2D RoPE table of a feature map: ``forward(x)`` -> (2, H*W, head_dim) for x's H, W, in float32.

    x is (B, C, H, W), or (B, H, W, C) with ``channels_last``. ``angle_buffer``: the frequencies
    (head_dim / 2) are kept in the buffer ``angle``, as in NaLaFormer's release (its checkpoints hold
    them); False computes them per call, so that the module holds no state (NaLa-Swin: Swin's state dict).
    """

    def __init__(self, head_dim: int, channels_last: bool = False, angle_buffer: bool = True, device=None):
        super().__init__()
        angles = rope_angles(head_dim, device=device)  # checks head_dim
        self.head_dim = head_dim
        self.channels_last = channels_last
        if angle_buffer:
            self.register_buffer('angle', angles)
        else:
            self.angle = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        height, width = (x.shape[1], x.shape[2]) if self.channels_last else (x.shape[-2], x.shape[-1])
        angles = rope_angles(self.head_dim, device=x.device) if self.angle is None else self.angle.float()
        return rope_table(angles, height, width)


class Downsample(nn.Module):
    """3x3 stride-2 conv + BatchNorm (the release's ``downsample.reduction`` / ``.norm``).

    ``reparameterize()`` (inference only) folds the BatchNorm into the conv; ``norm`` becomes Identity.
    """

    def __init__(self, dim: int, out_dim: int, device=None, dtype=None):
        super().__init__()
        self.reduction = nn.Conv2d(dim, out_dim, 3, stride=2, padding=1, device=device, dtype=dtype)
        self.norm = nn.BatchNorm2d(out_dim, device=device, dtype=dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(self.reduction(x))

    @torch.no_grad()
    def reparameterize(self):
        """Fold the BatchNorm's running statistics into ``reduction`` and drop it (``norm`` -> Identity), for
        inference (timm's ``reparameterize_model``). In place and idempotent; the state dict then has no
        ``norm`` entries."""
        if fold_batchnorm(self.reduction, self.norm):
            self.norm = nn.Identity()


class NaLaStage(nn.Module):
    """One resolution: shared RoPE table + blocks; ``forward`` returns the stage's feature map.

    The release stores the following stage's downsampling inside this stage (``downsample``);
    the model applies it after taking the feature map, so features sit at strides 4/8/16/32.
    """

    def __init__(self, dim: int, depth: int, num_heads: int, mlp_ratio: float, attn_type: str,
                 out_dim: Optional[int] = None, drop_path: Sequence[float] = (),
                 layer_scale_init_value: Optional[float] = 1.0, kernel_kwargs: Optional[dict] = None,
                 conv_mixers: bool = True, device=None, dtype=None):
        super().__init__()
        dd = dict(device=device, dtype=dtype)
        self.grad_checkpointing = False
        self.RoPE = RoPE2d(dim // num_heads, device=device)
        drop_path = list(drop_path) or [0.] * depth
        self.blocks = nn.ModuleList([
            NaLaBlock(dim, num_heads, mlp_ratio, attn_type, kernel_kwargs, drop_path[i], layer_scale_init_value,
                      conv_mixers, **dd)
            for i in range(depth)])
        self.downsample = Downsample(dim, out_dim, **dd) if out_dim is not None else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rope = self.RoPE(x)
        x = x.contiguous(memory_format=torch.channels_last)  # see the module docstring; a no-op after stage 0
        for block in self.blocks:
            if self.grad_checkpointing and not torch.jit.is_scripting():
                x = recompute(block, x, rope, selective=self.grad_checkpointing == 'selective')
            else:
                x = block(x, rope)
        return x


class Stem(nn.Module):
    """Four 3x3 convs (stride 2, 1, 1, 2) with BatchNorm, GELU between: (B, 3, H, W) -> (B, C, H/4, W/4).

    ``reparameterize()`` (inference only) folds each BatchNorm into its conv; the BatchNorms become Identity
    (the convs keep their names, ``proj.0``, ``proj.3``, ...).
    """

    def __init__(self, in_chans: int, dim: int, device=None, dtype=None):
        super().__init__()
        dd = dict(device=device, dtype=dtype)
        half = dim // 2
        layers: List[nn.Module] = []
        for i, (cin, cout, stride) in enumerate([(in_chans, half, 2), (half, half, 1), (half, half, 1), (half, dim, 2)]):
            if i:
                layers.append(nn.GELU())
            layers += [nn.Conv2d(cin, cout, 3, stride=stride, padding=1, **dd), nn.BatchNorm2d(cout, **dd)]
        self.proj = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(x)

    @torch.no_grad()
    def reparameterize(self):
        """Fold every BatchNorm's running statistics into the conv before it and drop it (Identity in its place),
        for inference (timm's ``reparameterize_model``). In place and idempotent."""
        for i in range(1, len(self.proj)):
            if isinstance(self.proj[i - 1], nn.Conv2d) and fold_batchnorm(self.proj[i - 1], self.proj[i]):
                self.proj[i] = nn.Identity()
