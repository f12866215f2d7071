"""Export a NaLaFormer classifier or dense backbone to ONNX, checked in ONNX Runtime.

    python3 tools/deployment/export_onnx.py nalaformer_t --checkpoint nala_t.pth --out nalaformer_t.onnx
    python3 tools/deployment/export_onnx.py nalaformer_t --attn-types nala --out nalaformer_t-allnala.onnx
    python3 tools/deployment/export_onnx.py configs/ade20k/upernet_nalaformer-t_8xb2-160k_ade20k-512x512.py \\
        --checkpoint work_dirs/RUN/best_mIoU_iter_160000.pth --out upernet_t_backbone.onnx

MODEL_OR_CONFIG: a timm name (its classifier: input (B, C, H, W) -> logits (B, classes)) or a config file
(classification: its classifier; segmentation / detection: its backbone, input -> feat<i> per output
stage, (B, C_i, ceil(H / s_i), ceil(W / s_i))). Inputs are normalised images (a config's data
preprocessor is not in the graph); batch, height and width are dynamic. NaLa-Swin cannot be exported
(its timm Swin parts cannot be made dynamic: the error says why).

The graph uses standard ONNX operators only: NaLa attention is traced through its PyTorch reference,
and fused Triton kernels named by a config or a checkpoint are replaced by the PyTorch kernel that
computes the same function (asking for one with --attn-types is an error). Before the file is written,
ONNX Runtime runs it at each --check-shapes shape and must match PyTorch within --atol. Needs onnx,
onnxruntime and onnxscript: pip install -e .[export] (or bash scripts/setup.sh). --out is checked before
the export starts (an existing file is replaced only with --overwrite) and written atomically.
"""
import argparse
import sys
import time

from nalaformer.deployment import ExportError, build_target, parse_shape, require_export_packages, write_onnx
from nalaformer.errors import run_tool
from nalaformer.files import check_file_destination


def shape(text: str):
    """[B]xHxW -> (B, H, W)."""
    try:
        return parse_shape(text)
    except ExportError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def image_size(text: str):
    """HxW -> (H, W)."""
    if text.lower().count('x') > 1:
        raise argparse.ArgumentTypeError(f'{text!r}: give HxW (the export traces at batch 2)')
    return shape(text)[1:]


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('model', metavar='MODEL_OR_CONFIG', help='timm model name (e.g. nalaformer_t) or config file')
    parser.add_argument('--out', required=True, help='ONNX file to write')
    parser.add_argument('--overwrite', action='store_true', help='replace --out if it exists')
    parser.add_argument('--checkpoint', help='weights: any checkpoint of ours or the release\'s (for a dense config '
                                             'also a tools/train.py run of that task); default: random init')
    parser.add_argument('--ema', action='store_true', help='the checkpoint\'s EMA weights (an error if it has none)')
    parser.add_argument('--attn-types', nargs='+', metavar='KERNEL',
                        help='one kernel for every stage or one per stage, e.g. nala, or nala nala softmax softmax')
    parser.add_argument('--num-classes', type=int, help='classes of a fine-tuned checkpoint (timm names)')
    parser.add_argument('--size', type=image_size, default=(224, 224), metavar='HxW',
                        help='image size the export traces, at batch 2 (default 224x224; the graph takes any size)')
    parser.add_argument('--check-shapes', '--check-sizes', nargs='+', type=shape, metavar='[Bx]HxW',
                        help='shapes ONNX Runtime is checked at (default: 1x<size> and 2x320x480)')
    parser.add_argument('--atol', type=float, default=1e-4, help='largest accepted |onnx - torch| (default 1e-4)')
    parser.add_argument('--no-check', action='store_true', help='skip the ONNX Runtime check')
    parser.add_argument('--opset', type=int, help='ONNX opset (default: the exporter\'s)')
    args = parser.parse_args(argv)
    if args.ema and not args.checkpoint:
        parser.error('--ema needs --checkpoint')
    return args


def export(argv=None):
    args = parse_args(argv)
    started = time.time()
    check_file_destination(args.out, args.overwrite, '--out', 'model.onnx', inputs=(args.model, args.checkpoint))
    require_export_packages()
    attn_types = None if args.attn_types is None else (
        args.attn_types[0] if len(args.attn_types) == 1 else tuple(args.attn_types))
    print(f'building {args.model}' + (f' with {args.checkpoint}' if args.checkpoint else ' (random weights)'))
    target = build_target(args.model, attn_types, args.num_classes, args.checkpoint, args.ema)
    for note in target.notes:
        print(f'note: {note}')
    check_shapes = args.check_shapes or [(1, *args.size), (2, 320, 480)]
    write_onnx(target, args.out, (2, *args.size), [] if args.no_check else check_shapes, args.atol,
               args.opset, log=print)
    print(f'wrote {args.out} in {time.time() - started:.1f} s')


def main(argv=None) -> int:
    """The exit code: 0, or 2 with one line when the arguments are wrong (bugs keep their traceback)."""
    return run_tool(export, argv)


if __name__ == '__main__':
    sys.exit(main())
