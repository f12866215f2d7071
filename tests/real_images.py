"""Real photographs in the layouts the shipped configs read, for tests: scikit-image's bundled pictures
(astronaut, coffee, chelsea, rocket, ...; installed with scikit-image, no network), cut into crops of
ImageNet-like sizes."""
from pathlib import Path
from typing import Dict

import numpy as np
from PIL import Image

PHOTOS = ('astronaut', 'coffee', 'chelsea', 'rocket', 'hubble_deep_field', 'immunohistochemistry', 'camera',
          'coins')  # colour and grey, 300-1000 px


def photos() -> Dict[str, np.ndarray]:
    """name -> (H, W[, 3]) uint8 photograph."""
    from skimage import data
    return {name: getattr(data, name)() for name in PHOTOS}


def random_crop(photo: np.ndarray, rng: np.random.Generator, smallest: float = 0.5) -> np.ndarray:
    """A crop of ``smallest`` to all of each side of ``photo``, at a random place."""
    h, w = photo.shape[:2]
    scale = rng.uniform(smallest, 1.0)
    ch, cw = int(h * scale), int(w * scale)
    y, x = int(rng.integers(0, h - ch + 1)), int(rng.integers(0, w - cw + 1))
    return photo[y:y + ch, x:x + cw]


def write_photo_imagefolder(root: Path, per_class: int = 4, val_per_class: int = 2, seed: int = 0) -> Path:
    """``root/{train,val}/<photo name>/<k>.jpg``: one class per photograph, random crops of it; returns root."""
    rng = np.random.default_rng(seed)
    for split, count in (('train', per_class), ('val', val_per_class)):
        for name, photo in photos().items():
            folder = root / split / name
            folder.mkdir(parents=True, exist_ok=True)
            for k in range(count):
                Image.fromarray(random_crop(photo, rng)).save(folder / f'{k}.jpg', quality=90)
    return root
