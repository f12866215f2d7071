"""Write the bicubic LR images of an HR folder, as super-resolution benchmarks make them.

    python3 tools/dataset_converters/bicubic_downsample.py HR_DIR LR_ROOT [--scales 2 3 4] [--overwrite]

    # DIV2K: data/DIV2K/DIV2K_train_LR_bicubic/X{2,3,4}/0001x2.png ...
    python3 tools/dataset_converters/bicubic_downsample.py data/DIV2K/DIV2K_train_HR data/DIV2K/DIV2K_train_LR_bicubic
    # a benchmark set: data/benchmark/Set5/LR_bicubic/X2/babyx2.png ...
    python3 tools/dataset_converters/bicubic_downsample.py data/benchmark/Set5/HR data/benchmark/Set5/LR_bicubic

Writes ``LR_ROOT/X{s}/<stem>x{s}.png`` for every image of HR_DIR: the HR image cut to a multiple of s, then
shrunk with MATLAB's ``imresize(hr, 1/s)`` (bicubic, antialiased; see nalaformer/images/resize.py for how close
it is to MATLAB). Existing LR images are refused unless --overwrite (which replaces only those); nothing
else in LR_ROOT is touched, and each file appears complete or not at all.
"""
import argparse
import sys


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('hr_dir', help='folder of HR images')
    parser.add_argument('lr_root', help='where the X{s} folders go (e.g. .../DIV2K_train_LR_bicubic)')
    parser.add_argument('--scales', type=int, nargs='+', default=[2, 3, 4])
    parser.add_argument('--overwrite', action='store_true', help='replace LR images that exist already')
    return parser.parse_args(argv)


def convert(args: argparse.Namespace) -> int:
    # imported once the command line is read: importing nalaformer registers its timm models (torch), which
    # --help and a wrong command line do not need
    from nalaformer.datasets import write_lr_images
    written = write_lr_images(args.hr_dir, args.lr_root, args.scales, overwrite=args.overwrite)
    print(f'wrote {written} LR images under {args.lr_root}')
    return 0


def main(argv=None) -> int:
    return convert(parse_args(argv))


if __name__ == '__main__':
    args = parse_args()
    from nalaformer.errors import run_tool
    sys.exit(run_tool(lambda argv: convert(args)))  # user errors: one line, exit code 2; bugs keep their traceback
