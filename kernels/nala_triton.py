"""Fused Triton NaLa attention: custom operators with autograd, and where they can run.

``nala_attention(q, k, v, rope)`` computes exactly what :mod:`nalaformer.ops.nala`'s ``nala_attention``
computes (``nala_feature_maps`` + ``linear_attention``, RoPE included)
without materialising the (B, heads, N, 2d) feature maps; ``nala_cos_attention`` does the same for
``nala_cos``. Shapes: q, k, v (B, heads, N, d) in float16, bfloat16 or float32 (float64 under the
interpreter); rope (2, N, d); output (B, heads, N, d) in float32 (float64 for float64 inputs).
Gradients flow to q, k and v.

The ``nala`` / ``nala_cos`` kernels run these when the NaLa backend is ``'fused'`` and
:func:`unsupported_reason` finds none: :mod:`nalaformer.ops.backend` dispatches; the ``nala_triton`` /
``nala_cos_triton`` kernels (:mod:`nalaformer.ops.kernels`) always ask for it. This module imports nothing
from :mod:`nalaformer.ops`. Triton fixes its mode (compiled or interpreted) when it is first imported
(``import timm`` already imports it), so ``TRITON_INTERPRET=1`` must be set before that.
"""
from typing import Optional, Tuple

import torch

from .interpreter import INTERPRETED  # imports triton: without it, nalaformer.ops.backend leaves the kernels out

__all__ = ['interpreting', 'nala_attention', 'nala_cos_attention', 'triton_supported', 'unsupported_reason']

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


def unsupported_reason(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, rope: torch.Tensor) -> Optional[str]:
    """Why the fused kernels cannot compute attention for these inputs here, or None when they can.

    They take CUDA tensors (any tensors in the interpreter) of one shape (B, heads, N, d), d divisible
    by 4 and at most 128, in float16 / bfloat16 / float32 (float64 in the interpreter only); rope
    (2, N, d) without grad; not while ``torch.export`` traces (an exported graph must not hold the
    operator).
    """
    if q.dim() != 4 or not (q.shape == k.shape == v.shape) or q.numel() == 0:
        return (f'q, k, v of shapes {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)} are not one non-empty '
                f'(B, heads, N, d)')
    n, d = q.shape[-2:]
    if d > MAX_HEAD_DIM:
        return f'head dim {d} is above {MAX_HEAD_DIM}'
    if d % 4:
        return f'head dim {d} is not a multiple of 4'
    if tuple(rope.shape) != (2, n, d):
        return f'the RoPE table has shape {tuple(rope.shape)}, not (2, {n}, {d})'
    if rope.requires_grad:
        return 'the RoPE table requires grad'
    if q.dtype not in _INPUT_DTYPES or not (q.dtype == k.dtype == v.dtype):
        return f'q, k, v have dtypes {q.dtype}, {k.dtype}, {v.dtype}, not one of float16, bfloat16, float32'
    if len({q.device, k.device, v.device, rope.device}) > 1:
        return 'q, k, v and the RoPE table are on different devices'
    if torch.compiler.is_exporting():
        return 'torch.export is tracing (an exported graph cannot hold the fused operator)'
    if interpreting():
        return None
    if q.device.type != 'cuda':
        return f'the tensors are on {q.device.type}, not CUDA (or set TRITON_INTERPRET=1 to interpret the kernels)'
    if q.dtype == torch.float64:
        return 'float64 runs in the Triton interpreter only'
    return None


def triton_supported(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, rope: torch.Tensor) -> bool:
    """Whether the fused kernels can compute attention for these inputs here (see :func:`unsupported_reason`)."""
    return unsupported_reason(q, k, v, rope) is None


def _head_dim_contiguous(x: torch.Tensor) -> torch.Tensor:
    return x if x.stride(-1) == 1 else x.contiguous()


def _compute_dtype(x: torch.Tensor) -> torch.dtype:
    return torch.float64 if x.dtype == torch.float64 else torch.float32


# The fused forward and backward are custom operators, opaque to torch.compile (which cannot trace
# into Triton's launcher or interpreter) and described to it by their fake (shape-only) versions.
@torch.library.custom_op('nalaformer::nala_attention_forward', mutates_args=())
def _forward_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, rope: torch.Tensor,
                alpha: Optional[float]) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(out (B, H, N, d), state (B*H, 2, BLOCK_D, DV_PAD), mean (B*H, 2, BLOCK_D))."""
    q, k, v = (_head_dim_contiguous(x) for x in (q, k, v))
    return _jit().forward(q, k, v, rope.to(_compute_dtype(q)).contiguous(), alpha)


@_forward_op.register_fake
def _forward_fake(q, k, v, rope, alpha):
    batch, heads, _, d = q.shape
    block_d, _, dv_pad = _jit().feature_blocks(d)
    dtype = _compute_dtype(q)
    return (q.new_empty(q.shape, dtype=dtype), q.new_empty(batch * heads, 2, block_d, dv_pad, dtype=dtype),
            q.new_empty(batch * heads, 2, block_d, dtype=dtype))


@torch.library.custom_op('nalaformer::nala_attention_backward', mutates_args=())
def _backward_op(dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, rope: torch.Tensor,
                 state: torch.Tensor, mean: torch.Tensor,
                 alpha: Optional[float]) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dq, dk, dv) like q, k, v, recomputing the feature maps."""
    q, k, v = (_head_dim_contiguous(x) for x in (q, k, v))
    dout = _head_dim_contiguous(dout.to(state.dtype))
    return _jit().backward(dout, q, k, v, rope.to(state.dtype).contiguous(), state, mean, alpha)


@_backward_op.register_fake
def _backward_fake(dout, q, k, v, rope, state, mean, alpha):
    return tuple(torch.empty_like(x, memory_format=torch.contiguous_format) for x in (q, k, v))


def _setup_context(ctx, inputs, output):
    q, k, v, rope, alpha = inputs
    _, state, mean = output
    # Only inputs, the small state and the key mean are kept; the feature maps are recomputed.
    ctx.save_for_backward(q, k, v, rope, state, mean)
    ctx.mark_non_differentiable(state, mean)
    ctx.alpha = alpha


def _backward(ctx, dout, _dstate, _dmean):
    q, k, v, rope, state, mean = ctx.saved_tensors
    return _backward_op(dout, q, k, v, rope, state, mean, ctx.alpha) + (None, None)


_forward_op.register_autograd(_backward, setup_context=_setup_context)


def nala_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, rope: torch.Tensor) -> torch.Tensor:
    """Fused release NaLa attention: q, k, v (B, heads, N, d), rope (2, N, d) -> (B, heads, N, d) float32."""
    return _forward_op(q, k, v, rope, None)[0]


def nala_cos_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, rope: torch.Tensor,
                       alpha: float = 20.0) -> torch.Tensor:
    """Fused cosine-inhibit NaLa attention (``nala_cos``), same shapes as :func:`nala_attention`."""
    return _forward_op(q, k, v, rope, float(alpha))[0]
