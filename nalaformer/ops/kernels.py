"""Every attention kernel by name: the registry that ``attn_types`` choose from.

A kernel is an ``nn.Module`` without parameters (so it never changes a state dict), registered under its
``attn_type`` (``'nala'``, ``'nala_cos'``, ``'softmax'``, ...), built on the reference math of
:mod:`nalaformer.ops.nala`; :func:`build_attention_kernel` makes one from the name a config uses.

* ``nala`` / ``nala_cos``: the method; they run on the backend :mod:`nalaformer.ops.backend` picks (all
  compute the same), ``nala_triton`` / ``nala_cos_triton`` (where triton is installed) on the fused one.
* ``const_power``, ``relu``, ``elu``, ``focused``, ``polarity``: the ablations' linear attentions.
* ``softmax``: the release's softmax blocks; ``softmax_explicit`` the same function storing the N x N matrix.

Every kernel maps q, k, v (B, heads, N, d) and rope (2, N, d) to (B, heads, N, d) in float32.
"""
import inspect
import math
from typing import Dict, Mapping, Optional, Tuple, Type

import torch
import torch.nn as nn
import torch.nn.functional as F
from timm.layers import register_notrace_module

from .backend import FUSED_AVAILABLE, run_nala
from .nala import (
    LAMBDA, apply_rope, linear_attention, nala_cos_feature_maps, nala_feature_maps, norm_and_direction, sign_split,
    signed_power, softmax_attention,
)

__all__ = [
    'ATTENTION_KERNELS', 'AttentionKernel', 'LinearAttentionKernel', 'register_attention_kernel',
    'build_attention_kernel', 'kernel_function', 'positive_float',
    'NaLaKernel', 'NaLaCosKernel', 'NaLaTritonKernel', 'NaLaCosTritonKernel', 'ConstPowerKernel', 'ReLUKernel',
    'ELUKernel', 'FocusedKernel', 'PolarityKernel', 'SoftmaxKernel', 'ExplicitSoftmaxKernel',
]


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


class LinearAttentionKernel(AttentionKernel):
    """A kernel whose attention is :func:`~nalaformer.ops.nala.linear_attention` with its ``feature_maps``."""

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, rope: torch.Tensor) -> torch.Tensor:
        return linear_attention(*self.feature_maps(q, k), v, rope)


ATTENTION_KERNELS: Dict[str, Type[AttentionKernel]] = {}


def register_attention_kernel(attn_type: str):
    """Class decorator: make a kernel available as ``attn_type`` in configs and ``attn_types``."""
    def register(cls):
        if attn_type in ATTENTION_KERNELS:
            raise ValueError(f'attention kernel {attn_type!r} is already registered')
        ATTENTION_KERNELS[attn_type] = register_notrace_module(cls)
        cls.attn_type = attn_type
        if 'function_name' not in cls.__dict__:
            cls.function_name = attn_type
        return cls
    return register


def _kernel_signature(attn_type: str) -> inspect.Signature:
    kernel_cls = ATTENTION_KERNELS[attn_type]
    # nn.Module's own __init__ takes (*args, **kwargs): a kernel without one takes nothing.
    return inspect.Signature() if kernel_cls.__init__ is nn.Module.__init__ else inspect.signature(kernel_cls)


def build_attention_kernel(attn_type: str, **kwargs) -> AttentionKernel:
    """Instantiate a registered kernel; unknown names and arguments it does not take are named."""
    if attn_type not in ATTENTION_KERNELS:
        raise ValueError(
            f'unknown attention kernel {attn_type!r}; choose one of {sorted(ATTENTION_KERNELS)} '
            f'(e.g. attn_types=("nala", "nala", "softmax", "softmax"))')
    signature = _kernel_signature(attn_type)
    try:
        signature.bind(**kwargs)
    except TypeError as err:
        raise TypeError(
            f'attention kernel {attn_type!r} takes {list(signature.parameters) or "no arguments"}, got '
            f'{sorted(kwargs)} ({err}); in a model, give kernel_kwargs per stage, e.g. kernel_kwargs=(dict(alpha=5.), '
            f'dict(alpha=5.), None, None) with attn_types=("nala_cos", "nala_cos", "softmax", "softmax")') from None
    return ATTENTION_KERNELS[attn_type](**kwargs)


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


def positive_float(attn_type: str, name: str, value) -> float:
    """``value`` as a finite float > 0, or a ValueError naming the kernel argument (a NaN or negative
    power or sharpness would train without an error and compute nonsense)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise ValueError(f'attention kernel {attn_type!r}: {name} must be a finite number > 0, got {value!r} '
                         f'(kernel_kwargs=dict({name}=...))')
    return float(value)


# ----------------------------------------------------------------------------------------------
# Ablations: linear attentions with other feature maps
# ----------------------------------------------------------------------------------------------
@register_attention_kernel('const_power')
class ConstPowerKernel(LinearAttentionKernel):
    """NaLa's sign split with a constant power on the query direction and the key."""

    def __init__(self, power: float = LAMBDA):
        super().__init__()
        self.power = positive_float(self.attn_type, 'power', power)

    def feature_maps(self, q: torch.Tensor, k: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        _, q_dir = norm_and_direction(q)
        return sign_split(q_dir).pow(self.power), sign_split(signed_power(k, self.power))


@register_attention_kernel('relu')
class ReLUKernel(LinearAttentionKernel):
    """phi(x) = relu(x)^power (power 1: plain ReLU linear attention)."""

    def __init__(self, power: float = 1.0):
        super().__init__()
        self.power = positive_float(self.attn_type, 'power', power)

    def feature_maps(self, q: torch.Tensor, k: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        return F.relu(q).pow(self.power), F.relu(k).pow(self.power)


@register_attention_kernel('elu')
class ELUKernel(LinearAttentionKernel):
    """phi(x) = 1 + elu(x)."""

    def feature_maps(self, q: torch.Tensor, k: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        return 1 + F.elu(q), 1 + F.elu(k)


@register_attention_kernel('focused')
class FocusedKernel(LinearAttentionKernel):
    """FLatten-style focusing: phi(x) = |relu(x)| * relu(x)^p / |relu(x)^p|."""

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


@register_attention_kernel('polarity')
class PolarityKernel(AttentionKernel):
    """PolaFormer-style polarity: same-sign and opposite-sign interactions.

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


# ----------------------------------------------------------------------------------------------
# Softmax
# ----------------------------------------------------------------------------------------------
@register_attention_kernel('softmax')
class SoftmaxKernel(AttentionKernel):
    """The release's softmax blocks (:func:`~nalaformer.ops.nala.softmax_attention`, O(N^2))."""

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, rope: torch.Tensor) -> torch.Tensor:
        return softmax_attention(q, k, v, rope)


@register_attention_kernel('softmax_explicit')
class ExplicitSoftmaxKernel(AttentionKernel):
    """``softmax`` computed as written, softmax(q k^T / sqrt(d)) v, storing the (B, heads, N, N) matrix (twice
    at its peak: scores and probabilities), as a plain softmax transformer does. The same function as
    ``softmax`` (checkpoints treat them alike); the memory reference of the token-heavy benchmarks."""
    function_name = 'softmax'

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, rope: torch.Tensor) -> torch.Tensor:
        scores = (apply_rope(q, rope) * q.shape[-1] ** -0.5) @ apply_rope(k, rope).transpose(-2, -1)
        return scores.softmax(dim=-1) @ v


# ----------------------------------------------------------------------------------------------
# The method: NaLa, on the backend that ops/backend.py picks (registered last: the registry's order is
# the order that tools and results list kernels in)
# ----------------------------------------------------------------------------------------------
@register_attention_kernel('nala')
class NaLaKernel(LinearAttentionKernel):
    """Norm-aware linear attention exactly as released (:func:`~nalaformer.ops.nala.nala_feature_maps` and
    :func:`~nalaformer.ops.nala.linear_attention`).

    Runs on the backend that :func:`~nalaformer.ops.backend.nala_backend` names, or on the one this kernel
    asks for (``backend``; the ``nala_triton`` kernels: ``'fused'``); all compute the same. TorchScript runs
    the reference (it cannot call the operators).
    """
    alpha: Optional[float] = None  # the cosine-inhibit form's sharpness; None: the release's sign split
    backend: Optional[str] = None

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, rope: torch.Tensor) -> torch.Tensor:
        if not torch.jit.is_scripting():
            return run_nala(q, k, v, rope, self.alpha, self.backend)
        with torch.autocast('cuda', enabled=False), torch.autocast('cpu', enabled=False):  # as every kernel
            return self.attend(q.float(), k.float(), v.float(), rope.float())

    def feature_maps(self, q: torch.Tensor, k: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        return nala_feature_maps(q, k)


@register_attention_kernel('nala_cos')
class NaLaCosKernel(NaLaKernel):
    """The paper's continuous cosine-inhibit form; ``alpha`` sets its sharpness."""

    def __init__(self, alpha: float = 20.0):
        super().__init__()
        self.alpha = positive_float(self.attn_type, 'alpha', alpha)

    def feature_maps(self, q: torch.Tensor, k: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        return nala_cos_feature_maps(q, k, self.alpha)


class NaLaTritonKernel(NaLaKernel):
    """The ``nala`` kernel on the fused backend whatever the scope says (the PyTorch operator where it cannot run)."""
    function_name = 'nala'
    backend = 'fused'


class NaLaCosTritonKernel(NaLaCosKernel):
    """The ``nala_cos`` kernel on the fused backend whatever the scope says."""
    function_name = 'nala_cos'
    backend = 'fused'


if FUSED_AVAILABLE:
    register_attention_kernel('nala_triton')(NaLaTritonKernel)
    register_attention_kernel('nala_cos_triton')(NaLaCosTritonKernel)
