"""Image files: listing, reading into uint8 RGB arrays, atomic saving, and the one float -> uint8 conversion.

numpy and Pillow only: converters and dataset writers use it without torch.
"""
from pathlib import Path
from typing import List, Tuple, Union

import numpy as np
from PIL import Image, UnidentifiedImageError

from ..errors import DatasetError
from ..files import atomic_file

__all__ = ['IMAGE_EXTENSIONS', 'IMAGE_FOLDER_EXTENSIONS', 'ImageError', 'image_files', 'image_size', 'read_image',
           'rgb_image', 'save_image', 'to_uint8']

IMAGE_EXTENSIONS = ('.png', '.bmp', '.jpg', '.jpeg', '.tif', '.tiff', '.webp', '.ppm')
# What timm's ImageFolder reader reads by default (timm.data.readers.img_extensions): class folders hold these.
IMAGE_FOLDER_EXTENSIONS = ('.png', '.jpg', '.jpeg')
# 8-bit modes PIL converts to RGB without loss of range; 16-bit / float modes would be clipped silently.
EIGHT_BIT_MODES = ('1', 'L', 'P', 'RGB', 'RGBA', 'LA', 'CMYK', 'YCbCr')
PathLike = Union[str, Path]


class ImageError(DatasetError):
    """An image file that cannot be read, or a folder that holds no images."""


def image_files(folder: PathLike) -> List[Path]:
    """The images in ``folder`` (not recursive), sorted; an error naming the folder when it has none."""
    folder = Path(folder)
    if not folder.is_dir():
        raise ImageError(f'folder {folder} does not exist')
    files = sorted(p for p in folder.iterdir() if p.suffix.lower() in IMAGE_EXTENSIONS and p.is_file())
    if not files:
        raise ImageError(f'folder {folder} holds no images ({", ".join(IMAGE_EXTENSIONS)})')
    return files


def image_size(path: PathLike) -> Tuple[int, int]:
    """(width, height) from the file's header; an error naming the file when it is not an image."""
    try:
        with Image.open(path) as image:
            return image.size
    except (OSError, UnidentifiedImageError) as e:
        raise ImageError(f'cannot read image {path}: {e}. Replace or remove the file.') from None


def read_image(path: PathLike) -> np.ndarray:
    """(H, W, 3) uint8 RGB of an 8-bit image file (greyscale and palette images converted); an error naming the
    file when it cannot be read or holds 16-bit or float pixels."""
    try:
        with Image.open(path) as image:
            if image.mode not in EIGHT_BIT_MODES:
                raise ImageError(f'{path} is a {image.mode} image (16-bit or float); this dataset holds 8-bit '
                                 f'images: convert it to 8-bit RGB')
            return np.asarray(image.convert('RGB'))
    except (OSError, UnidentifiedImageError, SyntaxError) as e:
        raise ImageError(f'cannot read image {path}: {e}. Replace or remove the file.') from None


def rgb_image(image: Image.Image) -> Image.Image:
    """A decoded image as 8-bit RGB: 16-bit grayscale scaled from 0-65535 (PIL's own conversion clips it at 255,
    turning most pixels white); modes without a fixed range (32-bit integer, float) are refused (ValueError)."""
    if image.mode.startswith('I;16'):
        return Image.fromarray(to_uint8(np.asarray(image, dtype=np.float64), peak=65535)).convert('RGB')
    if image.mode in ('I', 'F'):
        raise ValueError(f'PIL mode {image.mode!r} (32-bit {"integer" if image.mode == "I" else "float"} pixels) has '
                         f'no fixed value range to map to 8 bits; save the image as 8-bit or 16-bit')
    return image.convert('RGB')


def to_uint8(image: np.ndarray, peak: float = 1.) -> np.ndarray:
    """Pixels in [0, ``peak``] -> uint8 [0, 255], saturated and rounded half away from zero (MATLAB's im2uint8)."""
    scaled = np.clip(np.asarray(image, dtype=np.float64) * (255 / peak), 0, 255)
    return np.floor(scaled + 0.5).astype(np.uint8)


def save_image(image: np.ndarray, path: PathLike) -> None:
    """Write an (H, W[, C]) uint8 image (format by extension) so that ``path`` appears complete or not at all."""
    with atomic_file(path) as tmp:
        Image.fromarray(image).save(tmp)  # the temporary name keeps the suffix: the format
