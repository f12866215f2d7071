"""Fashion-MNIST from its IDX files (Debian's ``dataset-fashion-mnist`` installs them)."""
import gzip
import os
import shutil
import tempfile
from pathlib import Path
from typing import Dict, Optional, Tuple

import numpy as np
from PIL import Image
from tqdm import tqdm

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
        raise FileNotFoundError(f'Fashion-MNIST files missing: {missing}; install them with '
                                f'`apt-get install dataset-fashion-mnist` (bash scripts/setup.sh does) or pass --src DIR')
    return _read_idx(files[0]), _read_idx(files[1])


def write_imagefolder(out, src=DEFAULT_SRC, train_per_class: Optional[int] = 600,
                      val_per_class: Optional[int] = None) -> Dict[str, int]:
    """Write ``out/{train,val}/<class>/<index>.png`` (val = the test split), the layout every classification
    config reads; ``*_per_class`` None takes every image. Written into a temporary folder that is renamed
    into place, so an interrupted run never leaves a partial dataset. Returns the images per split."""
    out = Path(out)
    splits = {'train': (read_fashion_mnist(src, 'train'), train_per_class),
              'val': (read_fashion_mnist(src, 'test'), val_per_class)}
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=out.parent, prefix=f'.{out.name}.'))
    written = {}
    try:
        for split, ((images, labels), per_class) in splits.items():
            chosen = np.concatenate([np.flatnonzero(labels == c)[:per_class] for c in range(len(CLASSES))])
            for name in CLASSES:
                (tmp / split / name).mkdir(parents=True)
            for i in tqdm(chosen, desc=f'Fashion-MNIST {split} -> {out / split}', unit='img'):
                Image.fromarray(images[i]).save(tmp / split / CLASSES[labels[i]] / f'{i:05d}.png')
            written[split] = len(chosen)
        if out.exists():
            shutil.rmtree(out)
        os.replace(tmp, out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return written
