"""The NaLa method in one place, reading like the paper: 2D RoPE, feature maps, the linear contraction,
softmax attention.

Shapes used throughout (per attention call):
    q, k, v        (B, heads, N, d)    N = H * W tokens, d = head dim
    rope           (2, N, d)           stacked (sin, cos) tables, see :func:`rope_table`
    phi_q, phi_k   (B, heads, N, F)    feature maps, F a multiple of d (d or 2d)
    output         (B, heads, N, d)

Everything here is pure PyTorch with autograd: the reference that the fast operator
(:mod:`nalaformer.ops.nala_fast`) and the fused Triton kernels (``nalaformer.kernels``) are tested
against. The attention kernels that configs name (``attn_types``) are built on these functions in
:mod:`nalaformer.ops.kernels`.
"""
import math
from typing import Optional, Tuple

import torch
import torch.nn.functional as F

__all__ = [
    'rope_angles', 'rope_table', 'apply_rope', 'norm_and_direction', 'sign_split', 'query_power', 'signed_power',
    'nala_feature_maps', 'cosine_inhibit', 'nala_cos_feature_maps', 'linear_attention', 'nala_attention',
    'nala_cos_attention', 'softmax_attention',
]

# Paper constants: query power p(|q|) = LAMBDA * (TAU + tanh(|q|)) in [1.5, 4.5); keys get power LAMBDA.
LAMBDA = 3.0
TAU = 0.5
# Added to the normaliser phi_q . mean(phi_k), as in the release.
NORMALISER_EPS = 1e-6
# Smallest query norm used to form a direction; only zero or denormal queries hit it.
DIRECTION_EPS = 1e-12


# ----------------------------------------------------------------------------------------------
# 2D rotary position embedding (as released)
# ----------------------------------------------------------------------------------------------
def rope_angles(head_dim: int, device: Optional[torch.device] = None) -> torch.Tensor:
    """Rotation frequencies, shape (head_dim // 2,): head_dim // 4 frequencies, each twice."""
    if head_dim % 4:
        raise ValueError(f'2D RoPE needs a head dim divisible by 4 (rows and columns, pairs), got {head_dim}')
    freqs = 1.0 / (10000 ** torch.linspace(0, 1, head_dim // 4, device=device))
    return freqs.repeat_interleave(2)


def rope_table(angles: torch.Tensor, height: int, width: int) -> torch.Tensor:
    """Stacked (sin, cos) of shape (2, H*W, 2*len(angles)), row-major tokens.

    The first half of each head's channels rotates with the row index, the second half
    with the column index.
    """
    rows = torch.arange(height, device=angles.device, dtype=angles.dtype)[:, None] * angles
    cols = torch.arange(width, device=angles.device, dtype=angles.dtype)[:, None] * angles
    theta = torch.cat([
        rows[:, None, :].expand(height, width, angles.shape[0]),
        cols[None, :, :].expand(height, width, angles.shape[0]),
    ], dim=-1).flatten(0, 1)
    return torch.stack([theta.sin(), theta.cos()])


def apply_rope(x: torch.Tensor, rope: torch.Tensor) -> torch.Tensor:
    """Rotate interleaved pairs (x0, x1) -> (x0 cos - x1 sin, x1 cos + x0 sin).

    x: (..., N, F) with F a multiple of the table's d; each d-sized part is rotated alike.
    """
    sin, cos = rope[0], rope[1]
    d = sin.shape[-1]
    parts = x.unflatten(-1, (x.shape[-1] // d, d))  # (..., N, F/d, d)
    pairs = parts.unflatten(-1, (d // 2, 2))
    rotated_half = torch.stack([-pairs[..., 1], pairs[..., 0]], dim=-1).flatten(-2)
    out = parts * cos.unsqueeze(-2) + rotated_half * sin.unsqueeze(-2)
    return out.flatten(-2)


# ----------------------------------------------------------------------------------------------
# Feature maps (the release's and the paper's)
# ----------------------------------------------------------------------------------------------
def norm_and_direction(x: torch.Tensor, eps: float = DIRECTION_EPS) -> Tuple[torch.Tensor, torch.Tensor]:
    """Norm x direction decomposition over the last dim: |x| of shape (..., 1) and x / |x|."""
    norm = torch.linalg.vector_norm(x, dim=-1, keepdim=True)
    return norm, x / norm.clamp_min(eps)


def sign_split(x: torch.Tensor) -> torch.Tensor:
    """[relu(x), relu(-x)]: (..., d) -> (..., 2d); their products keep only same-sign terms."""
    return torch.cat([F.relu(x), F.relu(-x)], dim=-1)


def query_power(q_norm: torch.Tensor, lam: float = LAMBDA, tau: float = TAU) -> torch.Tensor:
    """Norm-aware power p(|q|) = lambda * (tau + tanh(|q|))."""
    return lam * (tau + torch.tanh(q_norm))


def signed_power(x: torch.Tensor, power: float) -> torch.Tensor:
    """sign(x) |x|^power (x ** 3 for the release's power 3)."""
    if power == 3.0:
        return x * x * x
    return x.sign() * x.abs().pow(power)


def nala_feature_maps(q: torch.Tensor, k: torch.Tensor, lam: float = LAMBDA) -> Tuple[torch.Tensor, torch.Tensor]:
    """Released NaLa: phi_q = [d(q)+, d(q)-]^p(|q|), phi_k = [k^3 +, k^3 -].

    phi_q . phi_k = sum_i |d(q)_i|^p |k_i|^3 [sign q_i == sign k_i].
    """
    q_norm, q_dir = norm_and_direction(q)
    phi_q = sign_split(q_dir).pow(query_power(q_norm))
    phi_k = sign_split(signed_power(k, lam))
    return phi_q, phi_k


def cosine_inhibit(direction: torch.Tensor, alpha: float) -> torch.Tensor:
    """[cos a; sin a] with a = (pi/4) tanh(alpha d): products give cos(a_q - a_k) >= 0."""
    angle = (math.pi / 4) * torch.tanh(alpha * direction)
    return torch.cat([angle.cos(), angle.sin()], dim=-1)


def nala_cos_feature_maps(q: torch.Tensor, k: torch.Tensor, alpha: float,
                          lam: float = LAMBDA) -> Tuple[torch.Tensor, torch.Tensor]:
    """The paper's continuous form; equals :func:`nala_feature_maps` as alpha -> infinity."""
    q_norm, q_dir = norm_and_direction(q)
    _, k_dir = norm_and_direction(k)
    q_magnitude = q_dir.abs().pow(query_power(q_norm))
    k_magnitude = k.abs().pow(lam)
    phi_q = torch.cat([q_magnitude, q_magnitude], dim=-1) * cosine_inhibit(q_dir, alpha)
    phi_k = torch.cat([k_magnitude, k_magnitude], dim=-1) * cosine_inhibit(k_dir, alpha)
    return phi_q, phi_k


# ----------------------------------------------------------------------------------------------
# Attention
# ----------------------------------------------------------------------------------------------
def linear_attention(phi_q: torch.Tensor, phi_k: torch.Tensor, v: torch.Tensor, rope: torch.Tensor,
                     eps: float = NORMALISER_EPS) -> torch.Tensor:
    """out_i = phi_q_rot_i . (sum_j phi_k_rot_j v_j / N) / (phi_q_i . mean_j phi_k_j + eps).

    RoPE acts on the numerator only. Cost O(N F d); the state is F x d, never N x N.
    """
    n = v.shape[-2]
    normaliser = phi_q @ phi_k.mean(dim=-2, keepdim=True).transpose(-2, -1) + eps
    state = (apply_rope(phi_k, rope).transpose(-2, -1) * n ** -0.5) @ (v * n ** -0.5)
    return apply_rope(phi_q, rope) @ state / normaliser


def nala_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, rope: torch.Tensor) -> torch.Tensor:
    """Released NaLa attention: :func:`linear_attention` with :func:`nala_feature_maps`."""
    return linear_attention(*nala_feature_maps(q, k), v, rope)


def nala_cos_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, rope: torch.Tensor,
                       alpha: float = 20.0) -> torch.Tensor:
    """The paper's cosine-inhibit NaLa attention: :func:`linear_attention` with :func:`nala_cos_feature_maps`."""
    return linear_attention(*nala_cos_feature_maps(q, k, alpha), v, rope)


def softmax_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, rope: torch.Tensor) -> torch.Tensor:
    """softmax(R q (R k)^T / sqrt(d)) v, RoPE on q and k (the release's softmax blocks); O(N^2) time, PyTorch's
    fused scaled-dot-product attention (no N x N matrix stored where it has a memory-efficient kernel)."""
    return F.scaled_dot_product_attention(apply_rope(q, rope), apply_rope(k, rope), v)
