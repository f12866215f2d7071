"""The NaLa method in one place: feature maps, 2D RoPE, linear contraction, softmax.

Shapes used throughout (per attention call):
    q, k, v        (B, heads, N, d)    N = H * W tokens, d = head dim
    rope           (2, N, d)           stacked (sin, cos) tables, see :func:`rope_table`
    phi_q, phi_k   (B, heads, N, F)    feature maps, F a multiple of d (d or 2d)
    output         (B, heads, N, d)

Everything here is pure PyTorch and is the reference for the fused kernels. All
attention math runs in float32 with autocast disabled, whatever the caller's dtype.

Kernels are ``nn.Module`` subclasses without parameters (so they never change a
state dict) registered by name, their ``attn_type``; :func:`build_attention_kernel` makes one
from the name used in configs (``'nala'``, ``'softmax'``, ...). The ``nala`` / ``nala_cos``
kernels, which run on one of several implementations of :func:`nala_feature_maps` +
:func:`linear_attention`, are registered by :mod:`nalaformer.ops.backend`.
"""
import inspect
import math
from typing import Dict, Mapping, Optional, Tuple, Type

import torch
import torch.nn as nn
import torch.nn.functional as F

from timm.layers import register_notrace_module

__all__ = [
    'ATTENTION_KERNELS', 'AttentionKernel', 'build_attention_kernel', 'register_attention_kernel',
    'kernel_function', 'rope_angles', 'rope_table', 'apply_rope', 'linear_attention', 'norm_and_direction',
    'nala_feature_maps', 'nala_cos_feature_maps',
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
# Contractions
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


class AttentionKernel(nn.Module):
    """Base of all kernels: ``forward(q, k, v, rope)`` -> (B, heads, N, d), in float32.

    Subclasses implement ``attend`` on float32 tensors; autocast is switched off around it.

    ``attn_type``: the name the kernel is registered under. ``function_name``: the ``attn_type`` whose
    function this one computes (its own, unless it is another implementation of it, e.g. a fused one);
    it feeds :func:`kernel_function`.

    ``feature_maps(q, k) -> (phi_q, phi_k)``, (B, heads, N, d) -> (B, heads, N, F): the kernel's
    feature maps, when its attention is ``linear_attention(phi_q, phi_k, v, rope)``; None for kernels
    that are not one linear attention (``softmax``, the two streams of ``polarity``).
    """
    attn_type: str
    function_name: str
    feature_maps = None

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, rope: torch.Tensor) -> torch.Tensor:
        with torch.autocast('cuda', enabled=False), torch.autocast('cpu', enabled=False):
            return self.attend(q.float(), k.float(), v.float(), rope.float())

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, rope: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError


ATTENTION_KERNELS: Dict[str, Type[AttentionKernel]] = {}


def register_attention_kernel(name: str):
    """Class decorator: make a kernel available by ``name`` in configs and ``attn_types``."""
    def register(cls):
        if name in ATTENTION_KERNELS:
            raise ValueError(f'attention kernel {name!r} is already registered')
        ATTENTION_KERNELS[name] = register_notrace_module(cls)
        cls.attn_type = name
        if 'function_name' not in cls.__dict__:
            cls.function_name = name
        return cls
    return register


def _kernel_signature(name: str) -> inspect.Signature:
    kernel = ATTENTION_KERNELS[name]
    # nn.Module's own __init__ takes (*args, **kwargs): a kernel without one takes nothing.
    return inspect.Signature() if kernel.__init__ is nn.Module.__init__ else inspect.signature(kernel)


def build_attention_kernel(name: str, **kwargs) -> AttentionKernel:
    """Instantiate a registered kernel; unknown names and arguments it does not take are named."""
    if name not in ATTENTION_KERNELS:
        raise ValueError(
            f'unknown attention kernel {name!r}; choose one of {sorted(ATTENTION_KERNELS)} '
            f'(e.g. attn_types=("nala", "nala", "softmax", "softmax"))')
    signature = _kernel_signature(name)
    try:
        signature.bind(**kwargs)
    except TypeError as err:
        raise TypeError(
            f'attention kernel {name!r} takes {list(signature.parameters) or "no arguments"}, got {sorted(kwargs)} '
            f'({err}); in a model, give kernel_kwargs per stage, e.g. kernel_kwargs=(dict(alpha=5.), '
            f'dict(alpha=5.), None, None) with attn_types=("nala_cos", "nala_cos", "softmax", "softmax")') from None
    return ATTENTION_KERNELS[name](**kwargs)


def kernel_function(attn_type: str, kwargs: Optional[Mapping] = None) -> dict:
    """What a kernel computes, in a form that compares: ``{'attn_type': its function_name, **its arguments}``.

    Defaults are filled in (``nala_cos`` with no arguments equals ``nala_cos`` with ``alpha=20``), other
    implementations name the function they compute (``nala_triton`` -> ``nala``). A name that is not a
    registered kernel (e.g. NaLa-Swin's ``'shifted_window'``) stands for itself. Checkpoints use this to
    tell whether a model computes what its weights were trained for.
    """
    kwargs = dict(kwargs or {})
    if attn_type not in ATTENTION_KERNELS:
        return {'attn_type': attn_type, **kwargs}
    bound = _kernel_signature(attn_type).bind(**kwargs)
    bound.apply_defaults()
    return {'attn_type': ATTENTION_KERNELS[attn_type].function_name, **bound.arguments}


def positive_float(kernel: str, name: str, value) -> float:
    """``value`` as a finite float > 0, or a ValueError naming the kernel argument (a NaN or negative
    power or sharpness would train without an error and compute nonsense)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise ValueError(f'attention kernel {kernel!r}: {name} must be a finite number > 0, got {value!r} '
                         f'(kernel_kwargs=dict({name}=...))')
    return float(value)


@register_attention_kernel('const_power')
class ConstPowerKernel(AttentionKernel):
    """Ablation: NaLa's sign split with a constant power on the query direction and the key."""

    def __init__(self, power: float = LAMBDA):
        super().__init__()
        self.power = positive_float(self.attn_type, 'power', power)

    def feature_maps(self, q: torch.Tensor, k: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        _, q_dir = norm_and_direction(q)
        return sign_split(q_dir).pow(self.power), sign_split(signed_power(k, self.power))

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, rope: torch.Tensor) -> torch.Tensor:
        return linear_attention(*self.feature_maps(q, k), v, rope)


@register_attention_kernel('relu')
class ReLUKernel(AttentionKernel):
    """Ablation: phi(x) = relu(x)^power (power 1: plain ReLU linear attention)."""

    def __init__(self, power: float = 1.0):
        super().__init__()
        self.power = positive_float(self.attn_type, 'power', power)

    def feature_maps(self, q: torch.Tensor, k: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        return F.relu(q).pow(self.power), F.relu(k).pow(self.power)

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, rope: torch.Tensor) -> torch.Tensor:
        return linear_attention(*self.feature_maps(q, k), v, rope)


@register_attention_kernel('elu')
class ELUKernel(AttentionKernel):
    """Ablation: phi(x) = 1 + elu(x)."""

    def feature_maps(self, q: torch.Tensor, k: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        return 1 + F.elu(q), 1 + F.elu(k)

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, rope: torch.Tensor) -> torch.Tensor:
        return linear_attention(*self.feature_maps(q, k), v, rope)


@register_attention_kernel('focused')
class FocusedKernel(AttentionKernel):
    """Ablation, FLatten-style focusing: phi(x) = |relu(x)| * relu(x)^p / |relu(x)^p|."""

    def __init__(self, power: float = LAMBDA):
        super().__init__()
        self.power = positive_float(self.attn_type, 'power', power)

    def focus(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(x)
        powered = x.pow(self.power)
        scale = torch.linalg.vector_norm(x, dim=-1, keepdim=True)
        return powered * (scale / torch.linalg.vector_norm(powered, dim=-1, keepdim=True).clamp_min(1e-12))

    def feature_maps(self, q: torch.Tensor, k: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        return self.focus(q), self.focus(k)

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, rope: torch.Tensor) -> torch.Tensor:
        return linear_attention(*self.feature_maps(q, k), v, rope)


@register_attention_kernel('polarity')
class PolarityKernel(AttentionKernel):
    """Ablation, PolaFormer-style polarity: same-sign and opposite-sign interactions.

    Half of v's channels aggregate with phi_q . [k+, k-] (same sign), the other half with
    phi_q . [k-, k+] (opposite sign), each with its own normaliser; powers are constant.
    """

    def __init__(self, power: float = LAMBDA):
        super().__init__()
        self.power = positive_float(self.attn_type, 'power', power)

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, rope: torch.Tensor) -> torch.Tensor:
        d = q.shape[-1]
        phi_q = sign_split(q).pow(self.power)
        phi_k_same = sign_split(k).pow(self.power)
        phi_k_opposite = torch.cat([phi_k_same[..., d:], phi_k_same[..., :d]], dim=-1)
        v_same, v_opposite = v.chunk(2, dim=-1)
        return torch.cat([
            linear_attention(phi_q, phi_k_same, v_same, rope),
            linear_attention(phi_q, phi_k_opposite, v_opposite, rope),
        ], dim=-1)


@register_attention_kernel('softmax')
class SoftmaxKernel(AttentionKernel):
    """The release's softmax blocks: RoPE on q and k, scale d^-0.5 (O(N^2))."""

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, rope: torch.Tensor) -> torch.Tensor:
        return F.scaled_dot_product_attention(apply_rope(q, rope), apply_rope(k, rope), v)


@register_attention_kernel('softmax_explicit')
class ExplicitSoftmaxKernel(AttentionKernel):
    """``softmax`` computed as written, softmax(q k^T / sqrt(d)) v, storing the (B, heads, N, N) matrix (twice
    at its peak: scores and probabilities), as a plain softmax transformer does. The same function as
    ``softmax`` (checkpoints treat them alike); the memory reference of the token-heavy benchmarks."""
    function_name = 'softmax'

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, rope: torch.Tensor) -> torch.Tensor:
        scores = (apply_rope(q, rope) * q.shape[-1] ** -0.5) @ apply_rope(k, rope).transpose(-2, -1)
        return scores.softmax(dim=-1) @ v


