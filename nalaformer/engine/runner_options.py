"""The command-line options tools/train.py and tools/test.py share: CPU threads, compilation, config overrides,
launcher."""
import argparse

from mmengine.config import DictAction

__all__ = ['add_runner_options']


def add_runner_options(parser: argparse.ArgumentParser) -> None:
    """``--threads`` (for :func:`nalaformer.engine.launch.apply_thread_policy`), ``--compile``, ``--cfg-options``,
    ``--launcher`` and ``--local-rank``."""
    parser.add_argument('--threads', type=int, metavar='N',
                        help="CPU threads (default: the config's env_cfg.threads, else the cores that other "
                             "processes leave free; OMP_NUM_THREADS wins over both)")
    parser.add_argument('--compile', action='store_true',
                        help="torch.compile the network (the config's compile = True, mmengine's setting): slower "
                             'start while it compiles, faster iterations after')
    parser.add_argument('--cfg-options', nargs='+', action=DictAction, help='override config keys: key=value ...')
    parser.add_argument('--launcher', choices=['none', 'pytorch', 'slurm', 'mpi'], default='none')
    parser.add_argument('--local-rank', '--local_rank', type=int, default=0)
