"""Convert NaLaFormer / NaLa-Swin checkpoints to .safetensors or the release's .pth layout.

    python tools/convert_checkpoint.py nala_t.pth nala_t.safetensors                   # release -> ours
    python tools/convert_checkpoint.py nala_t.safetensors nala_t.pth                   # ours -> release layout
    python tools/convert_checkpoint.py work_dirs/RUN/epoch_300.pth t.safetensors --ema  # a tools/train.py run

Any checkpoint of ours or the release's is read without unpickling arbitrary objects: runner
checkpoints from tools/train.py (classification or dense: the backbone's weights are taken),
.safetensors, bare, DDP and release state dicts. ``--ema`` takes the EMA weights and fails if the
file has none. The model definition a checkpoint records (timm name, attn_types, kernel_kwargs) is
kept in the output; writes are atomic.
"""
import argparse
import sys

from nalaformer.checkpoint import CheckpointError, convert_checkpoint


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('src', help='checkpoint to read (.pth/.pt/.bin or .safetensors)')
    parser.add_argument('dst', help='file to write; its suffix picks the format (.safetensors, else .pth)')
    parser.add_argument('--ema', action='store_true', help='write the EMA weights (an error if there are none)')
    args = parser.parse_args(argv)
    try:
        described = convert_checkpoint(args.src, args.dst, ema=args.ema)
    except (CheckpointError, FileNotFoundError) as e:
        print(f'error: {e}', file=sys.stderr)
        return 1
    print(f'wrote {args.dst} ({"EMA" if args.ema else "raw"} weights): {described}')
    return 0


if __name__ == '__main__':
    sys.exit(main())
