"""Convert NaLaFormer checkpoints between the release's .pth layout and .safetensors.

    python tools/convert_checkpoint.py nala_t.pth nala_t.safetensors     # release -> ours
    python tools/convert_checkpoint.py nala_t.safetensors nala_t.pth     # ours -> release ({'model': ...})

The state-dict layout is the same in both directions; the tool reads without unpickling
arbitrary objects, reports the architecture it found and writes atomically.
"""
import argparse
import sys

from nalaformer.checkpoint import CheckpointError, convert_checkpoint
from nalaformer.models.nalaformer import _name_architecture


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('src', help='checkpoint to read (.pth/.pt/.bin or .safetensors)')
    parser.add_argument('dst', help='file to write; its suffix picks the format (.safetensors, else .pth)')
    parser.add_argument('--ema', action='store_true', help='take the EMA weights when the checkpoint has them')
    args = parser.parse_args(argv)
    try:
        arch = convert_checkpoint(args.src, args.dst, prefer_ema=args.ema)
    except (CheckpointError, FileNotFoundError) as e:
        print(f'error: {e}', file=sys.stderr)
        return 1
    print(f'wrote {args.dst}: {_name_architecture(arch)}')
    return 0


if __name__ == '__main__':
    sys.exit(main())
