"""Write Fashion-MNIST (IDX files, e.g. Debian's dataset-fashion-mnist) as an ImageFolder dataset.

    python3 tools/dataset_converters/fashion_mnist_to_imagefolder.py OUT_DIR \
        [--src /usr/share/datasets/fashion-mnist] [--train-per-class 600] [--val-per-class N]

Produces OUT_DIR/{train,val}/<class name>/<index>.png (val: the test split, all 10,000 images unless
--val-per-class), the layout every classification config reads; a small real dataset for checking
the training pipeline end to end on a CPU. tools/quick_start.py runs this on first use.

OUT_DIR must be absent, empty or a dataset this converter wrote (it records itself in
OUT_DIR/nalaformer_dataset.json), which is then replaced atomically; a folder holding anything else is
left alone unless --overwrite.
"""
import argparse
import sys
from pathlib import Path

from nalaformer.datasets import DEFAULT_SRC, write_imagefolder
from nalaformer.errors import UserError, report


def positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f'{value}: give a number of images per class of at least 1')
    return value


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('out', type=Path)
    parser.add_argument('--src', type=Path, default=Path(DEFAULT_SRC))
    parser.add_argument('--train-per-class', type=positive, default=600, help='of 6,000 per class')
    parser.add_argument('--val-per-class', type=positive, default=None, help='of 1,000 per class (default: all)')
    parser.add_argument('--overwrite', action='store_true',
                        help='replace OUT_DIR even if it holds files this converter did not write (all are deleted)')
    args = parser.parse_args(argv)
    try:
        written = write_imagefolder(args.out, args.src, args.train_per_class, args.val_per_class, args.overwrite)
    except UserError as e:  # the arguments are wrong: one line; bugs keep their traceback
        return report(e)
    print(', '.join(f'{split}: {n} images' for split, n in written.items()))
    return 0


if __name__ == '__main__':
    sys.exit(main())
