"""Real images for the attention analyses, from files or the photo that ships with matplotlib."""
from pathlib import Path
from typing import Sequence, Tuple

import torch
from PIL import Image
from timm.data import create_transform

__all__ = ['default_image_paths', 'load_images']


def default_image_paths() -> Tuple[Path, ...]:
    """matplotlib's sample photo (grace_hopper.jpg, 512x600): always installed, no download."""
    import matplotlib.cbook
    return (Path(matplotlib.cbook.get_sample_data('grace_hopper.jpg', asfileobj=False)),)


def load_images(paths: Sequence[Path], size: Tuple[int, int], mean: Sequence[float],
                std: Sequence[float]) -> Tuple[torch.Tensor, torch.Tensor]:
    """Resize each image to ``size`` (H, W) (no crop) and normalise with ``mean``/``std``.

    Returns the model input (B, 3, H, W) and the un-normalised pixels (B, H, W, 3) in [0, 1] for display.
    """
    transform = create_transform(input_size=(3, *size), crop_pct=1.0, crop_mode='squash',
                                 interpolation='bicubic', mean=(0., 0., 0.), std=(1., 1., 1.))
    pixels = torch.stack([transform(Image.open(p).convert('RGB')) for p in paths])
    normalised = (pixels - torch.tensor(mean)[:, None, None]) / torch.tensor(std)[:, None, None]
    return normalised, pixels.permute(0, 2, 3, 1).clamp(0, 1)
