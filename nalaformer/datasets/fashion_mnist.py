"""Fashion-MNIST from its IDX files (Debian's ``dataset-fashion-mnist`` installs them)."""
import gzip
from pathlib import Path
from typing import Dict, Optional, Sequence, Tuple

import numpy as np
from PIL import Image
from tqdm import tqdm

from ..errors import DatasetError
from ..files import atomic_folder
from .written import check_dataset_destination, write_marker

CLASSES = ('t-shirt', 'trouser', 'pullover', 'dress', 'coat', 'sandal', 'shirt', 'sneaker', 'bag', 'ankle-boot')
DEFAULT_SRC = '/usr/share/datasets/fashion-mnist'
_FILE_PREFIX = {'train': 'train', 'test': 't10k'}


def _read_idx(path: Path) -> np.ndarray:
    """IDX format: big-endian magic (dtype code, ndim), the dims, then the data."""
    with gzip.open(path, 'rb') as f:
        data = f.read()
    ndim = data[3]
    shape = tuple(int.from_bytes(data[4 + 4 * i:8 + 4 * i], 'big') for i in range(ndim))
    return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * ndim).reshape(shape)


def read_fashion_mnist(src=DEFAULT_SRC, split: str = 'train') -> Tuple[np.ndarray, np.ndarray]:
    """``split`` 'train' (60,000) or 'test' (10,000) -> images (N, 28, 28) uint8, labels (N,) uint8."""
    prefix = _FILE_PREFIX[split]
    files = [Path(src) / f'{prefix}-{kind}-idx{ndim}-ubyte.gz' for kind, ndim in (('images', 3), ('labels', 1))]
    missing = [str(p) for p in files if not p.is_file()]
    if missing:
        raise DatasetError(f'Fashion-MNIST files missing: {missing}; install them with '
                                f'`apt-get install dataset-fashion-mnist` (bash scripts/setup.sh does) or pass --src DIR')
    return _read_idx(files[0]), _read_idx(files[1])


def write_imagefolder(out, src=DEFAULT_SRC, train_per_class: Optional[int] = 600,
                      val_per_class: Optional[int] = None, overwrite: bool = False) -> Dict[str, int]:
    """Write ``out/{train,val}/<class>/<index>.png`` (val = the test split), the layout every classification
    config reads; ``*_per_class`` None takes every image. Written into a temporary folder that is renamed
    into place, so an interrupted run never leaves a partial dataset. ``out`` must be absent, empty or a
    dataset written here (:func:`check_dataset_destination`). Returns the images per split."""
    out = check_dataset_destination(out, overwrite)
    splits = {'train': (read_fashion_mnist(src, 'train'), train_per_class),
              'val': (read_fashion_mnist(src, 'test'), val_per_class)}
    written = {}
    with atomic_folder(out) as tmp:
        for split, ((images, labels), per_class) in splits.items():
            chosen = np.concatenate([np.flatnonzero(labels == c)[:per_class] for c in range(len(CLASSES))])
            for name in CLASSES:
                (tmp / split / name).mkdir(parents=True)
            for i in tqdm(chosen, desc=f'Fashion-MNIST {split} -> {out / split}', unit='img'):
                Image.fromarray(images[i]).save(tmp / split / CLASSES[labels[i]] / f'{i:05d}.png')
            written[split] = len(chosen)
        write_marker(tmp, 'nalaformer.datasets.write_imagefolder (Fashion-MNIST)', written)
    return written


def write_brightest_of_four(out, src: Optional[str] = None, train_per_class: int = 600,
                            val_per_class: Optional[int] = 1000, seed: int = 0,
                            dim: Sequence[float] = (0.3, 0.55), overwrite: bool = False) -> Dict[str, int]:
    """A harder real-pixel task built from Fashion-MNIST: a 2x2 mosaic (32x32) of four items (16x16 each,
    random classes and places); one is shown at full contrast, the other three dimmed to a random
    ``dim`` fraction; the label is the class of the bright one.

    Which item counts depends on a comparison over the whole image, so the model has to select one
    region and ignore the others (a sharp, content-dependent pooling: what attention provides) rather
    than average all the items' features. Training mosaics use the train split, val ones the test
    split. Same ``out/{train,val}/<class>/*.png`` layout (and destination rule) as :func:`write_imagefolder`.
    """
    out = check_dataset_destination(out, overwrite)
    rng = np.random.default_rng(seed)
    written = {}
    with atomic_folder(out) as tmp:
        for split, source, per_class in (('train', 'train', train_per_class), ('val', 'test', val_per_class)):
            images, labels = read_fashion_mnist(src or DEFAULT_SRC, source)
            small = np.asarray([np.asarray(Image.fromarray(im).resize((16, 16), Image.BILINEAR)) for im in images],
                               dtype=np.float32)
            per_class = per_class or int(np.bincount(labels).min())
            count = 0
            for c, name in enumerate(CLASSES):
                (tmp / split / name).mkdir(parents=True)
                targets = rng.choice(np.flatnonzero(labels == c), per_class, replace=per_class > (labels == c).sum())
                for j, target in enumerate(targets):
                    items = np.concatenate([[target], rng.integers(0, len(images), 3)])
                    scale = np.concatenate([[1.0], rng.uniform(*dim, 3)])
                    order = rng.permutation(4)
                    canvas = np.zeros((32, 32), dtype=np.float32)
                    for slot, i in enumerate(order):
                        r, col = divmod(slot, 2)
                        canvas[16 * r:16 * r + 16, 16 * col:16 * col + 16] = small[items[i]] * scale[i]
                    Image.fromarray(canvas.round().clip(0, 255).astype(np.uint8)).save(
                        tmp / split / name / f'{j:05d}.png')
                    count += 1
            written[split] = count
        write_marker(tmp, 'nalaformer.datasets.write_brightest_of_four', written)
    return written
