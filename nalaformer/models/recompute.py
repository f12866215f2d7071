"""Selective activation recomputation: keep the outputs of matrix products, recompute the rest.

``recompute(block, *args, selective=True)`` runs ``block`` under ``torch.utils.checkpoint``'s selective
policy: in backward the matrix products (the linear layers, batched matmuls and the attention ops)
are not re-run, their outputs are kept; the cheap ops between them (LayerNorm, GELU/SiLU, depthwise
convolutions, additions, RoPE tables) are recomputed, so their inputs and outputs are not stored.
In a NaLaFormer block this drops the ConvFFN's GELU output and its residual sum (2 of its 3 stored
(B, N, 4C) activations). ``selective=False`` recomputes the whole block (timm's usual checkpointing).

Recomputation runs on the NaLa backend (:mod:`nalaformer.ops.backend`) that its forward ran on,
wherever and whenever backward runs.
"""
import contextlib
import functools
from typing import Iterator, Tuple

import torch
from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts, noop_context_fn

from ..ops.backend import nala_backend, use_nala_backend

__all__ = ['recompute']

_aten = torch.ops.aten
_KEPT = {_aten.mm.default, _aten.addmm.default, _aten.bmm.default, _aten.baddbmm.default,
         _aten._scaled_dot_product_flash_attention_for_cpu.default,
         _aten._scaled_dot_product_flash_attention.default, _aten._scaled_dot_product_efficient_attention.default,
         _aten._scaled_dot_product_cudnn_attention.default}
_KEPT_NAMESPACES = ('nalaformer',)  # the fused / fast attention ops: outputs kept, never re-run


def _policy(ctx, op, *args, **kwargs) -> CheckpointPolicy:
    if op in _KEPT or op.namespace in _KEPT_NAMESPACES:
        return CheckpointPolicy.MUST_SAVE
    return CheckpointPolicy.PREFER_RECOMPUTE


def _selective_contexts():
    return create_selective_checkpoint_contexts(_policy)


@contextlib.contextmanager
def _on_backend(context, backend: str) -> Iterator[None]:
    with context, use_nala_backend(backend):
        yield


def _eager_contexts(selective: bool) -> Tuple[contextlib.AbstractContextManager, contextlib.AbstractContextManager]:
    """(forward, recomputation) contexts, made when the forward runs: the recomputation gets its backend (in
    backward, which may run after the forward's ``use_nala_backend`` block, or in another thread)."""
    forward_context, recompute_context = _selective_contexts() if selective else noop_context_fn()
    return forward_context, _on_backend(recompute_context, nala_backend())


def recompute(function, *args, selective: bool = False):
    """``function(*args)`` with its activations recomputed in backward (all, or all but matrix products)."""
    if torch.compiler.is_compiling():
        # The compiled graph recomputes what it traced, on the forward's backend; torch.compile takes no
        # context_fn but the selective policy's.
        kwargs = dict(context_fn=_selective_contexts) if selective else {}
    else:
        kwargs = dict(context_fn=functools.partial(_eager_contexts, selective))
    return torch.utils.checkpoint.checkpoint(function, *args, use_reentrant=False, **kwargs)
