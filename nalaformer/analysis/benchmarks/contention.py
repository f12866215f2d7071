"""CPU training on a busy machine: the quick start's training idle and beside one busy process (started and stopped
here), with torch's default threads (one per core) and with the thread policy of nalaformer/threads.py.

Each cell trains the quick start's config with ``tools/train.py`` for ``--epochs`` epochs and reads the per-iteration
times mmengine logs; ``--whole`` also times the whole ``tools/quick_start.py``, idle and loaded. Example::

    python3 tools/analysis/benchmark.py contention --data data/fashion-mnist --epochs 1 \\
        --out-json docs/contention_cpu.json --whole
"""
import argparse
import contextlib
import itertools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable, Dict, List, Optional, Tuple

from ...errors import ConfigError
from ..machine import CHECKOUT, ProcessFailed, busy_process, child_environment, load_average
from ..results import write_json
from .common import add_keep_going_arg, attempt_row

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


def run_script(script: str, arguments: List[str], what: str) -> Tuple[str, float]:
    """``tools/<script>`` from the repository root with no inherited thread setting: its stdout and wall time (s);
    :class:`ProcessFailed` if it fails."""
    start = time.perf_counter()
    result = subprocess.run([sys.executable, str(CHECKOUT / 'tools' / script), *arguments], cwd=CHECKOUT,
                            env=child_environment(THREAD_VARIABLES), capture_output=True, text=True)
    if result.returncode:
        raise ProcessFailed(what, result)
    return result.stdout, time.perf_counter() - start


def train_cell(data: Path, epochs: int, threads: Optional[int]) -> Dict:
    """One training run; per-iteration seconds as mmengine logs them, wall time, and the thread line."""
    with tempfile.TemporaryDirectory() as work:
        roots = [f'{d}.dataset.data_root={data}' for d in ('train_dataloader', 'val_dataloader', 'test_dataloader')]
        options = ['--threads', str(threads)] if threads else []
        options += ['--cfg-options', *roots, f'train_cfg.max_epochs={epochs}', 'default_hooks.logger.interval=10']
        stdout, wall = run_script('train.py', [str(CONFIG), '--work-dir', work, *options], 'training')
        [scalars] = Path(work).glob('*/vis_data/scalars.json')
        times = [row['time'] for row in map(json.loads, scalars.read_text().splitlines()) if 'time' in row]
    policy = next((line.split(' - ')[-1] for line in stdout.splitlines() if 'CPU threads:' in line), '')
    return dict(status='ok', iter_s=statistics.median(times[1:] or times), wall_s=wall, threads=policy)


def quick_start_cell(data: Path) -> Dict:
    with tempfile.TemporaryDirectory() as work:
        return dict(status='ok', wall_s=run_script('quick_start.py', ['--work-dir', work, '--data', str(data)],
                                                 'quick start')[1])


def cell(loaded: bool, measure: Callable[[], Dict], keep_going: bool, what: str) -> Dict:
    """``measure()``, beside one busy background process when ``loaded``; a failure recorded as by
    :func:`attempt_row`."""
    def run() -> Dict:
        with busy_process() if loaded else contextlib.nullcontext():
            return measure()
    return attempt_row(run, keep_going, what)


def main(args: argparse.Namespace) -> int:
    if not (args.data / 'train').is_dir():
        raise ConfigError(f'{args.data}/train does not exist: run python3 tools/quick_start.py once '
                          f'(it writes the data)')
    cores = len(os.sched_getaffinity(0))
    results = dict(cores=cores, epochs=args.epochs, load=load_average(), cells=[])
    for loaded, (policy, threads) in itertools.product((False, True), zip(POLICIES, (cores, None))):
        load = 'one busy process' if loaded else 'idle'
        row = cell(loaded, lambda: train_cell(args.data, args.epochs, threads), args.keep_going,
                   f'training, {load}, {policy}')
        results['cells'].append({**row, 'loaded': loaded, 'policy': policy})
        print(f'{load:>16} | {policy:>13} | ' + (
            f"{row['iter_s'] * 1e3:7.0f} ms/iter | {row['wall_s']:6.0f} s | {row['threads']}"
            if row['status'] == 'ok' else f"{row['status']}: {row['error']}"), flush=True)
    for idle, busy in zip(results['cells'][:len(POLICIES)], results['cells'][len(POLICIES):]):
        if idle['status'] == busy['status'] == 'ok':
            print(f"{idle['policy']}: loaded / idle time per iteration = {busy['iter_s'] / idle['iter_s']:.2f}x")
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
