"""Write Fashion-MNIST (IDX files, e.g. Debian's dataset-fashion-mnist) as an ImageFolder dataset.

    python tools/dataset_converters/fashion_mnist_to_imagefolder.py OUT_DIR \
        [--src /usr/share/datasets/fashion-mnist] [--train-per-class 600] [--val-per-class 100]

Produces OUT_DIR/{train,val}/<class name>/<index>.png, the layout every classification config
reads; a small real dataset for checking the training pipeline end to end on a CPU.
"""
import argparse
from pathlib import Path

import numpy as np
from PIL import Image
from tqdm import tqdm

from nalaformer.datasets import CLASSES, DEFAULT_SRC, read_fashion_mnist


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
    try:
        splits = {'train': read_fashion_mnist(args.src, 'train'), 'val': read_fashion_mnist(args.src, 'test')}
    except FileNotFoundError as e:
        raise SystemExit(str(e))
    for split, per_class in (('train', args.train_per_class), ('val', args.val_per_class)):
        n = write_split(*splits[split], args.out / split, per_class)
        print(f'{split}: {n} images')


if __name__ == '__main__':
    main()
