"""Studies that train networks and report what they learnt, one subcommand each (``python3 tools/analysis/study.py
STUDY --help``; the code: nalaformer/analysis/studies/). ``classification`` and ``sr``: does the query norm sharpen
attention in trained models? (one network per attn_type and seed; resumable runs; OUT.json, OUT.md, OUT.png);
``dense``: do the dense models fit real-pixel scenes? (NaLaFormer vs ResNet-18 backbones; OUT.json, OUT.png).
``--combine`` only rewrites the outputs.
"""
import argparse
import sys
from typing import Optional, Sequence

from nalaformer.analysis.cli import parse_subcommand
from nalaformer.analysis.studies import classification, dense, sr
from nalaformer.errors import run_tool

TASKS = dict(classification=classification, sr=sr, dense=dense)


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    return parse_subcommand(__doc__, TASKS, argv)


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_args(argv)
    return TASKS[args.command].main(args)


if __name__ == '__main__':
    sys.exit(run_tool(main))
