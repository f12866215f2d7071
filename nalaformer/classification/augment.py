"""timm's image transforms with RandAugment / AutoAugment's Posterize defined at every magnitude on every Pillow.

timm's policies ask Pillow to keep 0 bits per channel at some magnitudes: ``PosterizeIncreasing`` (the
release's ``rand-m9-mstd0.5-inc1``) at magnitude 10, which the magnitude noise reaches on about 0.2 % of
images, and ``Posterize`` (``rand-m9``, AutoAugment ``v0`` / ``original``) below magnitude 2.5. Keeping 0 bits
masks every bit: a black image, which is what Pillow 12.3.0 and earlier return (the release's stack) and what
the TensorFlow policies these come from define. Pillow 13.0.0 refuses 0 bits with ``ValueError: bits must be
between or equal to 1 and 8``. :func:`create_transform` gives timm's transform with that one operation
replaced by :func:`posterize`, so the recipe behaves as the release's at every magnitude, whatever Pillow.
"""
from typing import Iterator

from PIL import Image, ImageOps
from timm.data import auto_augment
from timm.data import create_transform as timm_create_transform

__all__ = ['create_transform', 'posterize']


def posterize(image: Image.Image, bits_to_keep: int, **_) -> Image.Image:
    """Keep the ``bits_to_keep`` most significant bits of each 8-bit channel (0: a black image; 8 or more:
    the image unchanged), as timm's ``posterize`` on Pillow <= 12.3."""
    if bits_to_keep >= 8:
        return image
    if bits_to_keep >= 1:
        return ImageOps.posterize(image, bits_to_keep)
    return image.point([0] * (256 * len(image.getbands())))


def _augment_ops(transform) -> Iterator[auto_augment.AugmentOp]:
    """Every timm ``AugmentOp`` inside ``transform`` (a Compose, RandAugment, AutoAugment or AugMix)."""
    for step in getattr(transform, 'transforms', [transform]):
        if isinstance(step, auto_augment.AutoAugment):
            yield from (op for sub_policy in step.policy for op in sub_policy)
        elif isinstance(step, (auto_augment.RandAugment, auto_augment.AugMixAugment)):
            yield from step.ops


def create_transform(input_size, is_training: bool = False, **kwargs):
    """``timm.data.create_transform(input_size, is_training, **kwargs)`` whose Posterize operations keep 0 bits
    as a black image instead of raising (see the module's docstring)."""
    transform = timm_create_transform(input_size, is_training=is_training, **kwargs)
    for op in _augment_ops(transform):
        if op.aug_fn is auto_augment.posterize:
            op.aug_fn = posterize
    return transform
