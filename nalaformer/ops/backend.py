"""Which implementation runs the ``nala`` / ``nala_cos`` attention kernels: the one place that dispatches.

===============  ==============================================================================
``'torch'``      (default) the PyTorch operator of :mod:`nalaformer.ops.nala_fast`, on every device
``'fused'``      the fused Triton kernel (:mod:`nalaformer.kernels.nala_triton`) for the inputs it
                 supports (CUDA tensors in float16 / bfloat16 / float32, head dim <= 128, or any
                 tensors under ``TRITON_INTERPRET=1``), the PyTorch operator elsewhere: CPU,
                 float64, ``torch.export`` / ONNX export, or without triton
``'reference'``  nala.py's plain-PyTorch functions with autograd, the readable reference
===============  ==============================================================================

All three compute the same function. The choice is scoped, never process-wide state: the
environment sets the default (``NALAFORMER_NALA_BACKEND=fused``, read when nalaformer is
imported) and a block of code runs on another backend with::

    with nalaformer.ops.use_nala_backend('fused'):
        loss = model(images).logsumexp(-1).mean()

The block's choice is a context variable: it holds in this thread (or asyncio task) only; other
threads, and threads started inside the block, run on the default. Recomputation in backward
(:mod:`nalaformer.models.recompute`) runs on the backend its forward ran on. TorchScript always runs
the reference (``torch.jit.script`` cannot call the operators).

Where a ``'fused'`` request falls back to the PyTorch operator, a warning says why, once per reason
(under ``torch.compile`` when the model is traced).

The kernels named ``nala_triton`` / ``nala_cos_triton`` in ``attn_types`` always ask for
``'fused'``; they are registered where triton is installed. Only a missing triton leaves them out:
any other error importing the fused kernels is raised. The fused kernel is not the CUDA default
yet: it becomes the default once ``scripts/gpu_acceptance.sh`` has shown it correct in compiled mode
and faster than the PyTorch operator in a model's training step on a GPU, which has not happened
(see kernels/README.md).
"""
import contextlib
import contextvars
import os
import warnings
from typing import Iterator, Optional, Set, Tuple

import torch

from . import nala_fast
from .nala import (
    AttentionKernel, linear_attention, nala_cos_feature_maps, nala_feature_maps, positive_float,
    register_attention_kernel,
)

try:
    from nalaformer.kernels import nala_triton
except ImportError as err:
    if not (isinstance(err, ModuleNotFoundError) and err.name == 'triton'):
        raise ImportError(f'the fused NaLa kernels (nalaformer.kernels.nala_triton) failed to import: {err}. Only a '
                          f'missing triton leaves them out: repair the installation, or uninstall triton to run '
                          f'without them') from err
    nala_triton = None  # triton is not installed

__all__ = ['BACKENDS', 'BACKEND_ENV', 'DEFAULT_BACKEND', 'NaLaKernel', 'NaLaCosKernel', 'NaLaTritonKernel',
           'NaLaCosTritonKernel', 'nala_backend', 'running_backend', 'use_nala_backend']

BACKENDS = ('torch', 'fused', 'reference')
BACKEND_ENV = 'NALAFORMER_NALA_BACKEND'
DEFAULT_BACKEND = 'torch'


def _checked(name: str, source: str) -> str:
    if name not in BACKENDS:
        raise ValueError(f'{source} is {name!r}; the NaLa backend must be one of {BACKENDS} '
                         f'(default {DEFAULT_BACKEND!r})')
    return name


_backend = contextvars.ContextVar(
    'nala_backend', default=_checked(os.environ.get(BACKEND_ENV, '').strip().lower() or DEFAULT_BACKEND, BACKEND_ENV))
_fallbacks_said: Set[str] = set()


def nala_backend() -> str:
    """The backend that ``nala`` / ``nala_cos`` kernels use here and now (see the module docstring)."""
    return _backend.get()


@contextlib.contextmanager
def use_nala_backend(name: str) -> Iterator[None]:
    """Within the block (in this thread or task), ``nala`` / ``nala_cos`` kernels run on backend ``name``."""
    token = _backend.set(_checked(name, 'use_nala_backend(name)'))
    try:
        yield
    finally:
        _backend.reset(token)


@torch.compiler.assume_constant_result  # under torch.compile: said while tracing, nothing in the graph
def _say_fallback(reason: str) -> bool:
    if reason not in _fallbacks_said:
        _fallbacks_said.add(reason)
        warnings.warn(f"the 'fused' NaLa backend runs the PyTorch operator instead: {reason}")
    return True


def running_backend(requested: str, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                    rope: torch.Tensor) -> str:
    """The backend that computes attention on these inputs: ``requested``, except that a ``'fused'``
    request runs on ``'torch'`` where the fused kernel cannot (a warning says why, once per reason)."""
    if requested != 'fused':
        return requested
    reason = 'triton is not installed' if nala_triton is None else nala_triton.unsupported_reason(q, k, v, rope)
    if reason is None:
        return 'fused'
    _say_fallback(reason)
    return 'torch'


@register_attention_kernel('nala')
class NaLaKernel(AttentionKernel):
    """Norm-aware linear attention exactly as released (:func:`~nalaformer.ops.nala.nala_feature_maps` and
    :func:`~nalaformer.ops.nala.linear_attention`).

    Runs on the backend that :func:`nala_backend` names, or on the one this kernel asks for
    (``backend``; the ``nala_triton`` kernels: ``'fused'``); all compute the same.
    """
    alpha: Optional[float] = None  # the cosine-inhibit form's sharpness; None: the release's sign split
    backend: Optional[str] = None

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, rope: torch.Tensor) -> torch.Tensor:
        if not torch.jit.is_scripting():
            backend = running_backend(self.backend or nala_backend(), q, k, v, rope)
            if backend == 'fused':  # float16 / bfloat16 inputs reach the fused kernel as they are (it upcasts on load)
                if self.alpha is None:
                    return nala_triton.nala_attention(q, k, v, rope)
                return nala_triton.nala_cos_attention(q, k, v, rope, self.alpha)
            if backend == 'torch':  # one op, maps recomputed in backward
                with torch.autocast('cuda', enabled=False), torch.autocast('cpu', enabled=False):
                    q, k, v, rope = q.float(), k.float(), v.float(), rope.float()
                    if self.alpha is None:
                        return nala_fast.nala_attention(q, k, v, rope)
                    return nala_fast.nala_cos_attention(q, k, v, rope, self.alpha)
        with torch.autocast('cuda', enabled=False), torch.autocast('cpu', enabled=False):  # as every kernel
            return self.attend(q.float(), k.float(), v.float(), rope.float())

    def feature_maps(self, q: torch.Tensor, k: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        return nala_feature_maps(q, k)

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, rope: torch.Tensor) -> torch.Tensor:
        phi_q, phi_k = self.feature_maps(q, k)
        return linear_attention(phi_q, phi_k, v, rope)


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


if nala_triton is not None:
    register_attention_kernel('nala_triton')(NaLaTritonKernel)
    register_attention_kernel('nala_cos_triton')(NaLaCosTritonKernel)
