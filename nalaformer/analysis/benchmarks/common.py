"""What the benchmark subcommands share: their options, the device they run on, the facts about the machine and
the libraries every report's ``meta`` starts with, and rows that record their failure."""
import argparse
import time
from typing import Callable, Dict, Optional, Sequence

import timm
import torch

from ...errors import ConfigError
from ..machine import device_name, load_average
from ..results import Failure, attempt
from ..steps import AMP_DTYPES

__all__ = ['add_amp_arg', 'add_device_arg', 'add_keep_going_arg', 'add_mmap_arg', 'add_timing_args', 'attempt_row',
           'attention_call', 'check_device', 'finish_meta', 'mmap_setting', 'start_meta']


def add_device_arg(parser: argparse.ArgumentParser, default: Optional[str] = None):
    parser.add_argument('--device', choices=('cpu', 'cuda'),
                        default=default or ('cuda' if torch.cuda.is_available() else 'cpu'))


def add_amp_arg(parser: argparse.ArgumentParser, several: bool = False):
    what = 'autocast dtypes, each a separate set of runs' if several else 'autocast dtype of forward and loss'
    parser.add_argument('--amp', nargs='+' if several else None, default=['none'] if several else 'none',
                        choices=tuple(AMP_DTYPES), help=f'{what} (fp16 training adds a GradScaler)')


def add_timing_args(parser: argparse.ArgumentParser, warmup: int, repeats: Optional[int],
                    threads: Optional[int] = None):
    parser.add_argument('--threads', type=int, default=threads,
                        help='CPU threads' + ('' if threads else ' (default: torch default)'))
    parser.add_argument('--warmup', type=int, default=warmup, help='untimed iterations before timing')
    parser.add_argument('--repeats', type=int, default=repeats, help='timed rounds, each running every method once')


def add_mmap_arg(parser: argparse.ArgumentParser, default: Optional[int] = None):
    parser.add_argument('--memory-mmap-threshold', type=int, default=default, metavar='BYTES',
                        help='memory workers map every allocation over BYTES fresh (MALLOC_MMAP_THRESHOLD_: no dynamic '
                             'glibc threshold, so peak RSS follows live tensors; 0 or none: glibc defaults)')


def add_keep_going_arg(parser: argparse.ArgumentParser):
    parser.add_argument('--keep-going', action='store_true',
                        help='record the error of a failing row and go on (default: stop with the error)')


def mmap_setting(threshold: Optional[int]) -> str:
    """How memory workers' glibc maps allocations, for a report."""
    return f'MALLOC_MMAP_THRESHOLD_={threshold}' if threshold else 'glibc defaults'


def check_device(name: str) -> torch.device:
    """The device ``name``; a user error where it is CUDA and none is available."""
    if name == 'cuda' and not torch.cuda.is_available():
        raise ConfigError('--device cuda: no CUDA device is available')
    return torch.device(name)


def start_meta(device: torch.device, args: argparse.Namespace, **fields) -> Dict:
    """A report's ``meta``: the device, threads, timing rounds and library versions, the time and load at start."""
    if getattr(args, 'threads', None):
        torch.set_num_threads(args.threads)
    return dict(device=device.type, device_name=device_name(device), threads=torch.get_num_threads(),
                warmup=args.warmup, repeats=args.repeats, torch=torch.__version__, timm=timm.__version__, **fields,
                started=time.strftime('%Y-%m-%d %H:%M:%S'), load_at_start=load_average())


def finish_meta(meta: Dict, finished: bool = True) -> Dict:
    meta.update(finished=time.strftime('%Y-%m-%d %H:%M:%S') if finished else None, load_at_end=load_average())
    return meta


def attempt_row(fn: Callable[[], Dict], keep_going: bool, what: str) -> Dict:
    """The row ``fn()`` returns, or that of its failure (status and error; see :func:`attempt`)."""
    result = attempt(fn, keep_going, what)
    return result.as_row() if isinstance(result, Failure) else result


def attention_call(attention: Callable, inputs: Sequence[torch.Tensor], mode: str,
                   dout: Optional[torch.Tensor] = None) -> torch.Tensor:
    """``attention(*inputs)``: 'forward' under inference_mode, 'forward_backward' also the grads of the first three
    inputs (q, k, v, which need grad) for the output's grad ``dout``."""
    if mode == 'forward':
        with torch.inference_mode():
            return attention(*inputs)
    out = attention(*inputs)
    torch.autograd.grad(out, inputs[:3], dout)
    return out
