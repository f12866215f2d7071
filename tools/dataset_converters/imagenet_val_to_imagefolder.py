r"""Sort the flat ILSVRC2012 validation images into class folders (ImageFolder: val/<wnid>/<image>).

    # the devkit's ground truth (ILSVRC2012_devkit_t12.tar.gz: data/...)
    python3 tools/dataset_converters/imagenet_val_to_imagefolder.py ILSVRC2012_img_val data/imagenet/val \
        --ground-truth ILSVRC2012_devkit_t12/data/ILSVRC2012_validation_ground_truth.txt \
        --meta ILSVRC2012_devkit_t12/data/meta.mat --mode hardlink
    # Kaggle's ImageNet (ILSVRC/Data/CLS-LOC/val and LOC_val_solution.csv)
    python3 tools/dataset_converters/imagenet_val_to_imagefolder.py ILSVRC/Data/CLS-LOC/val data/imagenet/val \
        --ground-truth LOC_val_solution.csv

SRC: the folder of the 50,000 flat images (ILSVRC2012_img_val.tar unpacked: ILSVRC2012_val_00000001.JPEG ...).
--ground-truth: the devkit's ILSVRC2012_validation_ground_truth.txt (one ILSVRC2012_ID per line, 1-1000, with
--meta: the devkit's meta.mat, read with scipy, or a text file of "<ILSVRC2012_ID> <WNID>" lines), or Kaggle's
LOC_val_solution.csv (ImageId,PredictionString; it names the WNIDs itself).
--mode: copy (default; 6.4 GB more, the result stands alone), hardlink (no extra space, SRC untouched; SRC and
OUT on one file system) or symlink (no extra space; the result breaks when SRC moves). There is no move: an
interrupted move would leave the images spread over two folders.

Every image the ground truth lists must be in SRC (checked before anything is written; the first missing one is
named). OUT must be absent, empty or a folder this converter wrote (it records itself in
OUT/nalaformer_dataset.json, which the dataset check counts as one file not read), which is then replaced
atomically; a folder holding anything else is left alone unless --overwrite. OUT never overlaps SRC.
"""
import argparse
import sys

from nalaformer.datasets import flat_images, read_ground_truth, sort_val_images
from nalaformer.datasets.imagenet_val import FULL_SET, MODES
from nalaformer.errors import run_tool


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('src', help='folder of the flat validation images')
    parser.add_argument('out', help='folder to write the class folders in (e.g. data/imagenet/val)')
    parser.add_argument('--ground-truth', required=True, metavar='FILE',
                        help='ILSVRC2012_validation_ground_truth.txt (with --meta) or LOC_val_solution.csv')
    parser.add_argument('--meta', metavar='FILE',
                        help='the devkit\'s meta.mat, or a text file of "<ILSVRC2012_ID> <WNID>" lines')
    parser.add_argument('--mode', choices=MODES, default='copy',
                        help='how each image gets into its class folder (default: copy)')
    parser.add_argument('--overwrite', action='store_true',
                        help='replace OUT even if it holds files this converter did not write (all are deleted)')
    args = parser.parse_args(argv)
    labels = read_ground_truth(args.ground_truth, args.meta)
    written = sort_val_images(args.src, args.out, labels, mode=args.mode, overwrite=args.overwrite)
    images, classes = sum(written.values()), len(written)
    full = '' if (images, classes) == FULL_SET else (
        f' (the full ILSVRC2012 validation set is {FULL_SET[0]:,} images of {FULL_SET[1]:,} classes)')
    print(f'wrote {images} images in {classes} class folders to {args.out} ({args.mode}){full}')
    unlisted = sorted(set(flat_images(args.src)) - set(labels))
    if unlisted:
        shown = ', '.join(unlisted[:3]) + (f' and {len(unlisted) - 3} more' if len(unlisted) > 3 else '')
        print(f'note: {len(unlisted)} images in {args.src} are not in the ground truth and were left out: {shown}')
    return 0


if __name__ == '__main__':
    sys.exit(run_tool(main))  # user errors: one line, exit code 2; bugs keep their traceback
