"""CPU training on a busy machine: the quick start's training with the machine idle and with one other busy
process, with torch's default threads (one per core: the behaviour before the thread policy) and with the
thread policy of nalaformer/threads.py. The tool starts and stops the background load itself.

    python3 tools/analysis/benchmark_contention.py --data data/fashion-mnist --epochs 1 \
        --out-json docs/contention_cpu.json [--whole]

Each cell runs ``tools/train.py`` on the quick start's config (configs/nalaformer/
nalaformer-pico_1xb64-10e_fashion-mnist-32px.py) for ``--epochs`` epochs in a fresh work dir and reads the
per-iteration times mmengine logs; ``--whole`` also times the whole ``tools/quick_start.py`` (policy on)
idle and loaded. The data folder is the quick start's (``python3 tools/quick_start.py`` writes it).
Nothing else should run meanwhile: the point is the one background process this tool starts. A cell that fails
stops the benchmark with the tool's error; with ``--keep-going`` it records the error and the others go on.
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
from typing import Callable, Dict, Union

from nalaformer.analysis.machine import ProcessFailed, busy_process, child_environment, load_average
from nalaformer.analysis.results import Failure, add_keep_going_arg, attempt, write_json
from nalaformer.errors import ConfigError, run_tool

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / 'configs' / 'nalaformer' / 'nalaformer-pico_1xb64-10e_fashion-mnist-32px.py'
# A tool started by this benchmark inherits no thread setting from the caller.
THREAD_VARIABLES = ('OMP_NUM_THREADS', 'MKL_NUM_THREADS')


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--data', type=Path, default=ROOT / 'data' / 'fashion-mnist',
                        help='the quick start\'s ImageFolder copy of Fashion-MNIST')
    parser.add_argument('--epochs', type=int, default=1, help='training epochs per cell')
    parser.add_argument('--whole', action='store_true', help='also time the whole quick start, idle and loaded')
    add_keep_going_arg(parser)
    parser.add_argument('--out-json', type=Path, default=None)
    return parser.parse_args(argv)


def run_child(command, what: str) -> subprocess.CompletedProcess:
    """``command`` from the repository root with no inherited thread setting; :class:`ProcessFailed` if it fails."""
    result = subprocess.run(command, cwd=ROOT, env=child_environment(THREAD_VARIABLES), capture_output=True,
                            text=True)
    if result.returncode:
        raise ProcessFailed(what, result)
    return result


def train_cell(data: Path, epochs: int, threads) -> dict:
    """One training run; per-iteration seconds as mmengine logs them, wall time, and the thread line."""
    with tempfile.TemporaryDirectory() as work:
        roots = [f'{d}.dataset.data_root={data}' for d in ('train_dataloader', 'val_dataloader', 'test_dataloader')]
        command = [sys.executable, str(ROOT / 'tools' / 'train.py'), str(CONFIG), '--work-dir', work,
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
        run_child([sys.executable, str(ROOT / 'tools' / 'quick_start.py'), '--work-dir', work,
                          '--data', str(data)], 'quick start')
        return dict(status='ok', wall_s=time.perf_counter() - start)


def cell(loaded: bool, measure: Callable[[], Dict], keep_going: bool, what: str) -> Dict:
    """``measure()`` with one busy background process when ``loaded``; its failure raised, or recorded with
    ``keep_going``."""
    def run() -> Dict:
        if not loaded:
            return measure()
        with busy_process():
            return measure()
    result: Union[Dict, Failure] = attempt(run, keep_going, what)
    return result.as_row() if isinstance(result, Failure) else result


def main(argv=None) -> int:
    args = parse_args(argv)
    if not (args.data / 'train').is_dir():
        raise ConfigError(f'{args.data}/train does not exist: run python3 tools/quick_start.py once '
                          f'(it writes the data)')
    cores = len(os.sched_getaffinity(0))
    results = dict(cores=cores, epochs=args.epochs, load=load_average(), cells=[])
    for loaded in (False, True):
        load = 'one busy process' if loaded else 'idle'
        for policy, threads in (('torch default', cores), ('thread policy', None)):
            row = cell(loaded, lambda: train_cell(args.data, args.epochs, threads), args.keep_going,
                       f'training, {load}, {policy}')
            row.update(loaded=loaded, policy=policy)
            results['cells'].append(row)
            if row['status'] != 'ok':
                print(f'{load:>16} | {policy:>13} | {row["status"]}: {row["error"]}', flush=True)
                continue
            print(f'{load:>16} | {policy:>13} | {row["iter_s"] * 1e3:7.0f} ms/iter '
                  f'| {row["wall_s"]:6.0f} s | {row["threads"]}', flush=True)
    for policy in ('torch default', 'thread policy'):
        idle, busy = (next(c for c in results['cells'] if c['policy'] == policy and c['loaded'] == lo)
                      for lo in (False, True))
        if idle['status'] == busy['status'] == 'ok':
            print(f'{policy}: loaded / idle time per iteration = {busy["iter_s"] / idle["iter_s"]:.2f}x')
    if args.whole:
        results['quick_start'] = {
            ('loaded' if lo else 'idle'): cell(lo, lambda: quick_start_cell(args.data), args.keep_going,
                                               f"quick start, {'loaded' if lo else 'idle'}")
            for lo in (False, True)}
        for key, row in results['quick_start'].items():
            print(f'whole quick start, {key}: ' + (f'{row["wall_s"] / 60:.1f} min' if row['status'] == 'ok' else
                                                   f'{row["status"]}: {row["error"]}'))
    results['load_after'] = load_average()
    if args.out_json:
        write_json(args.out_json, results)
    return 0


if __name__ == '__main__':
    sys.exit(run_tool(main))
