"""Tokens that stress the feature maps: zero, huge and tiny norms (shared by the op tests)."""
import torch


def make_extreme_(q: torch.Tensor, k: torch.Tensor) -> None:
    """In place on (B, heads, N >= 6, d) q and k: tokens 0-5 get the norms that break naive feature maps."""
    q[:, :, 0] = 0.0      # a zero query
    k[:, :, 1] = 0.0      # a zero key
    q[:, :, 2] *= 1e6     # huge query norm (tanh saturated)
    q[:, :, 3] *= 1e-30   # tiny query norm (its squares underflow in float32)
    k[:, :, 4] *= 1e3     # large key norm (k^3 ~ 1e9)
    k[:, :, 5] *= 1e-20
