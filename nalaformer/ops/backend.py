"""Which implementation runs the ``nala`` / ``nala_cos`` attention kernels: one switch.

===============  ==============================================================================
``'torch'``      (default) the PyTorch operator of :mod:`nalaformer.ops.nala_fast`, on every device
``'fused'``      the fused Triton kernel (:mod:`nalaformer.kernels.nala_triton`) for the inputs it
                 supports (CUDA tensors in float16 / bfloat16 / float32, head dim <= 128, or any
                 tensors under ``TRITON_INTERPRET=1``), the PyTorch operator elsewhere: CPU,
                 float64, TorchScript, ``torch.export`` / ONNX export, or without triton
``'reference'``  nala.py's plain-PyTorch functions with autograd, the readable reference
===============  ==============================================================================

All three compute the same function. Set it with ``NALAFORMER_NALA_BACKEND=fused`` in the
environment (read when nalaformer is imported) or for a block of code::

    with nalaformer.ops.use_nala_backend('fused'):
        loss = model(images).logsumexp(-1).mean()

The kernels named ``nala_triton`` / ``nala_cos_triton`` in ``attn_types`` always ask for
``'fused'``. The fused kernel is not the CUDA default yet: it becomes the default once
``scripts/gpu_acceptance.sh`` has shown it correct in compiled mode and faster than the PyTorch
operator in a model's training step on a GPU, which has not happened (see kernels/README.md).
"""
import contextlib
import os
from types import ModuleType
from typing import Iterator, Optional

__all__ = ['BACKENDS', 'BACKEND_ENV', 'DEFAULT_BACKEND', 'fused_kernels', 'nala_backend', 'use_nala_backend']

BACKENDS = ('torch', 'fused', 'reference')
BACKEND_ENV = 'NALAFORMER_NALA_BACKEND'
DEFAULT_BACKEND = 'torch'


def _checked(name: str, source: str) -> str:
    if name not in BACKENDS:
        raise ValueError(f'{source} is {name!r}; the NaLa backend must be one of {BACKENDS} '
                         f'(default {DEFAULT_BACKEND!r})')
    return name


_backend = _checked(os.environ.get(BACKEND_ENV, '').strip().lower() or DEFAULT_BACKEND, BACKEND_ENV)


def nala_backend() -> str:
    """The backend that ``nala`` / ``nala_cos`` kernels use now (see the module docstring)."""
    return _backend


@contextlib.contextmanager
def use_nala_backend(name: str) -> Iterator[None]:
    """Within the block, ``nala`` / ``nala_cos`` kernels run on backend ``name``."""
    global _backend
    previous, _backend = _backend, _checked(name, 'use_nala_backend(name)')
    try:
        yield
    finally:
        _backend = previous


def fused_kernels() -> Optional[ModuleType]:
    """:mod:`nalaformer.kernels.nala_triton`, or None where triton is not installed."""
    try:
        from nalaformer.kernels import nala_triton
    except ImportError:
        return None
    return nala_triton
