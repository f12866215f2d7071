"""Write Fashion-MNIST (IDX files, e.g. Debian's dataset-fashion-mnist) as an ImageFolder dataset.

    python tools/dataset_converters/fashion_mnist_to_imagefolder.py OUT_DIR \
        [--src /usr/share/datasets/fashion-mnist] [--train-per-class 600] [--val-per-class 100]

Produces OUT_DIR/{train,val}/<class name>/<index>.png, the layout every classification config
reads; a small real dataset for checking the training pipeline end to end on a CPU.
"""
import argparse
import gzip
from pathlib import Path

import numpy as np
from PIL import Image
from tqdm import tqdm

CLASSES = ('t-shirt', 'trouser', 'pullover', 'dress', 'coat', 'sandal', 'shirt', 'sneaker', 'bag', 'ankle-boot')
DEFAULT_SRC = '/usr/share/datasets/fashion-mnist'


def read_idx(path: Path) -> np.ndarray:
    """IDX format: big-endian magic (dtype code, ndim), dims, then the data."""
    with gzip.open(path, 'rb') as f:
        data = f.read()
    ndim = data[3]
    shape = tuple(int.from_bytes(data[4 + 4 * i:8 + 4 * i], 'big') for i in range(ndim))
    return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * ndim).reshape(shape)


def write_split(images: np.ndarray, labels: np.ndarray, out: Path, per_class: int) -> int:
    written = 0
    for c, name in enumerate(tqdm(CLASSES, desc=out.name)):
        folder = out / name
        folder.mkdir(parents=True, exist_ok=True)
        for i in np.flatnonzero(labels == c)[:per_class]:
            Image.fromarray(images[i]).save(folder / f'{i:05d}.png')
            written += 1
    return written


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('out', type=Path)
    parser.add_argument('--src', type=Path, default=Path(DEFAULT_SRC))
    parser.add_argument('--train-per-class', type=int, default=600)
    parser.add_argument('--val-per-class', type=int, default=100)
    args = parser.parse_args(argv)
    files = {s: (args.src / f'{s}-images-idx3-ubyte.gz', args.src / f'{s}-labels-idx1-ubyte.gz') for s in ('train', 't10k')}
    missing = [str(p) for pair in files.values() for p in pair if not p.is_file()]
    if missing:
        raise SystemExit(f'missing {missing}; install them with `apt-get install dataset-fashion-mnist` or pass --src')
    for split, source, per_class in (('train', 'train', args.train_per_class), ('val', 't10k', args.val_per_class)):
        n = write_split(read_idx(files[source][0]), read_idx(files[source][1]), args.out / split, per_class)
        print(f'{split}: {n} images')


if __name__ == '__main__':
    main()
