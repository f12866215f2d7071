"""Selective activation recomputation: keep the outputs of matrix products, recompute the rest.

``checkpoint(block, *args, selective=True)`` runs ``block`` under ``torch.utils.checkpoint``'s selective
policy: in backward the matrix products (the linear layers, batched matmuls and the attention ops)
are not re-run, their outputs are kept; the cheap ops between them (LayerNorm, GELU/SiLU, depthwise
convolutions, additions, RoPE tables) are recomputed, so their inputs and outputs are not stored.
In a NaLaFormer block this drops the ConvFFN's GELU output and its residual sum (2 of its 3 stored
(B, N, 4C) activations). ``selective=False`` recomputes the whole block (timm's usual checkpointing).
"""
import torch
from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

__all__ = ['checkpoint']

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


def checkpoint(function, *args, selective: bool = False):
    """``function(*args)`` with its activations recomputed in backward (all, or all but matrix products)."""
    kwargs = dict(context_fn=_selective_contexts) if selective else {}
    return torch.utils.checkpoint.checkpoint(function, *args, use_reentrant=False, **kwargs)
