"""Convert NaLaFormer / NaLa-Swin checkpoints to .safetensors, the release's .pth layout or a timm folder.

    python3 tools/convert_checkpoint.py nala_t.pth nala_t.safetensors                   # release -> ours
    python3 tools/convert_checkpoint.py nala_t.safetensors nala_t.pth                   # ours -> release layout
    python3 tools/convert_checkpoint.py work_dirs/RUN/epoch_300.pth t.safetensors --ema  # a tools/train.py run
    python3 tools/convert_checkpoint.py work_dirs/RUN/epoch_300.pth hub/nalaformer_t --ema  # a timm folder
    python3 tools/convert_checkpoint.py work_dirs/nalaformer-t_8xb128_in1k/epoch_300.pth \
        checkpoints/nalaformer_t_in1k.pth --ema        # the backbone file of every downstream config (docs/journey.md)

A destination without a suffix is a timm hub folder (timm's save_for_hf: config.json with the
architecture and every model argument, attn_types and kernel_kwargs included, plus model.safetensors):
timm.create_model('local-dir:hub/nalaformer_t', pretrained=True) rebuilds the model with its weights
(after `import nalaformer`), and timm's push_to_hf_hub publishes it. The release's .pth becomes its
hybrid model; folders convert back to files.

Any checkpoint of ours or the release's is read without unpickling arbitrary objects: runner
checkpoints from tools/train.py (classification or dense: the backbone's weights are taken),
.safetensors, bare, DDP and release state dicts. A run's EMA weights are taken where it kept them (what the
release evaluates, and what the downstream chain of docs/journey.md starts from), its raw weights otherwise;
``--ema`` insists on EMA weights (an error if there are none), ``--raw`` takes the raw weights. The model
definition a checkpoint records (timm name, attn_types, kernel_kwargs) and which weights were taken (EMA or
raw, of which run checkpoint) are kept in the output, and every run that starts from it logs them; writes
are atomic. An existing destination file is replaced only with
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
    weights = parser.add_mutually_exclusive_group()
    weights.add_argument('--ema', action='store_true',
                         help='write the EMA weights (an error if there are none); the default where the run kept them')
    weights.add_argument('--raw', action='store_true', help='write the raw weights although the file holds EMA weights')
    parser.add_argument('--overwrite', action='store_true',
                        help='replace an existing destination file, or a destination folder that is not a timm folder')
    args = parser.parse_args(argv)
    ema = True if args.ema else False if args.raw else None  # None: EMA where the run kept them
    described = convert_checkpoint(args.src, args.dst, ema=ema, overwrite=args.overwrite)
    print(f'wrote {args.dst}: {described}')


def main(argv=None) -> int:
    """The exit code: 0, or 2 with one line when the arguments are wrong (bugs keep their traceback)."""
    return run_tool(convert, argv)


if __name__ == '__main__':
    sys.exit(main())
