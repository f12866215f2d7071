"""Image sizes and token grids: an input size from the command line, and the 2D grid a number of tokens forms."""
import math
from typing import Tuple

from ..errors import ConfigError

__all__ = ['parse_size', 'token_grid']


def parse_size(text: str) -> Tuple[int, int]:
    """'224' -> (224, 224); '448x672' -> (448, 672) as (H, W)."""
    try:
        size = tuple(int(side) for side in text.lower().split('x'))
    except ValueError:
        size = ()
    size = size * 2 if len(size) == 1 else size
    if len(size) != 2 or min(size) <= 0:
        raise ConfigError(f'bad image size {text!r}: give a positive side (224) or HxW (448x672)')
    return size


def token_grid(tokens: int) -> Tuple[int, int]:
    """The most nearly square grid (H, W) of ``tokens`` tokens: H * W = tokens, H <= W."""
    height = next(h for h in range(math.isqrt(tokens), 0, -1) if tokens % h == 0)
    return height, tokens // height
