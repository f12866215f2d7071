"""MATLAB's ``imresize(image, scale)`` with its default bicubic kernel: how super-resolution benchmarks make
their low-resolution images (``LR_bicubic``) and their bicubic baseline.

What MATLAB does, and this module too:

* Keys' cubic kernel with a = -0.5; when shrinking (scale < 1) the kernel is stretched by 1/scale and
  scaled by ``scale`` (antialiasing), so each LR pixel averages 4/scale HR pixels per axis.
* Output pixel x (1-based) samples the input at u = x / scale + (1 - 1 / scale) / 2 (pixel centres line up).
* Taps outside the image are mirrored (``[1..n, n..1]``, the edge pixel repeated); each pixel's weights
  are normalised to sum to 1.
* Output size ``ceil(n * scale)``; one 1-D pass per axis, rows (height) first when both scales are equal.
* uint8 images are rounded (half away from zero) and saturated after *each* pass: MATLAB's resampler
  (``imresizemex``) returns the class of its input. Float images stay float.

So a uint8 result should equal MATLAB's except where a sum lands within float round-off of a .5 boundary
(different summation order): at most 1 grey level, on rare pixels. This is not checked against MATLAB
itself (not available here). The tests check hand-computed values and the defining properties (constants
and ramps reproduced, mirroring), and PIL's antialiased BICUBIC: it uses the same kernel, support and pixel
centres and also rounds to uint8 between its passes, but goes width first and truncates the kernel at the
borders; run width first, this implementation gives PIL's pixels exactly away from the borders (butterfly.png,
x2/x3/x4), and height first (MATLAB's order) within 2 grey levels there. Keeping the intermediate in float
instead (as Python ports of imresize often do) moves 11-15% of butterfly.png's LR pixels by 1-2 levels.
"""
import math

import numpy as np

from .io import to_uint8

__all__ = ['imresize', 'cubic']


def cubic(x: np.ndarray) -> np.ndarray:
    """Keys' cubic convolution kernel with a = -0.5 (MATLAB's and PIL's 'bicubic'); support [-2, 2]."""
    a = np.abs(x)
    a2, a3 = a * a, a * a * a
    return ((1.5 * a3 - 2.5 * a2 + 1) * (a <= 1)
            + (-0.5 * a3 + 2.5 * a2 - 4 * a + 2) * ((a > 1) & (a <= 2)))


def contributions(in_length: int, out_length: int, scale: float):
    """-> weights (out_length, taps) float64 summing to 1 per row, indices (out_length, taps) 0-based."""
    kernel_width = 4.0 / scale if scale < 1 else 4.0
    x = np.arange(1, out_length + 1, dtype=np.float64)
    u = x / scale + 0.5 * (1 - 1 / scale)
    left = np.floor(u - kernel_width / 2)
    taps = int(math.ceil(kernel_width)) + 2
    positions = left[:, None] + np.arange(taps)  # 1-based input positions, possibly outside the image
    distance = u[:, None] - positions
    weights = scale * cubic(scale * distance) if scale < 1 else cubic(distance)
    weights /= weights.sum(axis=1, keepdims=True)
    mirror = np.concatenate([np.arange(in_length), np.arange(in_length)[::-1]])
    indices = mirror[(positions.astype(np.int64) - 1) % (2 * in_length)]
    used = weights.any(axis=0)
    return weights[:, used], indices[:, used]


def _resize_axis(image: np.ndarray, axis: int, out_length: int, scale: float, rounded: bool) -> np.ndarray:
    weights, indices = contributions(image.shape[axis], out_length, scale)
    moved = np.moveaxis(image, axis, 0)
    out = np.zeros((out_length,) + moved.shape[1:], dtype=np.float64)
    extra = (slice(None),) + (None,) * (moved.ndim - 1)
    for tap in range(weights.shape[1]):
        out += weights[:, tap][extra] * moved[indices[:, tap]]
    if rounded:
        out = to_uint8(out, peak=255)
    return np.moveaxis(out, 0, axis)


def output_size(length: int, scale: float) -> int:
    """``ceil(length * scale)`` as MATLAB computes it, robust to 1/3 not being exact in binary."""
    return int(math.ceil(length * scale - 1e-9))


def imresize(image: np.ndarray, scale: float) -> np.ndarray:
    """MATLAB's ``imresize(image, scale)`` (bicubic, antialiased when shrinking).

    Args:
        image: (H, W) or (H, W, C), uint8 or float (float images are not clipped).
        scale: output / input size, e.g. 1/2 to make x2 LR images, 2 for the x2 bicubic baseline.

    Returns:
        (ceil(H * scale), ceil(W * scale)[, C]) of the input's dtype.
    """
    image = np.asarray(image)
    if image.ndim not in (2, 3):
        raise ValueError(f'imresize expects an (H, W) or (H, W, C) image, got shape {image.shape}')
    if not scale > 0:
        raise ValueError(f'imresize scale must be positive, got {scale}')
    rounded = image.dtype == np.uint8
    if not (rounded or np.issubdtype(image.dtype, np.floating)):
        raise TypeError(f'imresize expects a uint8 or float image, got {image.dtype}')
    out = image if rounded else image.astype(np.float64)
    for axis in (0, 1):
        out = _resize_axis(out, axis, output_size(image.shape[axis], scale), scale, rounded)
    return out if rounded else out.astype(image.dtype)
