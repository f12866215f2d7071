"""Write a small real-photo super-resolution dataset: training photographs in DIV2K's layout, and unseen test
photographs in the benchmark layout.

    python3 tools/dataset_converters/sr_photos.py data/sr-photos [--scales 2 3 4] [--overwrite]

    data/sr-photos/DIV2K/DIV2K_train_HR/<photo>_d<shrink>_<k>.png, DIV2K_train_LR_bicubic/X{2,3,4}/...x{s}.png
        Debian's mate-backgrounds nature photographs (/usr/share/backgrounds/mate/nature), shrunk 2x, 3x and 4x
        with MATLAB's bicubic and cut into 96x96 sub-images, of which the ~200 with detail are kept (most of
        these photographs are smooth: bokeh, sky)
    data/sr-photos/benchmark/Unseen4/HR/{butterfly,astronaut,coffee,chelsea}.png, LR_bicubic/X{2,3,4}/...
        OpenCV's dnn_superres/butterfly.png (Debian's opencv-doc) and scikit-image's astronaut, coffee, chelsea

LR images are MATLAB-style bicubic shrinks (nalaformer/images/resize.py), as in DIV2K and the benchmarks. The
result is what configs/sr/nalasr-pico_1xb32-2k_photos-x2.py trains and tests on (bash scripts/setup.sh
installs the photographs). An existing DIV2K/ or benchmark/Unseen4/ there is refused unless --overwrite.
"""
import argparse
import sys

from nalaformer.datasets import write_photo_datasets
from nalaformer.errors import run_tool


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('out', help='data root to write (holds DIV2K/ and benchmark/ afterwards)')
    parser.add_argument('--scales', type=int, nargs='+', default=[2, 3, 4])
    parser.add_argument('--overwrite', action='store_true',
                        help='replace a DIV2K/ or benchmark/Unseen4/ written before')
    args = parser.parse_args(argv)
    train, test = write_photo_datasets(args.out, args.scales, overwrite=args.overwrite)
    print(f'wrote {train} (training) and {test} (testing)')
    return 0


if __name__ == '__main__':
    sys.exit(run_tool(main))  # user errors: one line, exit code 2; bugs keep their traceback
