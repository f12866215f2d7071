"""Does the query norm sharpen attention in *trained* classifiers? The paper's mechanism on real data (issue 18).

For every attn_type, seed and conv-mixer setting: trains the pico NaLaFormer (one attn_type in all stages,
``--epochs``) with ``tools/train.py``, then measures |q| against attention entropy and the norm sweep in every stage on
``--measure-images`` test images (docs/mechanism_study.md: the method, its cost, a smaller pipeline check)::

    python3 tools/analysis/study.py classification --out docs/mechanism_study
"""
import argparse
import functools
import math
import textwrap
import threading
import time
from pathlib import Path
from typing import Dict, List

import torch

from ...datasets import write_brightest_of_four, write_imagefolder
from ..images import load_images
from ..mechanism import (
    ABLATION_CHAIN, STUDY_ATTN_TYPES, format_mean_std, measure_stages, summarise_kernels, sweep_norms, verdict,
)
from ..models import create_model, parse_model_spec
from ..machine import CHECKOUT
from .runs import (
    add_study_args, mechanism_table, plot_study, read_scalars, run_jobs, run_tool, study_markdown, study_report,
    write_report,
)

MEASURING = threading.Lock()
CONFIG = CHECKOUT / 'configs' / 'nalaformer' / 'nalaformer-pico_1xb64-10e_fashion-mnist-32px.py'
INPUT_SIZE = 32
MIXERS = {'off': False, 'on': True}
TASKS = ('fashion-mnist', 'brightest-of-four')
# settings that change a run's result: a finished run is reused only when all of them match
RUN_SETTINGS = ('task', 'epochs', 'train_per_class', 'val_per_class', 'measure_images', 'sweep_queries', 'batch_size')


def add_arguments(parser: argparse.ArgumentParser):
    parser.add_argument('--task', default='fashion-mnist', choices=TASKS,
                        help='fashion-mnist: the items themselves; brightest-of-four: a 2x2 mosaic of items, the '
                             'label is the class of the one not dimmed (nalaformer.datasets.write_brightest_of_four)')
    add_study_args(parser, STUDY_ATTN_TYPES, (0, 1, 2, 3, 4), 'mechanism_study')
    parser.add_argument('--conv-mixers', nargs='+', default=['off', 'on'], choices=list(MIXERS),
                        help='with (on) and/or without (off) the convolutional token mixers')
    parser.add_argument('--epochs', type=int, default=6)
    parser.add_argument('--train-per-class', type=int, default=600, help='training images per class (of 6,000)')
    parser.add_argument('--val-per-class', type=int, default=None,
                        help='test images per class for top-1 (default: all, the 10,000-image test split)')
    parser.add_argument('--batch-size', type=int, default=64)
    parser.add_argument('--workers', type=int, default=1, help='data loader workers per training')
    parser.add_argument('--measure-images', type=int, default=40, help='test images whose q, k are measured')
    parser.add_argument('--data', type=Path, default=None,
                        help='ImageFolder of the task (default WORK/<task>-<train>-<val>; written on first use)')
    parser.add_argument('--src', type=Path, default=None,
                        help='folder of the Fashion-MNIST IDX files (default: where Debian installs them)')


def write_config(args: argparse.Namespace, directory: Path, attn_type: str, conv_mixers: bool, seed: int) -> Path:
    """A config inheriting the pico Fashion-MNIST config: one attn_type in all stages, the schedule shrunk to
    ``--epochs``, no EMA, validation after the last epoch only, a checkpoint each epoch (for resuming)."""
    epochs = args.epochs
    entries = dict(
        model=dict(attn_types=(attn_type,) * 4, conv_mixers=conv_mixers),
        train_cfg=dict(by_epoch=True, max_epochs=epochs, val_interval=epochs),
        param_scheduler=[
            dict(type='LinearLR', start_factor=0.1, by_epoch=True, begin=0, end=1, convert_to_iter_based=True),
            dict(type='CosineAnnealingLR', eta_min=1e-5, by_epoch=True, begin=1, end=max(epochs, 2),
                 convert_to_iter_based=True)],
        randomness=dict(seed=seed, deterministic=False),
        custom_hooks=[dict(type='EpochSeedHook'), dict(type='ResumableCheckpointHook')],
        default_hooks=dict(logger=dict(interval=50), checkpoint=dict(interval=1, max_keep_ckpts=2, save_best=None)),
        **{f'{split}_dataloader': dict(batch_size=args.batch_size if split == 'train' else 256,
                                       num_workers=args.workers, persistent_workers=False,
                                       dataset=dict(data_root=str(args.data.resolve())))
           for split in ('train', 'val', 'test')})
    text = [f'_base_ = [{str(CONFIG)!r}]'] + [f'{key} = {value!r}' for key, value in entries.items()]
    config = directory / f'{attn_type}_mixers{"on" if conv_mixers else "off"}_seed{seed}.py'
    config.write_text('\n'.join(text) + '\n')
    return config


def final_top1(directory: Path, epochs: int) -> float:
    """Top-1 of the validation after the last epoch, from mmengine's scalars (any timestamp folder)."""
    final = [row for row in read_scalars(directory) if 'accuracy/top1' in row and row.get('step') == epochs]
    if not final:
        raise RuntimeError(f'no validation after epoch {epochs} in {directory}/*/vis_data/scalars.json')
    return float(final[-1]['accuracy/top1'])


def measure(args: argparse.Namespace, config: Path, checkpoint: Path, attn_type: str) -> List[Dict]:
    """The statistics of every stage on ``--measure-images`` test images spread over the (class-sorted) val folder."""
    paths = sorted((args.data / 'val').glob('*/*.png'))
    paths = paths[::max(1, len(paths) // args.measure_images)][:args.measure_images]
    with MEASURING:  # one at a time: the seeded random state is global
        torch.manual_seed(0)
        model = create_model(parse_model_spec(str(config)), img_size=(INPUT_SIZE, INPUT_SIZE),
                             checkpoint=str(checkpoint))
        images, _ = load_images(paths, (INPUT_SIZE, INPUT_SIZE), model.pretrained_cfg['mean'],
                                model.pretrained_cfg['std'])
        return measure_stages(model, images, attn_type, sweep_norms(), sweep_queries=args.sweep_queries)


def train_and_measure(args: argparse.Namespace, settings: Dict, job: tuple, directory: Path) -> Dict:
    mixers, attn_type, seed = job
    config = write_config(args, directory, attn_type, MIXERS[mixers], seed)
    start = time.perf_counter()
    run_tool('train.py', [str(config), '--work-dir', str(directory), '--resume'], directory / 'train.log', args.threads)
    train_seconds, start = time.perf_counter() - start, time.perf_counter()
    stages = measure(args, config, directory / f'epoch_{args.epochs}.pth', attn_type)
    return dict(kernel=attn_type, conv_mixers=mixers, seed=seed, settings=settings,
                top1=final_top1(directory, args.epochs), seconds=train_seconds,
                measure_seconds=time.perf_counter() - start, config=str(config), stages=stages)


def describe(result: Dict) -> str:
    return f"mixers {result['conv_mixers']} {result['kernel']:11s} seed {result['seed']}: top-1 {result['top1']:.2f}%"


def verdicts(cells: Dict[str, Dict[str, Dict]]) -> List[Dict]:
    """Pairwise top-1 verdicts per mixer setting: every attn_type vs softmax and vs nala, the ablation chain, and
    each attn_type with vs without the conv mixers."""
    out = []
    for mixers, by_type in cells.items():
        pairs = [(a, 'softmax') for a in by_type if a != 'softmax'] + \
                [(a, 'nala') for a in by_type if a not in ('nala', 'softmax')] + \
                list(zip(ABLATION_CHAIN, ABLATION_CHAIN[1:]))
        out += [verdict(a, b, by_type[a]['top1'], by_type[b]['top1'], conv_mixers=mixers)
                for a, b in dict.fromkeys(pairs) if a in by_type and b in by_type]
    if {'on', 'off'} <= set(cells):
        out += [verdict(f'{a} (on)', f'{a} (off)', cells['on'][a]['top1'], cells['off'][a]['top1'],
                        conv_mixers='on vs off') for a in cells['on'] if a in cells['off']]
    return out


def markdown(report: Dict) -> str:
    rows = [([mixers, attn_type, str(len(cell['seeds'])), format_mean_std(cell['top1'])], cell)
            for mixers, by_type in report['cells'].items() for attn_type, cell in by_type.items()]
    table = mechanism_table(['conv mixers', 'kernel', 'seeds', 'top-1 (%)'], rows, 'stage', True, True)
    note = '"Spearman vs 0": < or > when the mean is farther from 0 than one standard deviation, else tie.'
    return study_markdown(report, [f"Command: `{report['command']}`"], table, 'Top-1', 'points', 2, [note],
                          group='conv_mixers')


def plot(report: Dict, path: Path) -> None:
    rows = {f'conv mixers {mixers}: ': cells for mixers, cells in report['cells'].items()}
    runs = {f'conv mixers {mixers}: ': [r for r in report['runs'] if r['conv_mixers'] == mixers
                                        and r['kernel'] in cells] for mixers, cells in report['cells'].items()}
    plot_study(rows, runs, 'top1', 'top-1 (%)', 'stage', report['sweep_norms'], path,
               title='\n'.join(textwrap.wrap(report['settings_text'], 180)))


def main(args: argparse.Namespace) -> int:
    args.data = args.data or args.work_dir / f'{args.task}-{args.train_per_class}-{args.val_per_class or "all"}'
    settings = {key: getattr(args, key) for key in RUN_SETTINGS}
    if not args.combine and not ((args.data / 'train').is_dir() and (args.data / 'val').is_dir()):
        write = write_imagefolder if args.task == 'fashion-mnist' else write_brightest_of_four
        written = write(args.data, train_per_class=args.train_per_class, val_per_class=args.val_per_class,
                        **(dict(src=str(args.src)) if args.src else {}))
        print(f'data: {written} images written to {args.data}', flush=True)
    jobs = [(m, a, s) for m in args.conv_mixers for a in args.attn_types for s in args.seeds]
    runs = run_jobs(args, jobs, settings,
                    lambda job: args.work_dir / args.task / f'mixers_{job[0]}' / job[1] / f'seed{job[2]}',
                    functools.partial(train_and_measure, args, settings), describe, 'stage')
    by_mixers = {m: summarise_kernels(runs, args.attn_types, ('top1',), conv_mixers=m) for m in args.conv_mixers}
    cells = {mixers: by_type for mixers, by_type in by_mixers.items() if by_type}
    for stage in (s for by_type in cells.values() for cell in by_type.values() for s in cell['stages']):
        stage['log_n'] = math.log(stage['tokens'])
    task = 'Fashion-MNIST' if args.task == 'fashion-mnist' else 'brightest-of-four Fashion-MNIST mosaics'
    text = (f"pico NaLaFormer (embed 16/32/48/64, depth 1 per stage), one kernel in all stages, {task} "
            f"{INPUT_SIZE} px, {args.train_per_class} train images/class, {args.epochs} epochs, batch "
            f"{args.batch_size}, top-1 on {args.val_per_class or 'all 1,000'} test images/class (raw weights, "
            f"after the last epoch); q, k of {args.measure_images} test images; mean ± sample std over seeds")
    report = study_report(args, settings, text, args.attn_types, cells, verdicts(cells), runs,
                          conv_mixers=args.conv_mixers)
    write_report(args.out, report, markdown(report), plot)
    return 0
