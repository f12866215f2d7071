"""Fashion-MNIST from its IDX files (Debian's ``dataset-fashion-mnist`` installs them)."""
import gzip
from pathlib import Path
from typing import Tuple

import numpy as np

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
