"""Convert NaLaFormer / NaLa-Swin checkpoints to .safetensors, the release's .pth layout or a timm folder.

    python tools/convert_checkpoint.py nala_t.pth nala_t.safetensors                   # release -> ours
    python tools/convert_checkpoint.py nala_t.safetensors nala_t.pth                   # ours -> release layout
    python tools/convert_checkpoint.py work_dirs/RUN/epoch_300.pth t.safetensors --ema  # a tools/train.py run
    python tools/convert_checkpoint.py work_dirs/RUN/epoch_300.pth hub/nalaformer_t --ema  # a timm folder

A destination without a suffix is a timm hub folder (timm's save_for_hf: config.json with the
architecture and every model argument, attn_types and kernel_kwargs included, plus model.safetensors):
timm.create_model('local-dir:hub/nalaformer_t', pretrained=True) rebuilds the model with its weights
(after `import nalaformer`), and timm's push_to_hf_hub publishes it. The release's .pth becomes its
hybrid model; folders convert back to files.

Any checkpoint of ours or the release's is read without unpickling arbitrary objects: runner
checkpoints from tools/train.py (classification or dense: the backbone's weights are taken),
.safetensors, bare, DDP and release state dicts. ``--ema`` takes the EMA weights and fails if the
file has none. The model definition a checkpoint records (timm name, attn_types, kernel_kwargs) is
kept in the output; writes are atomic. An existing destination file is replaced only with
``--overwrite``; a destination folder must be absent, empty or a timm folder (which is replaced).
"""
import argparse
import sys

from nalaformer.checkpoint.conversion import convert_checkpoint
from nalaformer.errors import run_tool


def convert(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('src', help='checkpoint to read (.pth/.pt/.bin, .safetensors or a timm folder)')
    parser.add_argument('dst', help='what to write: its suffix picks the format (.safetensors, .pth); '
                                    'no suffix: a timm folder')
    parser.add_argument('--ema', action='store_true', help='write the EMA weights (an error if there are none)')
    parser.add_argument('--overwrite', action='store_true',
                        help='replace an existing destination file, or a destination folder that is not a timm folder')
    args = parser.parse_args(argv)
    described = convert_checkpoint(args.src, args.dst, ema=args.ema, overwrite=args.overwrite)
    print(f'wrote {args.dst} ({"EMA" if args.ema else "raw"} weights): {described}')


def main(argv=None) -> int:
    """The exit code: 0, or 2 with one line when the arguments are wrong (bugs keep their traceback)."""
    return run_tool(convert, argv)


if __name__ == '__main__':
    sys.exit(main())
