"""Fused Triton NaLa attention: custom operators with autograd, and the ``nala_triton`` / ``nala_cos_triton`` kernels.

``nala_attention(q, k, v, rope, tuning=None, grid=None)`` computes exactly what the ``nala``
kernel of :mod:`nalaformer.ops.nala` computes (``nala_feature_maps`` + ``linear_attention``, RoPE
included) without materialising the (B, heads, N, 2d) feature maps; ``nala_cos_attention``
does the same for ``nala_cos``. Shapes: q, k, v (B, heads, N, d) in float16, bfloat16 or
float32 (float64 under the interpreter); rope (2, N, d); output (B, heads, N, d) in float32
(float64 for float64 inputs). Gradients flow to q, k and v.

``grid=(H, W)`` says that the N = H * W tokens are a row-major grid and rope is its
``rope_table(angles, H, W)``: the kernels then read the table's values through its H + W
distinct rows (row and column factors) instead of N rows, which keeps the table in cache. The
result is the same; a table that is not ``rope_table``'s for that grid must come without one.

``tuning`` (a :class:`~nalaformer.kernels.tuning.Tuning`; default: ``current_tuning()``, see
``use_tuning``) sets block sizes, warps and the operands of the tile products; the backward
of a call uses the tuning of its forward. The registered kernels take it as a dict:
``build_attention_kernel('nala_triton', tuning=dict(block_n=32, dot='bf16'))``.

The registered kernels run the fused path on CUDA tensors, or on any tensor when Triton
runs in interpreter mode, and fall back to the PyTorch reference otherwise and for
unsupported shapes. Triton fixes its mode when it is first imported (``import timm`` already
imports it), so ``TRITON_INTERPRET=1`` must be set before that.
"""
from typing import Optional, Tuple

import torch
import triton  # an ImportError here leaves the kernels unregistered
from triton.runtime.interpreter import InterpretedFunction

from nalaformer.ops.nala import (
    AttentionKernel, linear_attention, nala_cos_feature_maps, nala_feature_maps, register_attention_kernel,
)

from .tuning import Tuning, current_tuning, feature_blocks, resolve_dot, use_tuning

__all__ = ['interpreting', 'nala_attention', 'nala_cos_attention', 'triton_supported', 'Tuning', 'current_tuning',
           'resolve_dot', 'use_tuning', 'NaLaTritonKernel', 'NaLaCosTritonKernel']

# Triton wraps its language functions for the interpreter when it is first imported with
# TRITON_INTERPRET=1; the kernels (nala_jit) check that they are built in the same mode.
INTERPRETED = isinstance(triton.language.zeros, InterpretedFunction)
_INPUT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
# Larger heads would need (2, 128, 128)-plus fp32 tiles per program.
MAX_HEAD_DIM = 128


def _jit():
    """The kernel module, imported on first use."""
    from . import nala_jit
    return nala_jit


def interpreting() -> bool:
    """Whether fused calls run in the Triton interpreter (fixed when triton was first imported)."""
    return INTERPRETED


def triton_supported(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, rope: torch.Tensor) -> bool:
    """Whether the fused kernels can compute attention for these inputs here."""
    if q.dim() != 4 or not (q.shape == k.shape == v.shape) or q.numel() == 0:
        return False
    n, d = q.shape[-2:]
    if d % 4 or d > MAX_HEAD_DIM or tuple(rope.shape) != (2, n, d) or rope.requires_grad:
        return False
    if q.dtype not in _INPUT_DTYPES or not (q.dtype == k.dtype == v.dtype):
        return False
    if len({q.device, k.device, v.device, rope.device}) > 1:
        return False
    if interpreting():
        return True
    return q.device.type == 'cuda' and q.dtype != torch.float64


def _head_dim_contiguous(x: torch.Tensor) -> torch.Tensor:
    return x if x.stride(-1) == 1 else x.contiguous()


def _compute_dtype(x: torch.Tensor) -> torch.dtype:
    return torch.float64 if x.dtype == torch.float64 else torch.float32


# The fused forward and backward are custom operators, opaque to torch.compile (which cannot trace
# into Triton's launcher or interpreter) and described to it by their fake (shape-only) versions.
# A Tuning travels as its fields, since operator schemas take only plain types.
def _tuning_args(tune: Tuning) -> tuple:
    return tune.block_n, tune.num_warps, tune.num_stages, tune.dot, tune.programs


def _grid_width(grid: Optional[Tuple[int, int]], n: int) -> Optional[int]:
    """W of a token grid (H, W), checked against the N tokens; None without a grid."""
    if grid is None:
        return None
    height, width = grid
    if height < 1 or width < 1 or height * width != n:
        raise ValueError(
            f'grid={tuple(grid)} does not match the N = {n} tokens of q, k, v: give (H, W) with H * W = N for a '
            f'rope_table(angles, H, W) table, or grid=None for any other (2, N, d) table')
    return width


@torch.library.custom_op('nalaformer::nala_attention_forward', mutates_args=())
def _forward_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, rope: torch.Tensor, grid_width: Optional[int],
                alpha: Optional[float], block_n: int, num_warps: int, num_stages: int, dot: str,
                programs: Optional[int]) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Two passes over the tokens: (out (B, H, N, d), state (B*H, 2, BLOCK_D, DV_PAD), mean (B*H, 2, BLOCK_D))."""
    tune = Tuning(block_n, num_warps, num_stages, dot, programs)
    q, k, v = (_head_dim_contiguous(x) for x in (q, k, v))
    rope = rope.to(_compute_dtype(q)).contiguous()
    jit = _jit()
    state, mean = jit.forward_state(k, v, rope, grid_width, alpha, tune)
    return jit.forward_output(q, rope, grid_width, state, mean, alpha, tune), state, mean


@_forward_op.register_fake
def _forward_fake(q, k, v, rope, grid_width, alpha, block_n, num_warps, num_stages, dot, programs):
    batch, heads, _, d = q.shape
    block_d, _, dv_pad = feature_blocks(d)
    dtype = _compute_dtype(q)
    return (q.new_empty(q.shape, dtype=dtype), q.new_empty(batch * heads, 2, block_d, dv_pad, dtype=dtype),
            q.new_empty(batch * heads, 2, block_d, dtype=dtype))


@torch.library.custom_op('nalaformer::nala_attention_backward', mutates_args=())
def _backward_op(dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, rope: torch.Tensor,
                 grid_width: Optional[int], state: torch.Tensor, mean: torch.Tensor, alpha: Optional[float],
                 block_n: int, num_warps: int, num_stages: int, dot: str,
                 programs: Optional[int]) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Two passes (three for head dims over 64), recomputing the feature maps: (dq, dk, dv) like q, k, v."""
    tune = Tuning(block_n, num_warps, num_stages, dot, programs)
    q, k, v = (_head_dim_contiguous(x) for x in (q, k, v))
    rope = rope.to(state.dtype).contiguous()
    dout = _head_dim_contiguous(dout.to(state.dtype))
    jit = _jit()
    dq, dmean, dstate = jit.backward_query(q, dout, rope, grid_width, state, mean, alpha, tune)
    dk, dv = jit.backward_key(k, v, rope, grid_width, dstate, dmean, alpha, tune)
    return dq, dk, dv


@_backward_op.register_fake
def _backward_fake(dout, q, k, v, rope, grid_width, state, mean, alpha, block_n, num_warps, num_stages, dot,
                   programs):
    return tuple(torch.empty_like(x, memory_format=torch.contiguous_format) for x in (q, k, v))


def _setup_context(ctx, inputs, output):
    q, k, v, rope, grid_width, alpha, *tuning = inputs
    _, state, mean = output
    # Only inputs, the small state and the key mean are kept; the feature maps are recomputed.
    ctx.save_for_backward(q, k, v, rope, state, mean)
    ctx.mark_non_differentiable(state, mean)
    ctx.grid_width, ctx.alpha, ctx.tuning = grid_width, alpha, tuning


def _backward(ctx, dout, _dstate, _dmean):
    q, k, v, rope, state, mean = ctx.saved_tensors
    dq, dk, dv = _backward_op(dout, q, k, v, rope, ctx.grid_width, state, mean, ctx.alpha, *ctx.tuning)
    return (dq, dk, dv) + (None,) * 8


_forward_op.register_autograd(_backward, setup_context=_setup_context)


def nala_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, rope: torch.Tensor,
                   tuning: Optional[Tuning] = None, grid: Optional[Tuple[int, int]] = None) -> torch.Tensor:
    """Fused release NaLa attention: q, k, v (B, heads, N, d), rope (2, N, d) -> (B, heads, N, d) float32.

    grid: (H, W) when rope is ``rope_table(angles, H, W)`` (see the module docstring).
    """
    return _forward_op(q, k, v, rope, _grid_width(grid, q.shape[-2]), None,
                       *_tuning_args(tuning or current_tuning()))[0]


def nala_cos_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, rope: torch.Tensor,
                       alpha: float = 20.0, tuning: Optional[Tuning] = None,
                       grid: Optional[Tuple[int, int]] = None) -> torch.Tensor:
    """Fused cosine-inhibit NaLa attention (``nala_cos``), same shapes as :func:`nala_attention`."""
    return _forward_op(q, k, v, rope, _grid_width(grid, q.shape[-2]), float(alpha),
                       *_tuning_args(tuning or current_tuning()))[0]


@register_attention_kernel('nala_triton')
class NaLaTritonKernel(AttentionKernel):
    """The ``nala`` kernel, fused in Triton where it can run (see :func:`triton_supported`).

    ``tuning``: a dict of :class:`Tuning` fields for this kernel's calls (checked here); None
    follows ``current_tuning()`` at each call.
    """
    function_name = 'nala'
    launch_args = ('tuning',)

    def __init__(self, tuning: Optional[dict] = None):
        super().__init__()
        self.tuning = None if tuning is None else Tuning(**tuning)

    def extra_repr(self) -> str:
        return '' if self.tuning is None else f'tuning={self.tuning}'

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, rope: torch.Tensor,
                grid: Optional[Tuple[int, int]] = None) -> torch.Tensor:
        # Unlike the base class, float16 / bfloat16 inputs reach the kernels as they are: they
        # upcast on load. The output is float32 either way.
        half = (torch.float16, torch.bfloat16)
        q, k, v = (x if x.dtype in half else x.float() for x in (q, k, v))
        rope = rope.float()
        if not triton_supported(q, k, v, rope):
            return super().forward(q, k, v, rope)  # the PyTorch reference (attend)
        with torch.autocast('cuda', enabled=False), torch.autocast('cpu', enabled=False):
            return self.fused(q, k, v, rope, grid)

    def fused(self, q, k, v, rope, grid):
        return nala_attention(q, k, v, rope, self.tuning, grid)

    def feature_maps(self, q: torch.Tensor, k: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        return nala_feature_maps(q, k)

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, rope: torch.Tensor) -> torch.Tensor:
        """The PyTorch reference, where the fused kernels cannot run."""
        return linear_attention(*self.feature_maps(q, k), v, rope)


@register_attention_kernel('nala_cos_triton')
class NaLaCosTritonKernel(NaLaTritonKernel):
    """The ``nala_cos`` kernel (cosine inhibit, sharpness ``alpha``), fused in Triton where it can run."""
    function_name = 'nala_cos'

    def __init__(self, alpha: float = 20.0, tuning: Optional[dict] = None):
        super().__init__(tuning)
        self.alpha = alpha

    def extra_repr(self) -> str:
        return ', '.join(filter(None, [f'alpha={self.alpha}', super().extra_repr()]))

    def fused(self, q, k, v, rope, grid):
        return nala_cos_attention(q, k, v, rope, self.alpha, self.tuning, grid)

    def feature_maps(self, q: torch.Tensor, k: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        return nala_cos_feature_maps(q, k, self.alpha)
