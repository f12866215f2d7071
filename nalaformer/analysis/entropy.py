"""Attention distributions over keys (softmax, or phi(q_i) . phi(k_j) normalised with the kernel's own
``feature_maps``), their per-query entropy (exact, in chunks of queries: O(chunk N) memory), and q, k of
NaLaFormer blocks. RoPE is left out: the release rotates the numerator only, so rotated weights are no
distribution.
"""
from typing import Optional, Tuple

import torch
import torch.nn as nn

from ..errors import ConfigError
from ..ops.kernels import ATTENTION_KERNELS, build_attention_kernel

__all__ = ['ATTN_TYPES', 'attention_probs', 'entropy', 'attention_entropy', 'norm_sweep', 'pearson', 'spearman',
           'capture_kernel_qk', 'capture_qk']

# softmax, and the kernels of nalaformer.ops.nala that are one linear attention (they have feature maps).
ATTN_TYPES = ('softmax', *(name for name, kernel in ATTENTION_KERNELS.items() if kernel.feature_maps is not None))


def attention_probs(attn_type: str, q: torch.Tensor, k: torch.Tensor,
                    kernel_kwargs: Optional[dict] = None) -> torch.Tensor:
    """Attention of queries q (..., M, d) over keys k (..., N, d) under a registered kernel: (..., M, N), rows sum
    to 1 (NaN for a linear kernel whose scores are all zero)."""
    module = build_attention_kernel(attn_type, **(kernel_kwargs or {}))
    if attn_type == 'softmax':
        return torch.softmax(q @ k.transpose(-2, -1) * q.shape[-1] ** -0.5, dim=-1)
    if module.feature_maps is None:
        raise ConfigError(f'attention kernel {attn_type!r} is not one linear attention (no feature maps), so it has no '
                         f'single distribution over keys; choose from {ATTN_TYPES}')
    phi_q, phi_k = module.feature_maps(q, k)
    scores = phi_q @ phi_k.transpose(-2, -1)
    return scores / scores.sum(dim=-1, keepdim=True)


def entropy(probs: torch.Tensor) -> torch.Tensor:
    """Shannon entropy (nats) over the last dim, with 0 log 0 = 0: (..., N) -> (...)."""
    return -torch.special.xlogy(probs, probs).sum(dim=-1)


def attention_entropy(attn_type: str, q: torch.Tensor, k: torch.Tensor, chunk: int = 1024,
                      kernel_kwargs: Optional[dict] = None) -> torch.Tensor:
    """Entropy of each query's attention (:func:`attention_probs`): q (..., M, d), k (..., N, d) -> (..., M).

    Exact; at most (..., chunk, N) scores exist at a time.
    """
    return torch.cat([entropy(attention_probs(attn_type, q[..., i:i + chunk, :], k, kernel_kwargs))
                      for i in range(0, q.shape[-2], chunk)], dim=-1)


def norm_sweep(attn_type: str, q: torch.Tensor, k: torch.Tensor, norms: torch.Tensor, chunk: int = 1024,
               kernel_kwargs: Optional[dict] = None) -> torch.Tensor:
    """Entropy with each query's direction kept and its norm set to each of ``norms`` (S,).

    q (..., M, d), k (..., N, d) -> (S, ..., M). Isolates the effect of |q| alone.
    """
    direction = q / torch.linalg.vector_norm(q, dim=-1, keepdim=True)
    return torch.stack([attention_entropy(attn_type, direction * n, k, chunk, kernel_kwargs) for n in norms.tolist()])


def pearson(x: torch.Tensor, y: torch.Tensor) -> float:
    """Pearson correlation of two flat samples, ignoring pairs with a non-finite value."""
    x, y = x.flatten().double(), y.flatten().double()
    keep = x.isfinite() & y.isfinite()
    x, y = x[keep] - x[keep].mean(), y[keep] - y[keep].mean()
    return float((x * y).sum() / (x.norm() * y.norm()))


def spearman(x: torch.Tensor, y: torch.Tensor) -> float:
    """Spearman rank correlation (Pearson of ranks; ties broken by order, fine for real values)."""
    x, y = x.flatten().double(), y.flatten().double()
    keep = x.isfinite() & y.isfinite()
    rank = lambda v: v.argsort().argsort().double()  # noqa: E731
    return pearson(rank(x[keep]), rank(y[keep]))


def capture_kernel_qk(model: nn.Module, kernel: nn.Module, *inputs) -> Tuple[torch.Tensor, torch.Tensor]:
    """q, k (B, heads, N, d) entering the attention kernel module ``kernel`` (inside ``model``) when
    ``model(*inputs)`` runs in eval mode without gradients. Works for any model."""
    captured = {}
    hook = kernel.register_forward_pre_hook(lambda _, args: captured.update(q=args[0], k=args[1]))
    try:
        with torch.no_grad():
            model.eval()(*inputs)
    finally:
        hook.remove()
    if 'q' not in captured:
        raise ValueError(f'the attention kernel {type(kernel).__name__} did not run in {type(model).__name__}')
    return captured['q'], captured['k']


def capture_qk(model: nn.Module, images: torch.Tensor, stage: int,
               block: int) -> Tuple[torch.Tensor, torch.Tensor, Tuple[int, int]]:
    """q, k (B, heads, N, d) entering the attention kernel of ``model.layers[stage].blocks[block]``.

    Also returns that block's token grid (H, W), N = H * W. Works for NaLaFormer-layout models.
    """
    try:
        attn = model.layers[stage].blocks[block].attn
    except (AttributeError, IndexError, TypeError):
        raise ConfigError(f'{type(model).__name__} has no attention at layers[{stage}].blocks[{block}] '
                         f'(needs a NaLaFormer-layout model)') from None
    captured = {}
    hook = attn.register_forward_pre_hook(lambda _, args: captured.update(grid=tuple(args[0].shape[-2:])))
    try:
        q, k = capture_kernel_qk(model, attn.kernel, images)
    finally:
        hook.remove()
    return q, k, captured['grid']
