"""The mechanism where tokens are many: NaLa-SR with its global attention computed by each attn_type (issue 30).

For every attn_type and seed: trains the pico x2 network on the real-photo set with ``tools/train.py``, tests it with
``tools/test.py`` (PSNR / SSIM on Y, bicubic alongside), and measures each residual group's global attention on the
centre ``--measure-size`` crop of each unseen LR image (docs/sr_mechanism_study.md; a pipeline check: ``--iters 4
--measure-size 16``)::

    python3 tools/analysis/study.py sr --out docs/sr_mechanism_study
"""
import argparse
import functools
import json
import time
from pathlib import Path
from typing import Dict, List

import numpy as np
import torch
from PIL import Image

from ...checkpoint import Checkpoint, load_checkpoint_into
from ...datasets import write_photo_datasets
from ...datasets.super_resolution import TEST_SET
from ...errors import ConfigError
from ..mechanism import format_mean_std, measure_global_slots, summarise_kernels, sweep_norms, verdict
from ..machine import CHECKOUT
from .runs import (
    add_study_args, mechanism_table, plot_study, run_jobs, run_tool, study_markdown, study_report, write_report,
)

CONFIG = CHECKOUT / 'configs' / 'sr' / 'nalasr-pico_1xb32-2k_photos-x2.py'
ATTN_TYPES = ('nala', 'const_power', 'relu', 'softmax')
METRICS = ('psnr', 'ssim', 'bicubic_psnr')
# settings that change a run's result: a finished run is reused only when all of them match
RUN_SETTINGS = ('iters', 'measure_size', 'sweep_queries')


def add_arguments(parser: argparse.ArgumentParser):
    add_study_args(parser, ATTN_TYPES, (0, 1, 2), 'sr_mechanism_study')
    parser.add_argument('--iters', type=int, default=2000, help="training iterations (the config's 2000); the lr "
                                                                 'is halved at 50 / 75 / 90%% of them')
    parser.add_argument('--measure-size', type=int, default=96, help='side of the LR crops whose q, k are measured')
    parser.add_argument('--data', type=Path, default=None, help='data root with DIV2K/ and benchmark/ '
                                                                '(default WORK/data; written on first use)')


def cfg_options(args: argparse.Namespace, attn_type: str, seed: int) -> List[str]:
    milestones = ','.join(str(args.iters * p // 100) for p in (50, 75, 90))
    return [f'train_dataloader.dataset.data_root={args.data.resolve()}',
            f'test_dataloader.dataset.data_root={args.data.resolve()}', f'model.attn_types={attn_type}',
            f'randomness.seed={seed}', f'train_cfg.max_iters={args.iters}', f'train_cfg.val_interval={args.iters}',
            f'param_scheduler.0.milestones=[{milestones}]', f'default_hooks.checkpoint.interval={min(500, args.iters)}']


def measurement_crops(args: argparse.Namespace) -> torch.Tensor:
    """The centre crops of the unseen LR images, (B, 3, size, size) in [0, 1]."""
    crops = []
    for path in sorted((args.data / 'benchmark' / TEST_SET / 'LR_bicubic' / 'X2').glob('*.png')):
        image = np.asarray(Image.open(path).convert('RGB'))
        top, left = ((side - args.measure_size) // 2 for side in image.shape[:2])
        if min(top, left) < 0:
            raise ConfigError(f'--measure-size {args.measure_size} is larger than {path} ({image.shape[1]}x'
                              f'{image.shape[0]})')
        crops.append(image[top:top + args.measure_size, left:left + args.measure_size])
    return torch.from_numpy(np.stack(crops)).permute(0, 3, 1, 2).float() / 255


def measure(args: argparse.Namespace, attn_type: str, checkpoint: Path) -> List[Dict]:
    from mmengine.registry import MODELS

    from ...engine.launch import load_config  # (the config imports the SR plug-in, which registers SRModel)
    model = MODELS.build(load_config(str(CONFIG), {'model.attn_types': attn_type}).model)
    load_checkpoint_into(model, Checkpoint.read(checkpoint))
    # chunks of 256 queries: (crops, heads, 256, N) scores at a time (~150 MB at N = 9,216)
    return measure_global_slots(model.model, measurement_crops(args), attn_type, sweep_norms(), args.sweep_queries,
                                chunk=256)


def train_and_measure(args: argparse.Namespace, settings: Dict, job: tuple, directory: Path) -> Dict:
    """Train with ``tools/train.py``, test with ``tools/test.py`` (PSNR / SSIM), measure the global slots."""
    attn_type, seed = job
    options = cfg_options(args, attn_type, seed)
    start = time.perf_counter()
    run_tool('train.py', [str(CONFIG), '--work-dir', str(directory), '--resume', '--cfg-options', *options],
             directory / 'train.log', args.threads)
    seconds = time.perf_counter() - start
    checkpoint, metrics_file = directory / f'iter_{args.iters}.pth', directory / 'metrics.json'
    run_tool('test.py', [str(CONFIG), str(checkpoint), '--work-dir', str(directory / 'test'), '--out-json',
                         str(metrics_file), '--cfg-options', *options], directory / 'test.log', args.threads)
    metrics = json.loads(metrics_file.read_text())
    start = time.perf_counter()
    groups = measure(args, attn_type, checkpoint)
    return dict(kernel=attn_type, seed=seed, settings=settings, seconds=seconds,
                measure_seconds=time.perf_counter() - start, psnr=metrics[f'{TEST_SET}/PSNR'],
                ssim=metrics[f'{TEST_SET}/SSIM'], bicubic_psnr=metrics[f'{TEST_SET}/bicubic_PSNR'], stages=groups)


def describe(result: Dict) -> str:
    return f"{result['kernel']:11s} seed {result['seed']}: PSNR {result['psnr']:.3f} dB (bicubic " \
           f"{result['bicubic_psnr']:.3f})"


def markdown(report: Dict) -> str:
    rows = [([attn_type, str(len(cell['seeds'])), format_mean_std(cell['psnr'], 3), format_mean_std(cell['ssim'], 4),
              format_mean_std(cell['bicubic_psnr'], 3)], cell) for attn_type, cell in report['cells'].items()]
    table = mechanism_table(['kernel', 'seeds', 'PSNR-Y (dB)', 'SSIM-Y', 'bicubic PSNR'], rows, 'group')
    intro = ['# The mechanism where tokens are many: NaLa-SR with each kernel in the global slot',
             f"Written by `{report['command']}` (`tools/analysis/study.py sr`; method: "
             f"nalaformer/analysis/studies/sr.py and docs/mechanism_study.md)."]
    return study_markdown(report, intro, table, 'PSNR', 'dB', 3)


def plot(report: Dict, path: Path) -> None:
    cells = report['cells']
    plot_study({'': cells}, {'': report['runs']}, 'psnr', f'PSNR-Y on {TEST_SET} (dB)', 'group', report['sweep_norms'],
               path, reference=next(iter(cells.values()))['bicubic_psnr']['mean'])


def main(args: argparse.Namespace) -> int:
    if args.iters < 1 or args.measure_size < 8:
        raise ConfigError('--iters must be >= 1 and --measure-size >= 8')
    args.data = args.data or args.work_dir / 'data'
    settings = {key: getattr(args, key) for key in RUN_SETTINGS}
    if not args.combine and not ((args.data / 'DIV2K').is_dir() and (args.data / 'benchmark' / TEST_SET).is_dir()):
        write_photo_datasets(args.data, scales=[2])
        print(f'data: written to {args.data}', flush=True)
    jobs = [(attn_type, seed) for attn_type in args.attn_types for seed in args.seeds]
    runs = run_jobs(args, jobs, settings, lambda job: args.work_dir / job[0] / f'seed{job[1]}',
                    functools.partial(train_and_measure, args, settings), describe, 'group')
    cells = summarise_kernels(runs, args.attn_types, METRICS)
    pairs = []  # every attn_type vs nala, then vs softmax
    for b in ('nala', 'softmax'):
        pairs += [(a, b) for a in cells if b in cells and a != b and (b, a) not in pairs]
    text = (f"pico NaLa-SR x2 (24 channels, 2 groups of 1 layer, 2 heads, 8x8 windows), global slot = each kernel, "
            f"{args.iters} iterations of 32 crops of 32x32 HR pixels on the mate-backgrounds photographs; PSNR / SSIM "
            f"(Y, border 2) on the 4 unseen photographs of {TEST_SET}; q, k of each group's global attention on the "
            f"centre {args.measure_size}x{args.measure_size} crop of each unseen LR image "
            f"({args.measure_size ** 2} tokens); mean ± sample std over seeds")
    report = study_report(args, settings, text, list(cells), cells,
                          [verdict(a, b, cells[a]['psnr'], cells[b]['psnr']) for a, b in pairs], runs)
    write_report(args.out, report, markdown(report), plot)
    return 0
