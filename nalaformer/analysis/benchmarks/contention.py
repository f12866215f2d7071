"""CPU training on a busy machine: the quick start's training idle and beside one busy process (started and stopped
here), with torch's default threads (one per core) and with the thread policy of nalaformer/threads.py.

Each cell trains the quick start's config with ``tools/train.py`` for ``--epochs`` epochs and reads the per-iteration
times mmengine logs; ``--whole`` also times the whole ``tools/quick_start.py``, idle and loaded. Example::

    python3 tools/analysis/benchmark.py contention --data data/fashion-mnist --epochs 1 \\
        --out-json docs/contention_cpu.json --whole
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable, Dict

from ...errors import ConfigError
from ..machine import CHECKOUT, ProcessFailed, busy_process, child_environment, load_average
from ..results import Failure, attempt, write_json
from .common import add_keep_going_arg

CONFIG = CHECKOUT / 'configs' / 'nalaformer' / 'nalaformer-pico_1xb64-10e_fashion-mnist-32px.py'
# A tool started by this benchmark inherits no thread setting from the caller.
THREAD_VARIABLES = ('OMP_NUM_THREADS', 'MKL_NUM_THREADS')
POLICIES = ('torch default', 'thread policy')


def add_arguments(parser: argparse.ArgumentParser):
    parser.add_argument('--data', type=Path, default=CHECKOUT / 'data' / 'fashion-mnist',
                        help="the quick start's ImageFolder copy of Fashion-MNIST")
    parser.add_argument('--epochs', type=int, default=1, help='training epochs per cell')
    parser.add_argument('--whole', action='store_true', help='also time the whole quick start, idle and loaded')
    add_keep_going_arg(parser)
    parser.add_argument('--out-json', type=Path, default=None)


def run_child(command, what: str) -> subprocess.CompletedProcess:
    """``command`` from the repository root with no inherited thread setting; :class:`ProcessFailed` if it fails."""
    result = subprocess.run(command, cwd=CHECKOUT, env=child_environment(THREAD_VARIABLES), capture_output=True,
                            text=True)
    if result.returncode:
        raise ProcessFailed(what, result)
    return result


def train_cell(data: Path, epochs: int, threads) -> dict:
    """One training run; per-iteration seconds as mmengine logs them, wall time, and the thread line."""
    with tempfile.TemporaryDirectory() as work:
        roots = [f'{d}.dataset.data_root={data}' for d in ('train_dataloader', 'val_dataloader', 'test_dataloader')]
        command = [sys.executable, str(CHECKOUT / 'tools' / 'train.py'), str(CONFIG), '--work-dir', work,
                   *(['--threads', str(threads)] if threads else []), '--cfg-options', *roots,
                   f'train_cfg.max_epochs={epochs}', 'default_hooks.logger.interval=10']
        start = time.perf_counter()
        result = run_child(command, 'training')
        wall = time.perf_counter() - start
        [scalars] = Path(work).glob('*/vis_data/scalars.json')
        times = [row['time'] for row in map(json.loads, scalars.read_text().splitlines()) if 'time' in row]
        policy = next((line.split(' - ')[-1] for line in result.stdout.splitlines() if 'CPU threads:' in line), '')
    return dict(status='ok', iter_s=statistics.median(times[1:] or times), wall_s=wall, threads=policy)


def quick_start_cell(data: Path) -> dict:
    with tempfile.TemporaryDirectory() as work:
        start = time.perf_counter()
        run_child([sys.executable, str(CHECKOUT / 'tools' / 'quick_start.py'), '--work-dir', work, '--data', str(data)],
                  'quick start')
        return dict(status='ok', wall_s=time.perf_counter() - start)


def cell(loaded: bool, measure: Callable[[], Dict], keep_going: bool, what: str) -> Dict:
    """``measure()`` with one busy background process when ``loaded``; its failure raised, or recorded with
    ``keep_going``."""
    def run() -> Dict:
        if not loaded:
            return measure()
        with busy_process():
            return measure()
    result = attempt(run, keep_going, what)
    return result.as_row() if isinstance(result, Failure) else result


def main(args: argparse.Namespace) -> int:
    if not (args.data / 'train').is_dir():
        raise ConfigError(f'{args.data}/train does not exist: run python3 tools/quick_start.py once '
                          f'(it writes the data)')
    cores = len(os.sched_getaffinity(0))
    results = dict(cores=cores, epochs=args.epochs, load=load_average(), cells=[])
    for loaded in (False, True):
        load = 'one busy process' if loaded else 'idle'
        for policy, threads in zip(POLICIES, (cores, None)):
            row = cell(loaded, lambda: train_cell(args.data, args.epochs, threads), args.keep_going,
                       f'training, {load}, {policy}')
            results['cells'].append({**row, 'loaded': loaded, 'policy': policy})
            print(f'{load:>16} | {policy:>13} | ' + (
                f"{row['iter_s'] * 1e3:7.0f} ms/iter | {row['wall_s']:6.0f} s | {row['threads']}"
                if row['status'] == 'ok' else f"{row['status']}: {row['error']}"), flush=True)
    for policy in POLICIES:
        idle, busy = (next(c for c in results['cells'] if c['policy'] == policy and c['loaded'] == lo)
                      for lo in (False, True))
        if idle['status'] == busy['status'] == 'ok':
            print(f'{policy}: loaded / idle time per iteration = {busy["iter_s"] / idle["iter_s"]:.2f}x')
    if args.whole:
        results['quick_start'] = {key: cell(loaded, lambda: quick_start_cell(args.data), args.keep_going,
                                            f'quick start, {key}')
                                  for loaded, key in ((False, 'idle'), (True, 'loaded'))}
        for key, row in results['quick_start'].items():
            print(f'whole quick start, {key}: ' + (f"{row['wall_s'] / 60:.1f} min" if row['status'] == 'ok' else
                                                   f"{row['status']}: {row['error']}"))
    results['load_after'] = load_average()
    if args.out_json:
        write_json(args.out_json, results)
    return 0
