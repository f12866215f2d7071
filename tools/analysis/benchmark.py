"""Benchmarks: time, memory and losses of models, attention ops and kernels, one subcommand per measurement
(``python3 tools/analysis/benchmark.py SUBCOMMAND --help``; the code: nalaformer/analysis/benchmarks/). A row that fails
stops a benchmark with its error; ``--keep-going`` records it and goes on; running out of memory is a result.
"""
import argparse
import sys
from typing import Optional, Sequence

from nalaformer.analysis.benchmarks import contention, kernels, model, op, segmentor, sr
from nalaformer.analysis.cli import parse_subcommand
from nalaformer.errors import run_tool

COMMANDS = dict(model=model, op=op, kernels=kernels, sr=sr, segmentor=segmentor, contention=contention)


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    return parse_subcommand(__doc__, COMMANDS, argv)


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_args(argv)
    return COMMANDS[args.command].main(args)


if __name__ == '__main__':
    sys.exit(run_tool(main))
