"""Studies that train networks and report what they learnt, one subcommand each (``python3 tools/analysis/study.py
STUDY --help``; the code: nalaformer/analysis/studies/). ``classification`` and ``sr``: does the query norm sharpen
attention in trained models? (one network per attn_type and seed; resumable runs; OUT.json, OUT.md, OUT.png);
``dense``: do the dense models fit real-pixel scenes? (NaLaFormer vs ResNet-18 backbones; OUT.json, OUT.png).
``--combine`` only rewrites the outputs.
"""
import argparse
import sys
from typing import Optional, Sequence

from nalaformer.analysis.studies import classification, dense, sr
from nalaformer.errors import run_tool

TASKS = dict(classification=classification, sr=sr, dense=dense)


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    tasks = parser.add_subparsers(dest='study', required=True)
    for name, module in TASKS.items():
        module.add_arguments(tasks.add_parser(name, help=module.__doc__.split('\n')[0], description=module.__doc__,
                                              formatter_class=argparse.RawDescriptionHelpFormatter))
    args = parser.parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)
    return args


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_args(argv)
    return TASKS[args.study].main(args)


if __name__ == '__main__':
    sys.exit(run_tool(main))
