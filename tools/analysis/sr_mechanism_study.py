"""The mechanism where tokens are many: NaLa-SR with its global slot computed by each kernel (issue 30, item 7).

For every kernel (``nala``, ``const_power``: no norm awareness, ``relu``, ``softmax``: PyTorch's SDPA) and seed
this trains the pico x2 network of ``configs/sr/nalasr-pico_1xb32-2k_photos-x2.py`` on the real-photo set
(``nalaformer.datasets.write_photo_datasets``; written on first use) with the project's ``tools/train.py``,
the global slot being the only thing that changes (``model.attn_types``), and tests it with ``tools/test.py``
on the four unseen photographs (PSNR / SSIM on Y, bicubic alongside). Then, on the trained weights and the
centre ``--measure-size`` x ``--measure-size`` crop of each unseen LR image (96: 9,216 tokens per image,
against the 64 of the classification study), ``nalaformer.analysis.mechanism.measure_global_slots`` takes the
q, k entering each residual group's global attention and measures the Spearman correlation between |q| and
attention entropy and the norm sweep (query directions fixed, norms 0.03 .. 30), as docs/mechanism_study.md.

Writes ``OUT.json`` (settings, every run, mean ± sample std per kernel, verdicts), ``OUT.md`` (the table,
verdicts and the exact command) and ``OUT.png``. Two kernels' PSNRs are a tie when their means differ by
less than the larger of their standard deviations (``nalaformer.analysis.mechanism.compare``). Resumable: a
finished run leaves ``WORK/<kernel>/seed<N>/result.json`` and is skipped next time (unless its settings
differ); an interrupted training resumes from its last checkpoint (every 500 iterations). ``--combine``
only re-reads finished runs and rewrites the outputs.

The study (the lead's run; the config's 2000 iterations, 3 seeds, 2 trainings side by side)::

    python3 tools/analysis/sr_mechanism_study.py --out docs/sr_mechanism_study

A pipeline check (the test's)::

    python3 tools/analysis/sr_mechanism_study.py --kernels nala relu --seeds 0 1 --iters 4 --measure-size 16 \\
        --work-dir /tmp/srm --out /tmp/srm/study
"""
import argparse
import functools
import json
import math
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, List, Optional, Sequence

import numpy as np
import torch
from mmengine.registry import MODELS
from PIL import Image

import nalaformer.engine  # noqa: F401  (registers SRModel)
from nalaformer.analysis.mechanism import compare, format_mean_std, measure_global_slots, summarise, sweep_norms
from nalaformer.analysis.results import save_figure
from nalaformer.analysis.study_runs import (
    add_run_args, read_result, run_side_by_side, start_run, write_report, write_result,
)
from nalaformer.checkpoint import Checkpoint, load_checkpoint_into
from nalaformer.datasets import write_photo_datasets
from nalaformer.datasets.super_resolution import TEST_SET
from nalaformer.engine.launch import load_config

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / 'configs' / 'sr' / 'nalasr-pico_1xb32-2k_photos-x2.py'
KERNELS = ('nala', 'const_power', 'relu', 'softmax')
METRICS = ('psnr', 'ssim', 'bicubic_psnr')
# settings that change a run's result: a finished run is reused only when all of them match
RUN_SETTINGS = ('iters', 'measure_size', 'sweep_queries')


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0], epilog=__doc__.split('\n', 1)[1],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--kernels', nargs='+', default=list(KERNELS), choices=KERNELS)
    parser.add_argument('--seeds', type=int, nargs='+', default=[0, 1, 2])
    parser.add_argument('--iters', type=int, default=2000, help="training iterations (the config's 2000); the lr "
                                                                 'is halved at 50 / 75 / 90%% of them')
    parser.add_argument('--threads', type=int, default=1, help='torch threads per training')
    parser.add_argument('--jobs', type=int, default=2, help='trainings run side by side')
    parser.add_argument('--measure-size', type=int, default=96, help='side of the LR crops whose q, k are measured')
    parser.add_argument('--sweep-queries', type=int, default=64, help='query directions per head in the sweep')
    parser.add_argument('--work-dir', type=Path, default=ROOT / 'work_dirs' / 'sr_mechanism_study')
    parser.add_argument('--data', type=Path, default=None, help='data root with DIV2K/ and benchmark/ '
                                                                '(default WORK/data; written on first use)')
    parser.add_argument('--out', type=Path, default=ROOT / 'docs' / 'sr_mechanism_study',
                        help='output prefix: OUT.json, OUT.md, OUT.png')
    add_run_args(parser)
    args = parser.parse_args(argv)
    args.data = args.data or args.work_dir / 'data'
    if args.iters < 1 or args.measure_size < 8:
        parser.error('--iters must be >= 1 and --measure-size >= 8')
    return args


def settings(args: argparse.Namespace) -> Dict:
    return {key: getattr(args, key) for key in RUN_SETTINGS}


def run_dir(args: argparse.Namespace, kernel: str, seed: int) -> Path:
    return args.work_dir / kernel / f'seed{seed}'


def prepare_data(args: argparse.Namespace) -> None:
    if not (args.data / 'DIV2K').is_dir() or not (args.data / 'benchmark' / TEST_SET).is_dir():
        write_photo_datasets(args.data, scales=[2])
        print(f'data: written to {args.data}', flush=True)


def cfg_options(args: argparse.Namespace, kernel: str, seed: int) -> List[str]:
    milestones = ','.join(str(args.iters * p // 100) for p in (50, 75, 90))
    return [f'train_dataloader.dataset.data_root={args.data.resolve()}',
            f'test_dataloader.dataset.data_root={args.data.resolve()}', f'model.attn_types={kernel}',
            f'randomness.seed={seed}', f'train_cfg.max_iters={args.iters}', f'train_cfg.val_interval={args.iters}',
            f'param_scheduler.0.milestones=[{milestones}]', f'default_hooks.checkpoint.interval={min(500, args.iters)}']


def run_tool(args: argparse.Namespace, tool: str, arguments: List[str], log: Path) -> None:
    env = {**os.environ, 'OMP_NUM_THREADS': str(args.threads), 'MKL_NUM_THREADS': str(args.threads),
           'PYTHONPATH': f'{ROOT}{os.pathsep}{os.environ.get("PYTHONPATH", "")}'}
    command = [sys.executable, str(ROOT / 'tools' / tool), *arguments]
    with log.open('a') as f:
        code = subprocess.run(command, cwd=ROOT, stdout=f, stderr=subprocess.STDOUT, env=env).returncode
    if code:
        raise SystemExit(f'{tool} failed (exit {code}): {shlex.join(command)}\n{log.read_text()[-4000:]}')


def measurement_crops(args: argparse.Namespace) -> torch.Tensor:
    """The centre crops of the unseen LR images, (B, 3, size, size) in [0, 1]."""
    crops = []
    for path in sorted((args.data / 'benchmark' / TEST_SET / 'LR_bicubic' / 'X2').glob('*.png')):
        image = np.asarray(Image.open(path).convert('RGB'))
        top, left = ((side - args.measure_size) // 2 for side in image.shape[:2])
        if min(top, left) < 0:
            raise SystemExit(f'--measure-size {args.measure_size} is larger than {path} ({image.shape[1]}x'
                             f'{image.shape[0]})')
        crops.append(image[top:top + args.measure_size, left:left + args.measure_size])
    return torch.from_numpy(np.stack(crops)).permute(0, 3, 1, 2).float() / 255


def measure(args: argparse.Namespace, kernel: str, checkpoint: Path) -> List[Dict]:
    cfg = load_config(str(CONFIG), {'model.attn_types': kernel})
    model = MODELS.build(cfg.model)
    load_checkpoint_into(model, Checkpoint.read(checkpoint))
    # chunks of 256 queries: (crops, heads, 256, N) scores at a time (~150 MB at N = 9,216)
    return measure_global_slots(model.model, measurement_crops(args), kernel, sweep_norms(), args.sweep_queries,
                                chunk=256)


def run_one(args: argparse.Namespace, kernel: str, seed: int) -> Dict:
    directory = run_dir(args, kernel, seed)
    result = None if args.retrain else read_result(directory)
    if result is not None and result.get('settings') == settings(args):
        return result
    start_run(directory, settings(args), args.retrain)
    options = cfg_options(args, kernel, seed)
    start = time.perf_counter()
    run_tool(args, 'train.py', [str(CONFIG), '--work-dir', str(directory), '--resume', '--cfg-options', *options],
             directory / 'train.log')
    seconds = time.perf_counter() - start
    checkpoint = directory / f'iter_{args.iters}.pth'
    metrics_file = directory / 'metrics.json'
    run_tool(args, 'test.py', [str(CONFIG), str(checkpoint), '--work-dir', str(directory / 'test'),
                               '--out-json', str(metrics_file), '--cfg-options', *options], directory / 'test.log')
    metrics = json.loads(metrics_file.read_text())
    start = time.perf_counter()
    groups = measure(args, kernel, checkpoint)
    result = dict(kernel=kernel, seed=seed, settings=settings(args), seconds=seconds,
                  measure_seconds=time.perf_counter() - start, psnr=metrics[f'{TEST_SET}/PSNR'],
                  ssim=metrics[f'{TEST_SET}/SSIM'], bicubic_psnr=metrics[f'{TEST_SET}/bicubic_PSNR'], stages=groups)
    write_result(directory, result)
    return result


def report_run(args: argparse.Namespace, start: float, job, i: int, total: int) -> Dict:
    kernel, seed = job
    result = run_one(args, kernel, seed)
    first = result['stages'][0]
    print(f"[{i}/{total}] {kernel:11s} seed {seed}: PSNR {result['psnr']:.3f} dB (bicubic {result['bicubic_psnr']:.3f})"
          f"  Spearman g1 {first['spearman'] if first['spearman'] is not None else math.nan:+.3f}  sweep ΔH g1 "
          f"{first['sweep_change']:+.3f}  [{(time.perf_counter() - start) / 60:.1f} min]", flush=True)
    return result


def collect(args: argparse.Namespace, runs: List[Dict], command: str) -> Dict:
    cells = {kernel: summarise([r for r in runs if r['kernel'] == kernel], METRICS)
             for kernel in args.kernels if any(r['kernel'] == kernel for r in runs)}
    pairs = []  # every kernel vs nala, then vs softmax
    for b in ('nala', 'softmax'):
        pairs += [(a, b) for a in cells if b in cells and a != b and (b, a) not in pairs]
    verdicts = [dict(a=a, b=b, diff=cells[a]['psnr']['mean'] - cells[b]['psnr']['mean'],
                     spread=max(cells[a]['psnr']['std'], cells[b]['psnr']['std']),
                     verdict=compare(cells[a]['psnr'], cells[b]['psnr'])) for a, b in pairs]
    text = (f"pico NaLa-SR x2 (24 channels, 2 groups of 1 layer, 2 heads, 8x8 windows), global slot = each kernel, "
            f"{args.iters} iterations of 32 crops of 32x32 HR pixels on the mate-backgrounds photographs; PSNR / SSIM "
            f"(Y, border 2) on the 4 unseen photographs of {TEST_SET}; q, k of each group's global attention on the "
            f"centre {args.measure_size}x{args.measure_size} crop of each unseen LR image "
            f"({args.measure_size ** 2} tokens); mean ± sample std over seeds")
    return dict(command=command, settings=settings(args), settings_text=text, kernels=list(cells), seeds=args.seeds,
                sweep_norms=sweep_norms().tolist(), tie_rule='tie when |mean a - mean b| < max(std a, std b)',
                cells=cells, verdicts=verdicts, runs=runs)


def markdown(report: Dict) -> str:
    cells = report['cells']
    groups = next(iter(cells.values()))['stages']
    lines = ['# The mechanism where tokens are many: NaLa-SR with each kernel in the global slot', '',
             f"Written by `{report['command']}` (`tools/analysis/sr_mechanism_study.py`; method: its docstring and "
             f"docs/mechanism_study.md).", '', f"Settings: {report['settings_text']}", '']
    header = ['kernel', 'seeds', 'PSNR-Y (dB)', 'SSIM-Y', 'bicubic PSNR'] + \
             [f"Spearman(\\|q\\|, H) group {g['stage'] + 1}" for g in groups] + \
             ['sweep ΔH group 1 (nats)', 'sweep max \\|ΔH\\| group 1']
    lines += ['| ' + ' | '.join(header) + ' |', '|' + '---|' * len(header)]
    for kernel, cell in cells.items():
        first = cell['stages'][0]
        row = [kernel, str(len(cell['seeds'])), format_mean_std(cell['psnr'], 3), format_mean_std(cell['ssim'], 4),
               format_mean_std(cell['bicubic_psnr'], 3)]
        row += [format_mean_std(g['spearman'], signed=True) for g in cell['stages']]
        row += [format_mean_std(first['sweep_change'], 3, signed=True),
                f"{first['sweep_max_abs_change']['mean']:.1e}" if first['sweep_max_abs_change']['mean'] is not None
                else '–']
        lines.append('| ' + ' | '.join(row) + ' |')
    lines += ['', 'PSNR verdicts (tie: |difference| < the larger standard deviation; n/a: fewer than 2 seeds):', '',
              '| a | b | a − b (dB) | larger std | verdict |', '|---|---|---|---|---|']
    for v in report['verdicts']:
        lines.append(f"| {v['a']} | {v['b']} | {v['diff']:+.3f} | {v['spread']:.3f} | {v['verdict']} |")
    return '\n'.join(lines) + '\n'


def plot(report: Dict, path: Path) -> None:
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt

    cells, kernels = report['cells'], list(report['cells'])
    x = range(len(kernels))
    fig, axes = plt.subplots(1, 3, figsize=(15, 4))
    psnr = [cells[k]['psnr'] for k in kernels]
    axes[0].errorbar(x, [p['mean'] for p in psnr], yerr=[p['std'] for p in psnr], fmt='o', capsize=4)
    for run in report['runs']:
        axes[0].plot(kernels.index(run['kernel']) + 0.12, run['psnr'], '.', color='gray', ms=4)
    axes[0].axhline(cells[kernels[0]]['bicubic_psnr']['mean'], color='gray', ls='--', lw=1, label='bicubic')
    axes[0].set_xticks(list(x), kernels)
    axes[0].set_ylabel(f'PSNR-Y on {TEST_SET} (dB)')
    axes[0].set_title('PSNR, mean ± std over seeds (gray: seeds)', fontsize=10)
    axes[0].legend(fontsize=8)
    groups = [g['stage'] for g in cells[kernels[0]]['stages']]
    width = 0.8 / len(groups)
    for j, group in enumerate(groups):
        stats = [cells[k]['stages'][group]['spearman'] for k in kernels]
        axes[1].bar([i + (j - (len(groups) - 1) / 2) * width for i in x],
                    [s['mean'] if s['mean'] is not None else math.nan for s in stats], width,
                    yerr=[s['std'] or 0 for s in stats], capsize=2, label=f'group {group + 1}')
    axes[1].axhline(0, color='gray', lw=1)
    axes[1].set_xticks(list(x), kernels)
    axes[1].set_ylabel('Spearman(|q|, entropy)')
    axes[1].set_title('trained q, k of the global slot', fontsize=10)
    axes[1].legend(fontsize=8)
    for kernel in kernels:
        axes[2].plot(report['sweep_norms'], cells[kernel]['stages'][0]['sweep_mean_entropy'], label=kernel)
    axes[2].axhline(math.log(cells[kernels[0]]['stages'][0]['tokens']), color='gray', ls='--', lw=1)
    axes[2].set_xscale('log')
    axes[2].set_xlabel('query norm (directions fixed)')
    axes[2].set_ylabel('mean entropy (nats)')
    axes[2].set_title('norm sweep, group 1 (dashed: log N)', fontsize=10)
    axes[2].legend(fontsize=8)
    save_figure(fig, path)


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_args(argv)
    command = shlex.join(['python3', 'tools/analysis/sr_mechanism_study.py', *(sys.argv[1:] if argv is None else argv)])
    jobs = [(kernel, seed) for kernel in args.kernels for seed in args.seeds]
    if args.combine:
        runs = []
        for kernel, seed in jobs:
            result = read_result(run_dir(args, kernel, seed))
            if result and result.get('settings') == settings(args):
                runs.append(result)
    else:
        prepare_data(args)
        torch.set_num_threads(args.threads)  # the measurements in this process, beside the trainings
        start = time.perf_counter()
        runs = run_side_by_side(functools.partial(report_run, args, start), jobs, args.jobs)
    if not runs:
        raise SystemExit(f'no finished runs under {args.work_dir}')
    report = collect(args, runs, command)
    write_report(args.out, report, markdown(report), Path.write_text, plot)
    return 0


if __name__ == '__main__':
    sys.exit(main())
