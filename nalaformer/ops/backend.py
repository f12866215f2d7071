"""Which implementation runs the ``nala`` / ``nala_cos`` attention kernels: the one place that dispatches.

===============  ==============================================================================
``'auto'``       (default) the fused Triton kernel where it runs compiled (CUDA) and no gradient flows
                 into the attention (inference, a frozen backbone); the PyTorch operator otherwise
``'torch'``      the PyTorch operator of :mod:`nalaformer.ops.nala_fast`, on every device
``'fused'``      the fused Triton kernel (:mod:`nalaformer.kernels.nala_triton`) for the inputs it
                 supports (CUDA tensors in float16 / bfloat16 / float32, head dim <= 128, or any
                 tensors under ``TRITON_INTERPRET=1``), the PyTorch operator elsewhere: CPU,
                 float64, ``torch.export`` / ONNX export, or without triton
``'reference'``  :mod:`nalaformer.ops.nala`'s plain-PyTorch functions with autograd, the readable reference
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
(under ``torch.compile`` when the model is traced); ``'auto'`` falls back without a word.

The kernels (:mod:`nalaformer.ops.kernels`) run NaLa through :func:`run_nala`; those named
``nala_triton`` / ``nala_cos_triton`` in ``attn_types`` always ask for ``'fused'`` and are registered
where triton is installed (:data:`FUSED_AVAILABLE`). Only a missing triton leaves them out: any other
error importing the fused kernels is raised. Why ``'auto'`` splits as it does, measured on an H200
(``scripts/gpu_acceptance.sh``, kernels/README.md): NaLaFormer-T's inference on the fused forward is
1.20x (224, batch 32) to 1.47x (2048) the PyTorch operator's speed, but its training step, which runs
the fused backward too, 0.96x.
"""
import contextlib
import contextvars
import os
import warnings
from typing import Iterator, Optional, Set

import torch

from . import nala, nala_fast

try:
    from nalaformer.kernels import nala_triton
except ImportError as err:
    if not (isinstance(err, ModuleNotFoundError) and err.name == 'triton'):
        raise ImportError(f'the fused NaLa kernels (nalaformer.kernels.nala_triton) failed to import: {err}. Only a '
                          f'missing triton leaves them out: repair the installation, or uninstall triton to run '
                          f'without them') from err
    nala_triton = None  # triton is not installed

__all__ = ['BACKENDS', 'BACKEND_ENV', 'DEFAULT_BACKEND', 'FUSED_AVAILABLE', 'nala_backend', 'use_nala_backend',
           'running_backend', 'run_nala']

BACKENDS = ('auto', 'torch', 'fused', 'reference')
BACKEND_ENV = 'NALAFORMER_NALA_BACKEND'
DEFAULT_BACKEND = 'auto'
# The fused kernels can be asked for (the ``nala_triton`` kernels are registered) where triton is installed.
FUSED_AVAILABLE = nala_triton is not None


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
    request runs on ``'torch'`` where the fused kernel cannot (a warning says why, once per reason), and
    ``'auto'`` is ``'fused'`` where the compiled fused kernel takes these inputs and no gradient flows into
    them (grad disabled, or none of q, k, v requires grad), ``'torch'`` otherwise."""
    if requested == 'auto':
        return 'fused' if _fused_for_inference(q, k, v, rope) else 'torch'
    if requested != 'fused':
        return requested
    reason = 'triton is not installed' if nala_triton is None else nala_triton.unsupported_reason(q, k, v, rope)
    if reason is None:
        return 'fused'
    _say_fallback(reason)
    return 'torch'


def _fused_for_inference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, rope: torch.Tensor) -> bool:
    # The interpreter is exact but slow: 'auto' never chooses it.
    return (nala_triton is not None and not nala_triton.interpreting()
            and not (torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad))
            and nala_triton.unsupported_reason(q, k, v, rope) is None)


def run_nala(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, rope: torch.Tensor, alpha: Optional[float] = None,
             backend: Optional[str] = None) -> torch.Tensor:
    """NaLa attention on the implementation of ``backend`` (None: the scope's, :func:`nala_backend`), or the
    PyTorch operator where a ``'fused'`` request cannot run (:func:`running_backend`).

    ``alpha`` None: the release's form (``nala``); a number: the cosine-inhibit form of that sharpness
    (``nala_cos``). q, k, v (..., N, d), rope (2, N, d) -> (..., N, d) in float32 (the PyTorch implementations
    run in float32 with autocast off; the fused kernel takes float16 / bfloat16 as they are).
    """
    backend = running_backend(backend or nala_backend(), q, k, v, rope)
    if backend == 'fused':  # float16 / bfloat16 inputs reach the fused kernel as they are (it upcasts on load)
        return _attention(nala_triton, q, k, v, rope, alpha)
    with torch.autocast('cuda', enabled=False), torch.autocast('cpu', enabled=False):
        implementation = nala_fast if backend == 'torch' else nala
        return _attention(implementation, q.float(), k.float(), v.float(), rope.float(), alpha)


def _attention(implementation, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, rope: torch.Tensor,
               alpha: Optional[float]) -> torch.Tensor:
    """``implementation``'s (nala.py, nala_fast or nala_triton: the same functions) nala or nala_cos attention."""
    if alpha is None:
        return implementation.nala_attention(q, k, v, rope)
    return implementation.nala_cos_attention(q, k, v, rope, alpha)
