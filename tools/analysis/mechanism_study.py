"""Does the query norm sharpen attention in *trained* models? The paper's mechanism on real data (issue 18).

For every kernel (``softmax``, ``relu``, ``elu``, ``const_power``, ``nala_cos``, ``nala``), seed and
conv-mixer setting this trains the pico NaLaFormer of
``configs/nalaformer/nalaformer-pico_1xb64-10e_fashion-mnist-32px.py`` from scratch with the project's
``tools/train.py``, the one kernel in all four stages (the config's default is a hybrid), and
``conv_mixers=False`` (no CPE, LePE, FFN depthwise conv: the kernel is the blocks' only token mixer) or
``True``. The schedule is the config's (AdamW 3e-3, one warm-up epoch, cosine) shrunk to ``--epochs``;
no EMA; validation once, after the last epoch, on the whole Fashion-MNIST test split. Then, on the
trained raw weights, for every stage with more than one token (32 px input: 8x8, 4x4, 2x2 tokens;
stage 4 has one token and is skipped), ``nalaformer.analysis.mechanism.measure_stages`` measures the
Spearman correlation between |q| and attention entropy over ``--measure-images`` test images, and the
norm sweep (query directions fixed, norms 0.03 .. 30).

Writes ``OUT.json`` (settings, every run, mean ± sample std per cell, pairwise verdicts), ``OUT.png`` and
``OUT.md`` (the table and the exact command, between the file's ``<!-- mechanism_study results -->`` markers
if it has them, as docs/mechanism_study.md does). Two cells' means are called a tie when they differ by
less than the larger of their standard deviations. Runs are resumable: a finished run leaves
``WORK/<mixers>/<kernel>/seed<N>/result.json`` and is skipped the next time (unless its settings
differ); an interrupted training resumes from its last epoch checkpoint. ``--combine`` only re-reads
the finished runs and rewrites the outputs.

The full study (the committed table; see docs/mechanism_study.md for its cost)::

    python3 tools/analysis/mechanism_study.py --out docs/mechanism_study

A one-seed pipeline check (the test's)::

    python3 tools/analysis/mechanism_study.py --kernels softmax relu --seeds 0 --conv-mixers off \\
        --epochs 3 --train-per-class 100 --val-per-class 20 --measure-images 8 --work-dir /tmp/ms --out /tmp/ms/study
"""
import argparse
import functools
import json
import math
import os
import shlex
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

import torch

from nalaformer.analysis.images import load_images
from nalaformer.analysis.mechanism import (
    ABLATION_CHAIN, STUDY_KERNELS, compare, format_mean_std, measure_stages, summarise, sweep_norms,
)
from nalaformer.analysis.models import create_model, parse_model_spec
from nalaformer.analysis.results import save_figure
from nalaformer.analysis.study_runs import (
    add_run_args, read_result, run_side_by_side, start_run, write_report, write_result,
)
from nalaformer.datasets import write_brightest_of_four, write_imagefolder
from nalaformer.errors import ConfigError, run_tool

ROOT = Path(__file__).resolve().parents[2]
MEASURING = threading.Lock()

CONFIG = ROOT / 'configs' / 'nalaformer' / 'nalaformer-pico_1xb64-10e_fashion-mnist-32px.py'
INPUT_SIZE = 32
MIXERS = {'off': False, 'on': True}
TASKS = ('fashion-mnist', 'brightest-of-four')
# settings that change a run's result: a finished run is reused only when all of them match
RUN_SETTINGS = ('task', 'epochs', 'train_per_class', 'val_per_class', 'measure_images', 'sweep_queries', 'batch_size')


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0], epilog=__doc__.split('\n', 1)[1],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--task', default='fashion-mnist', choices=TASKS,
                        help='fashion-mnist: the items themselves; brightest-of-four: a 2x2 mosaic of items, the '
                             'label is the class of the one not dimmed '
                             '(nalaformer.datasets.write_brightest_of_four)')
    parser.add_argument('--kernels', nargs='+', default=list(STUDY_KERNELS), choices=STUDY_KERNELS)
    parser.add_argument('--seeds', type=int, nargs='+', default=[0, 1, 2, 3, 4])
    parser.add_argument('--conv-mixers', nargs='+', default=['off', 'on'], choices=list(MIXERS),
                        help='with (on) and/or without (off) the convolutional token mixers')
    parser.add_argument('--epochs', type=int, default=6)
    parser.add_argument('--train-per-class', type=int, default=600, help='training images per class (of 6,000)')
    parser.add_argument('--val-per-class', type=int, default=None,
                        help='test images per class for top-1 (default: all, the 10,000-image test split)')
    parser.add_argument('--batch-size', type=int, default=64)
    parser.add_argument('--threads', type=int, default=1,
                        help='torch threads per training (1: two spinning OpenMP threads on 2 shared cores were '
                             '~50x slower)')
    parser.add_argument('--workers', type=int, default=1, help='data loader workers per training')
    parser.add_argument('--jobs', type=int, default=2, help='trainings run side by side (each --threads threads)')
    parser.add_argument('--measure-images', type=int, default=40, help='test images whose q, k are measured')
    parser.add_argument('--sweep-queries', type=int, default=64, help='query directions per head in the sweep')
    parser.add_argument('--work-dir', type=Path, default=ROOT / 'work_dirs' / 'mechanism_study')
    parser.add_argument('--data', type=Path, default=None,
                        help='ImageFolder of the task (default WORK/<task>-<train>-<val>; written '
                             'on first use)')
    parser.add_argument('--src', type=Path, default=None, help='folder of the Fashion-MNIST IDX files '
                        '(default: where Debian installs them)')
    parser.add_argument('--out', type=Path, default=ROOT / 'docs' / 'mechanism_study',
                        help='output prefix: OUT.json, OUT.png, OUT.md')
    add_run_args(parser)
    args = parser.parse_args(argv)
    if args.data is None:
        args.data = args.work_dir / f'{args.task}-{args.train_per_class}-{args.val_per_class or "all"}'
    return args


def settings(args: argparse.Namespace) -> Dict:
    return {key: getattr(args, key) for key in RUN_SETTINGS}


def run_dir(args: argparse.Namespace, mixers: str, kernel: str, seed: int) -> Path:
    return args.work_dir / args.task / f'mixers_{mixers}' / kernel / f'seed{seed}'


def prepare_data(args: argparse.Namespace) -> None:
    if (args.data / 'train').is_dir() and (args.data / 'val').is_dir():
        return
    kwargs = dict(src=str(args.src)) if args.src else {}
    write = write_imagefolder if args.task == 'fashion-mnist' else write_brightest_of_four
    written = write(args.data, train_per_class=args.train_per_class, val_per_class=args.val_per_class, **kwargs)
    print(f'data: {written} images written to {args.data}', flush=True)


def write_config(args: argparse.Namespace, directory: Path, kernel: str, conv_mixers: bool, seed: int) -> Path:
    """A config inheriting the pico Fashion-MNIST config: one kernel in all stages, the schedule shrunk to
    ``--epochs``, no EMA, validation after the last epoch only, a checkpoint each epoch (for resuming)."""
    epochs = args.epochs
    loaders = {split: dict(batch_size=args.batch_size if split == 'train' else 256, num_workers=args.workers,
                           persistent_workers=False, dataset=dict(data_root=str(args.data.resolve())))
               for split in ('train', 'val', 'test')}
    entries = dict(
        model=dict(attn_types=(kernel,) * 4, conv_mixers=conv_mixers),
        train_cfg=dict(by_epoch=True, max_epochs=epochs, val_interval=epochs),
        param_scheduler=[
            dict(type='LinearLR', start_factor=0.1, by_epoch=True, begin=0, end=1, convert_to_iter_based=True),
            dict(type='CosineAnnealingLR', eta_min=1e-5, by_epoch=True, begin=1, end=max(epochs, 2),
                 convert_to_iter_based=True)],
        randomness=dict(seed=seed, deterministic=False),
        custom_hooks=[dict(type='EpochSeedHook'), dict(type='ResumableCheckpointHook')],
        default_hooks=dict(logger=dict(interval=50), checkpoint=dict(interval=1, max_keep_ckpts=2, save_best=None)),
        **{f'{split}_dataloader': loader for split, loader in loaders.items()},
    )
    text = [f'_base_ = [{str(CONFIG)!r}]'] + [f'{key} = {value!r}' for key, value in entries.items()]
    config = directory / f'{kernel}_mixers{"on" if conv_mixers else "off"}_seed{seed}.py'
    directory.mkdir(parents=True, exist_ok=True)
    config.write_text('\n'.join(text) + '\n')
    return config


def final_top1(directory: Path, epochs: int) -> float:
    """Top-1 of the validation after the last epoch, from mmengine's scalars (any timestamp folder)."""
    rows = [json.loads(line) for scalars in sorted(directory.glob('*/vis_data/scalars.json'))
            for line in scalars.read_text().splitlines() if 'accuracy/top1' in line]
    final = [row for row in rows if row.get('step') == epochs]
    if not final:
        raise RuntimeError(f'no validation after epoch {epochs} in {directory}/*/vis_data/scalars.json')
    return float(final[-1]['accuracy/top1'])


def measurement_images(args: argparse.Namespace) -> List[Path]:
    """``--measure-images`` test images, spread evenly over the (class-sorted) val folder."""
    paths = sorted((args.data / 'val').glob('*/*.png'))
    step = max(1, len(paths) // args.measure_images)
    return paths[::step][:args.measure_images]


def measure(args: argparse.Namespace, config: Path, checkpoint: Path, kernel: str) -> List[Dict]:
    with MEASURING:  # one at a time: the seeded random state is global
        torch.manual_seed(0)
        return _measure(args, config, checkpoint, kernel)


def _measure(args: argparse.Namespace, config: Path, checkpoint: Path, kernel: str) -> List[Dict]:
    model = create_model(parse_model_spec(str(config)), img_size=(INPUT_SIZE, INPUT_SIZE), checkpoint=str(checkpoint))
    images, _ = load_images(measurement_images(args), (INPUT_SIZE, INPUT_SIZE), model.pretrained_cfg['mean'],
                            model.pretrained_cfg['std'])
    return measure_stages(model, images, kernel, sweep_norms(), sweep_queries=args.sweep_queries)


def train_env(args: argparse.Namespace) -> Dict[str, str]:
    threads = str(args.threads)
    return {**os.environ, 'OMP_NUM_THREADS': threads, 'MKL_NUM_THREADS': threads,
            'PYTHONPATH': f'{ROOT}{os.pathsep}{os.environ.get("PYTHONPATH", "")}'}


def run_one(args: argparse.Namespace, mixers: str, kernel: str, seed: int) -> Dict:
    directory = run_dir(args, mixers, kernel, seed)
    result = None if args.retrain else read_result(directory)
    if result is not None:
        if result.get('settings') == settings(args):
            return result
        print(f'[{mixers} {kernel} seed {seed}] settings changed: training again', flush=True)
    start_run(directory, settings(args), args.retrain)
    config = write_config(args, directory, kernel, MIXERS[mixers], seed)
    command = [sys.executable, str(ROOT / 'tools' / 'train.py'), str(config), '--work-dir', str(directory), '--resume']
    start = time.perf_counter()
    log = directory / 'train.log'
    with log.open('a') as f:
        code = subprocess.run(command, cwd=ROOT, stdout=f, stderr=subprocess.STDOUT,
                              env=train_env(args)).returncode
    train_seconds = time.perf_counter() - start
    if code:
        tail = log.read_text()[-4000:]
        raise SystemExit(f'[{mixers} {kernel} seed {seed}] training failed (exit {code}): '
                         f'{shlex.join(command)}\n{tail}')
    start = time.perf_counter()
    stages = measure(args, config, directory / f'epoch_{args.epochs}.pth', kernel)
    result = dict(kernel=kernel, conv_mixers=mixers, seed=seed, settings=settings(args),
                  top1=final_top1(directory, args.epochs), seconds=train_seconds,
                  measure_seconds=time.perf_counter() - start, config=str(config), stages=stages)
    write_result(directory, result)
    return result


def train_and_report(args: argparse.Namespace, start: float, job: Tuple[str, str, int], i: int, total: int) -> Dict:
    """:func:`run_one` with a progress line before and after (runs go side by side with ``--jobs``)."""
    mixers, kernel, seed = job
    was_done = not args.retrain and read_result(run_dir(args, mixers, kernel, seed)) is not None
    if not was_done:
        print(f'[{i}/{total}] mixers {mixers} {kernel} seed {seed}: training ({args.epochs} epochs, log: '
              f'{run_dir(args, mixers, kernel, seed) / "train.log"})', flush=True)
    result = run_one(args, mixers, kernel, seed)
    stage0 = result['stages'][0]
    cost = '(done before)' if was_done else f"train {result['seconds']:.0f} s + measure {result['measure_seconds']:.0f} s"
    print(f"[{i}/{total}] mixers {mixers} {kernel:11s} seed {seed}: top-1 {result['top1']:.2f}%  "
          f"Spearman s1 {stage0['spearman'] if stage0['spearman'] is not None else math.nan:+.3f}  "
          f"sweep ΔH s1 {stage0['sweep_change']:+.3f}  {cost}  [{(time.perf_counter() - start) / 60:.1f} min]",
          flush=True)
    return result


def verdicts(cells: Dict[str, Dict[str, Dict]]) -> List[Dict]:
    """Pairwise top-1 verdicts per mixer setting: every kernel vs softmax and vs nala, the ablation chain,
    and each kernel with vs without the conv mixers."""
    out = []
    for mixers, by_kernel in cells.items():
        pairs = [(a, 'softmax') for a in by_kernel if a != 'softmax'] + \
                [(a, 'nala') for a in by_kernel if a not in ('nala', 'softmax')] + \
                list(zip(ABLATION_CHAIN, ABLATION_CHAIN[1:]))
        seen = set()
        for a, b in pairs:
            if a in by_kernel and b in by_kernel and (a, b) not in seen:
                seen.add((a, b))
                ta, tb = by_kernel[a]['top1'], by_kernel[b]['top1']
                out.append(dict(conv_mixers=mixers, a=a, b=b, diff=ta['mean'] - tb['mean'],
                                spread=max(ta['std'], tb['std']), verdict=compare(ta, tb)))
    if {'on', 'off'} <= set(cells):
        for kernel in cells['on']:
            if kernel in cells['off']:
                ta, tb = cells['on'][kernel]['top1'], cells['off'][kernel]['top1']
                out.append(dict(conv_mixers='on vs off', a=f'{kernel} (on)', b=f'{kernel} (off)',
                                diff=ta['mean'] - tb['mean'], spread=max(ta['std'], tb['std']),
                                verdict=compare(ta, tb)))
    return out


def markdown(report: Dict) -> str:
    lines = [f"Command: `{report['command']}`", '',
             f"Settings: {report['settings_text']}", '']
    stages = [s for s in next(iter(next(iter(report['cells'].values())).values()))['stages'] if 'spearman' in s]
    header = ['conv mixers', 'kernel', 'seeds', 'top-1 (%)'] + \
             [f"Spearman(\\|q\\|, H) stage {s['stage'] + 1} ({s['tokens']} tok.)" for s in stages] + \
             ['stage 1 Spearman vs 0', 'sweep ΔH stage 1 (nats)', 'sweep max \\|ΔH\\| stage 1']
    lines += ['| ' + ' | '.join(header) + ' |', '|' + '---|' * len(header)]
    for mixers, by_kernel in report['cells'].items():
        for kernel, cell in by_kernel.items():
            measured = {s['stage']: s for s in cell['stages'] if 'spearman' in s}
            row = [mixers, kernel, str(len(cell['seeds'])), format_mean_std(cell['top1'])]
            row += [format_mean_std(measured[s['stage']]['spearman'], signed=True) for s in stages]
            first = measured[stages[0]['stage']]
            zero = dict(mean=0.0, std=0.0, n=first['spearman']['n'])
            row += [compare(first['spearman'], zero) if first['spearman']['mean'] is not None else 'n/a',
                    format_mean_std(first['sweep_change'], 3, signed=True),
                    f"{first['sweep_max_abs_change']['mean']:.1e}" if first['sweep_max_abs_change']['mean'] is not None
                    else '–']
            lines.append('| ' + ' | '.join(row) + ' |')
    lines += ['', '"Spearman vs 0": < or > when the mean is farther from 0 than one standard deviation, else tie.']
    lines += ['', 'Top-1 verdicts (tie: |difference| < the larger standard deviation; n/a: fewer than 2 seeds):', '',
              '| conv mixers | a | b | a − b (points) | larger std | verdict |', '|---|---|---|---|---|---|']
    for v in report['verdicts']:
        lines.append(f"| {v['conv_mixers']} | {v['a']} | {v['b']} | {v['diff']:+.2f} | {v['spread']:.2f} | "
                     f"{v['verdict']} |")
    return '\n'.join(lines) + '\n'


BEGIN, END = '<!-- mechanism_study results: begin -->', '<!-- mechanism_study results: end -->'


def write_markdown(path: Path, table: str) -> None:
    """Put ``table`` between the BEGIN/END markers of ``path`` (docs/mechanism_study.md keeps its text around
    them); a file without the markers is replaced by the table."""
    block = f'{BEGIN}\n{table}{END}'
    text = path.read_text() if path.is_file() else ''
    if BEGIN in text and END in text:
        head, rest = text.split(BEGIN, 1)
        path.write_text(head + block + rest.split(END, 1)[1])  # the text around the markers as it was
    else:
        path.write_text(block + '\n')


def plot(report: Dict, path: Path) -> None:
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt

    cells = report['cells']
    fig, axes = plt.subplots(len(cells), 3, figsize=(15, 3.8 * len(cells)), squeeze=False, sharey='col')
    for row, (mixers, by_kernel) in zip(axes, cells.items()):
        kernels = list(by_kernel)
        x = range(len(kernels))
        top1 = [by_kernel[k]['top1'] for k in kernels]
        row[0].errorbar(x, [t['mean'] for t in top1], yerr=[t['std'] for t in top1], fmt='o', capsize=4)
        for seed_run in report['runs']:
            if seed_run['conv_mixers'] == mixers and seed_run['kernel'] in kernels:
                row[0].plot(kernels.index(seed_run['kernel']) + 0.12, seed_run['top1'], '.', color='gray', ms=4)
        row[0].set_xticks(list(x), kernels, rotation=20)
        row[0].set_xlim(-0.5, len(kernels) - 0.5)
        row[0].set_ylabel('top-1 (%)')
        row[0].set_title(f'conv mixers {mixers}: top-1, mean ± std over seeds (gray: seeds)', fontsize=10)
        stages = [s['stage'] for s in by_kernel[kernels[0]]['stages'] if 'spearman' in s]
        width = 0.8 / max(1, len(stages))
        for j, stage in enumerate(stages):
            stats = [by_kernel[k]['stages'][stage]['spearman'] for k in kernels]
            row[1].bar([i + (j - (len(stages) - 1) / 2) * width for i in x],
                       [s['mean'] if s['mean'] is not None else math.nan for s in stats], width,
                       yerr=[s['std'] or 0 for s in stats], capsize=2,
                       label=f"stage {stage + 1} ({by_kernel[kernels[0]]['stages'][stage]['tokens']} tokens)")
        row[1].axhline(0, color='gray', lw=1)
        row[1].set_xticks(list(x), kernels, rotation=20)
        row[1].set_ylabel('Spearman(|q|, entropy)')
        row[1].set_title('trained q, k: correlation of query norm and entropy', fontsize=10)
        row[1].legend(fontsize=8)
        norms = report['sweep_norms']
        for kernel in kernels:
            row[2].plot(norms, by_kernel[kernel]['stages'][stages[0]]['sweep_mean_entropy'], label=kernel)
        row[2].axhline(by_kernel[kernels[0]]['stages'][stages[0]].get('log_n', math.log(
            by_kernel[kernels[0]]['stages'][stages[0]]['tokens'])), color='gray', ls='--', lw=1)
        row[2].set_xscale('log')
        row[2].set_xlabel('query norm (directions fixed)')
        row[2].set_ylabel('mean entropy (nats)')
        row[2].set_title(f'norm sweep, stage {stages[0] + 1} (dashed: log N), mean over seeds', fontsize=10)
        row[2].legend(fontsize=8)
    fig.suptitle('\n'.join(textwrap.wrap(report['settings_text'], 180)), fontsize=9)
    save_figure(fig, path)


def collect(args: argparse.Namespace, runs: List[Dict], command: str) -> Dict:
    cells: Dict[str, Dict[str, Dict]] = {}
    for mixers in args.conv_mixers:
        for kernel in args.kernels:
            chosen = [r for r in runs if r['conv_mixers'] == mixers and r['kernel'] == kernel]
            if chosen:
                cells.setdefault(mixers, {})[kernel] = summarise(chosen)
    from nalaformer.analysis.mechanism import sweep_norms
    task = 'Fashion-MNIST' if args.task == 'fashion-mnist' else 'brightest-of-four Fashion-MNIST mosaics'
    text = (f"pico NaLaFormer (embed 16/32/48/64, depth 1 per stage), one kernel in all stages, {task} "
            f"{INPUT_SIZE} px, {args.train_per_class} train images/class, {args.epochs} epochs, batch "
            f"{args.batch_size}, top-1 on {args.val_per_class or 'all 1,000'} test images/class (raw weights, "
            f"after the last epoch); q, k of {args.measure_images} test images; mean ± sample std over seeds")
    for cell in (c for by_kernel in cells.values() for c in by_kernel.values()):
        for stage in cell['stages']:
            stage['log_n'] = math.log(stage['tokens'])
    return dict(command=command, settings=settings(args), settings_text=text, kernels=args.kernels,
                seeds=args.seeds, conv_mixers=args.conv_mixers, sweep_norms=sweep_norms().tolist(),
                tie_rule='tie when |mean a - mean b| < max(std a, std b)', cells=cells,
                verdicts=verdicts(cells), runs=runs)


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_args(argv)
    command = shlex.join(['python3', 'tools/analysis/mechanism_study.py', *(sys.argv[1:] if argv is None else argv)])
    jobs = [(m, k, s) for m in args.conv_mixers for k in args.kernels for s in args.seeds]
    runs = []
    if not args.combine:
        prepare_data(args)
    start = time.perf_counter()
    if args.combine:
        for mixers, kernel, seed in jobs:
            result = read_result(run_dir(args, mixers, kernel, seed))
            if result and result.get('settings') == settings(args):
                runs.append(result)
            elif result:
                print(f'[{mixers} {kernel} seed {seed}] left out: trained with other settings {result.get("settings")}')
    else:
        torch.set_num_threads(args.threads)  # the measurements in this process, beside the trainings
        runs = run_side_by_side(functools.partial(train_and_report, args, start), jobs, args.jobs)
    if not runs:
        raise ConfigError(f'no finished runs under {args.work_dir}')
    report = collect(args, runs, command)
    write_report(args.out, report, markdown(report), write_markdown, plot)
    return 0


if __name__ == '__main__':
    sys.exit(run_tool(main))
