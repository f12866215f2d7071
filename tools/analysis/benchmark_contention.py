"""CPU training on a busy machine: the quick start's training with the machine idle and with one other busy
process, with torch's default threads (one per core: the behaviour before the thread policy) and with the
thread policy of nalaformer/threads.py. The tool starts and stops the background load itself.

    python tools/analysis/benchmark_contention.py --data data/fashion-mnist --epochs 1 \
        --out-json docs/contention_cpu.json [--whole]

Each cell runs ``tools/train.py`` on the quick start's config (configs/nalaformer/
nalaformer-pico_1xb64-10e_fashion-mnist-32px.py) for ``--epochs`` epochs in a fresh work dir and reads the
per-iteration times mmengine logs; ``--whole`` also times the whole ``tools/quick_start.py`` (policy on)
idle and loaded. The data folder is the quick start's (``python tools/quick_start.py`` writes it).
Nothing else should run meanwhile: the point is the one background process this tool starts.
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

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / 'configs' / 'nalaformer' / 'nalaformer-pico_1xb64-10e_fashion-mnist-32px.py'
BUSY = 'while True: pass'


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--data', type=Path, default=ROOT / 'data' / 'fashion-mnist',
                        help='the quick start\'s ImageFolder copy of Fashion-MNIST')
    parser.add_argument('--epochs', type=int, default=1, help='training epochs per cell')
    parser.add_argument('--whole', action='store_true', help='also time the whole quick start, idle and loaded')
    parser.add_argument('--out-json', type=Path, default=None)
    return parser.parse_args(argv)


def environment() -> dict:
    """The environment of a tool started by this benchmark: no thread setting inherited from the caller."""
    return {k: v for k, v in os.environ.items() if k not in ('OMP_NUM_THREADS', 'MKL_NUM_THREADS')}


def train_cell(data: Path, epochs: int, threads) -> dict:
    """One training run; per-iteration seconds as mmengine logs them, wall time, and the thread line."""
    with tempfile.TemporaryDirectory() as work:
        roots = [f'{d}.dataset.data_root={data}' for d in ('train_dataloader', 'val_dataloader', 'test_dataloader')]
        command = [sys.executable, str(ROOT / 'tools' / 'train.py'), str(CONFIG), '--work-dir', work,
                   *(['--threads', str(threads)] if threads else []), '--cfg-options', *roots,
                   f'train_cfg.max_epochs={epochs}', 'default_hooks.logger.interval=10']
        start = time.perf_counter()
        result = subprocess.run(command, cwd=ROOT, env=environment(), capture_output=True, text=True)
        wall = time.perf_counter() - start
        if result.returncode:
            raise RuntimeError(f'training failed ({result.returncode}):\n{result.stderr[-3000:]}')
        [scalars] = Path(work).glob('*/vis_data/scalars.json')
        times = [row['time'] for row in map(json.loads, scalars.read_text().splitlines()) if 'time' in row]
        policy = next((line.split(' - ')[-1] for line in result.stdout.splitlines() if 'CPU threads:' in line), '')
    return dict(iter_s=statistics.median(times[1:] or times), wall_s=wall, threads=policy)


def quick_start_cell(data: Path) -> dict:
    with tempfile.TemporaryDirectory() as work:
        start = time.perf_counter()
        result = subprocess.run([sys.executable, str(ROOT / 'tools' / 'quick_start.py'), '--work-dir', work,
                                 '--data', str(data)], cwd=ROOT, env=environment(), capture_output=True, text=True)
        if result.returncode:
            raise RuntimeError(f'quick start failed ({result.returncode}):\n{result.stderr[-3000:]}')
        return dict(wall_s=time.perf_counter() - start)


def with_load(loaded: bool, run):
    """``run()`` with one busy background process (a Python loop) when ``loaded``."""
    if not loaded:
        return run()
    busy = subprocess.Popen([sys.executable, '-c', BUSY])
    try:
        time.sleep(1.0)
        return run()
    finally:
        busy.kill()
        busy.wait()


def main(argv=None) -> int:
    args = parse_args(argv)
    if not (args.data / 'train').is_dir():
        print(f'error: {args.data}/train does not exist: run python tools/quick_start.py once (it writes the data)',
              file=sys.stderr)
        return 2
    cores = len(os.sched_getaffinity(0))
    results = dict(cores=cores, epochs=args.epochs, load=os.getloadavg(), cells=[])
    for loaded in (False, True):
        for policy, threads in (('torch default', cores), ('thread policy', None)):
            cell = with_load(loaded, lambda: train_cell(args.data, args.epochs, threads))
            cell.update(loaded=loaded, policy=policy)
            results['cells'].append(cell)
            print(f'{"one busy process" if loaded else "idle":>16} | {policy:>13} | {cell["iter_s"] * 1e3:7.0f} ms/iter '
                  f'| {cell["wall_s"]:6.0f} s | {cell["threads"]}', flush=True)
    for policy in ('torch default', 'thread policy'):
        idle, busy = (next(c for c in results['cells'] if c['policy'] == policy and c['loaded'] == lo)
                      for lo in (False, True))
        print(f'{policy}: loaded / idle time per iteration = {busy["iter_s"] / idle["iter_s"]:.2f}x')
    if args.whole:
        results['quick_start'] = {('loaded' if lo else 'idle'): with_load(lo, lambda: quick_start_cell(args.data))
                                  for lo in (False, True)}
        for key, cell in results['quick_start'].items():
            print(f'whole quick start, {key}: {cell["wall_s"] / 60:.1f} min')
    results['load_after'] = os.getloadavg()
    if args.out_json:
        args.out_json.parent.mkdir(parents=True, exist_ok=True)
        args.out_json.write_text(json.dumps(results, indent=1))
    return 0


if __name__ == '__main__':
    sys.exit(main())
