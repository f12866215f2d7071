"""Attention distributions over keys (softmax, or phi(q_i) . phi(k_j) normalised, with the kernel's own
``feature_maps``), their per-query entropy (exact, in chunks of queries), and q, k of NaLaFormer blocks. RoPE is left
out: the release rotates the numerator only, so rotated weights are no distribution.
"""
from contextlib import contextmanager
from typing import Dict, Iterator, Optional, Tuple

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
    module = build_attention_kernel(attn_type, **(kernel_kwargs or {}))  # also checks the name and arguments
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
    """Entropy of each query's attention: q (..., M, d), k (..., N, d) -> (..., M); at most (..., chunk, N) scores
    exist at a time."""
    return torch.cat([entropy(attention_probs(attn_type, q[..., i:i + chunk, :], k, kernel_kwargs))
                      for i in range(0, q.shape[-2], chunk)], dim=-1)


def norm_sweep(attn_type: str, q: torch.Tensor, k: torch.Tensor, norms: torch.Tensor, chunk: int = 1024,
               kernel_kwargs: Optional[dict] = None) -> torch.Tensor:
    """Entropy with each query's direction kept and its norm set to each of ``norms`` (S,), isolating |q|:
    q (..., M, d), k (..., N, d) -> (S, ..., M)."""
    direction = q / torch.linalg.vector_norm(q, dim=-1, keepdim=True)
    return torch.stack([attention_entropy(attn_type, direction * n, k, chunk, kernel_kwargs) for n in norms.tolist()])


def _finite_pairs(x: torch.Tensor, y: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    """Two samples flattened to float64, without the pairs where either value is not finite."""
    x, y = x.flatten().double(), y.flatten().double()
    keep = x.isfinite() & y.isfinite()
    return x[keep], y[keep]


def pearson(x: torch.Tensor, y: torch.Tensor) -> float:
    """Pearson correlation of two samples, ignoring pairs with a non-finite value."""
    return float(torch.corrcoef(torch.stack(_finite_pairs(x, y)))[0, 1])


def spearman(x: torch.Tensor, y: torch.Tensor) -> float:
    """Spearman rank correlation (Pearson of ranks; ties broken by order, fine for real values)."""
    return pearson(*(v.argsort().argsort() for v in _finite_pairs(x, y)))


@contextmanager
def _inputs_of(module: nn.Module) -> Iterator[Dict[str, tuple]]:
    """Within the block, ``seen['args']`` is the positional input of ``module``'s latest call."""
    seen = {}
    hook = module.register_forward_pre_hook(lambda _, args: seen.update(args=args))
    try:
        yield seen
    finally:
        hook.remove()


def capture_kernel_qk(model: nn.Module, kernel: nn.Module, *inputs) -> Tuple[torch.Tensor, torch.Tensor]:
    """q, k (B, heads, N, d) entering the attention kernel module ``kernel`` (inside any ``model``) when
    ``model(*inputs)`` runs in eval mode without gradients."""
    with _inputs_of(kernel) as seen, torch.no_grad():
        model.eval()(*inputs)
    if not seen:
        raise ValueError(f'the attention kernel {type(kernel).__name__} did not run in {type(model).__name__}')
    return seen['args'][:2]


def capture_qk(model: nn.Module, images: torch.Tensor, stage: int,
               block: int) -> Tuple[torch.Tensor, torch.Tensor, Tuple[int, int]]:
    """q, k (B, heads, N, d) entering the attention kernel of ``model.layers[stage].blocks[block]`` of a
    NaLaFormer-layout model, and that block's token grid (H, W), N = H * W."""
    try:
        attn = model.layers[stage].blocks[block].attn
    except (AttributeError, IndexError, TypeError):
        raise ConfigError(f'{type(model).__name__} has no attention at layers[{stage}].blocks[{block}] '
                          f'(needs a NaLaFormer-layout model)') from None
    with _inputs_of(attn) as seen:
        q, k = capture_kernel_qk(model, attn.kernel, images)
    return q, k, tuple(seen['args'][0].shape[-2:])
