"""Benchmarks: time, memory and losses of models, attention ops and kernels, one subcommand per measurement
(``python3 tools/analysis/benchmark.py SUBCOMMAND --help``; the code: nalaformer/analysis/benchmarks/). A row that fails
stops a benchmark with its error; ``--keep-going`` records it and goes on; running out of memory is a result.
"""
import argparse
import sys
from typing import Optional, Sequence

from nalaformer.analysis.benchmarks import contention, kernels, model, op, segmentor, sr
from nalaformer.errors import run_tool

COMMANDS = dict(model=model, op=op, kernels=kernels, sr=sr, segmentor=segmentor, contention=contention)


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest='command', required=True)
    for name, module in COMMANDS.items():
        module.add_arguments(commands.add_parser(name, help=module.__doc__.split('\n')[0], description=module.__doc__,
                                                 formatter_class=argparse.RawDescriptionHelpFormatter))
    args = parser.parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)
    return args


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_args(argv)
    return COMMANDS[args.command].main(args)


if __name__ == '__main__':
    sys.exit(run_tool(main))
