"""Deterministic, architecture-independent weights for comparing against the authors' release.

The same function fills our model and the release's model (whose state-dict layout is ours),
so reference logits can be committed without committing the weights. Values are drawn per
key from a generator seeded by the key's name and scaled so activations stay O(1).
"""
import zlib

import torch


def deterministic_value(key: str, like: torch.Tensor, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed * 1_000_003 + zlib.crc32(key.encode()))
    shape, leaf = like.shape, key.rsplit('.', 1)[-1]
    if like.dtype == torch.int64 or leaf == 'angle':
        return like.clone()  # BatchNorm counters and RoPE frequencies stay as built
    randn = torch.randn(shape, generator=g)
    if leaf == 'running_var':
        return 0.5 + torch.rand(shape, generator=g)
    if leaf == 'running_mean' or leaf == 'bias':
        return 0.1 * randn
    if leaf in ('gamma_1', 'gamma_2'):
        return 0.1 + 0.02 * randn
    if like.ndim <= 1:  # LayerNorm / BatchNorm weights
        return 1.0 + 0.1 * randn
    fan_in = like[0].numel()
    # depthwise convs sit on residual paths (x + cpe(x)): keep them small so depth does not blow up
    gain = 0.2 if like.ndim == 4 and like.shape[1] == 1 else 1.0
    return randn * gain * fan_in ** -0.5


def fill_deterministic(module: torch.nn.Module, seed: int = 0) -> torch.nn.Module:
    """Overwrite every parameter and buffer of ``module`` in place; returns it."""
    state = module.state_dict()
    module.load_state_dict({k: deterministic_value(k, v, seed) for k, v in state.items()})
    return module


def deterministic_input(shape, seed: int = 0) -> torch.Tensor:
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed))
