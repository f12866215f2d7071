"""Quick start: train a small NaLaFormer on real Fashion-MNIST, evaluate and export it (minutes on 2 CPU cores).

    python3 tools/quick_start.py [--work-dir work_dirs/quick_start] [--data data/fashion-mnist] [--out-json FILE]

Every step is one of the project's tools, printed before it runs, so each can be repeated by hand:

1. on first use, ``--data`` is written from Debian's dataset-fashion-mnist files (``bash scripts/setup.sh``
   installs them) as an ImageFolder: 1,000 training images per class, the whole test split (10,000) as val;
2. ``tools/train.py`` trains configs/nalaformer/nalaformer-pico_1xb64-10e_fashion-mnist-32px.py (10 epochs,
   TensorBoard logs; a killed run resumes where it stopped when the command is run again);
3. ``tools/test.py`` evaluates the last checkpoint on the test split;
4. ``tools/convert_checkpoint.py`` writes it as a timm folder (``timm.create_model('local-dir:...')``);
5. ``tools/analysis/attention_entropy.py`` plots the trained model's attention entropy against query norm.

Running it again continues where it stopped and writes its outputs again. ``--work-dir`` must be new,
empty or a quick start's (it holds the run's config); ``--data`` is written only where the converter may
(absent, empty or its own earlier copy): other folders are left alone. ``--out-json FILE`` also writes the
result (top-1, the test metrics, this run's wall time, threads, date) as JSON (README's figure is
docs/quick_start.json); it replaces only a file a quick start wrote, or any file with ``--overwrite``.
"""
import argparse
import datetime
import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

from nalaformer.errors import DestinationError, run_tool
from nalaformer.files import atomic_file, check_file_destination

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / 'configs' / 'nalaformer' / 'nalaformer-pico_1xb64-10e_fashion-mnist-32px.py'
EPOCHS = 10  # the config's schedule
TRAIN_PER_CLASS = 1000  # of 6,000: enough for >= 85% top-1 in 10 epochs, a few minutes on 2 cores


def step(title: str, *command) -> None:
    """Run one tool (output streamed); stop the quick start with its exit code if it fails."""
    command = [str(c) for c in command]
    print(f'\n== {title}\n$ {shlex.join(command)}', flush=True)
    code = subprocess.run(command, cwd=ROOT).returncode
    if code:
        print(f'quick start stopped: the step "{title}" failed (exit code {code}); its output is above',
              file=sys.stderr)
        sys.exit(code)


def check_work_dir(work: Path, data: Path) -> None:
    """The quick start writes (and rewrites) only in a work dir of its own: new, empty, or one where its
    training run left the config (tools/train.py copies it there)."""
    if work == data or work in data.parents or data in work.parents:
        raise DestinationError(f'--work-dir {work} and --data {data} overlap: the run would write into the dataset '
                               f'(or the dataset into the run); give them separate folders')
    if work.exists() and not work.is_dir():
        raise DestinationError(f'--work-dir {work} is a file; give a folder')
    entries = sorted(p.name for p in work.iterdir()) if work.is_dir() else []
    if entries and CONFIG.name not in entries:
        raise DestinationError(f'--work-dir {work} holds other files ({", ".join(entries[:5])}) and no quick start '
                               f'run (no {CONFIG.name}); the quick start would write among them: give a new or '
                               f'empty --work-dir')


def is_prepared(data: Path) -> bool:
    """``data`` holds the quick start's ImageFolder copy (an older or partial copy is written again)."""
    return (sum(1 for _ in data.glob('train/*/*.png')) == TRAIN_PER_CLASS * 10
            and sum(1 for _ in data.glob('val/*/*.png')) == 10_000)


def is_quick_start_json(path: Path) -> bool:
    """``path`` is a result file an earlier quick start wrote (``--out-json`` may replace it)."""
    try:
        return json.loads(path.read_text()).get('tool') == 'tools/quick_start.py'
    except (OSError, ValueError, AttributeError):
        return False


def main(argv=None) -> int:
    start = time.perf_counter()
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--work-dir', type=Path, default=ROOT / 'work_dirs' / 'quick_start')
    parser.add_argument('--data', type=Path, default=ROOT / 'data' / 'fashion-mnist',
                        help='ImageFolder copy of Fashion-MNIST (written on first use)')
    parser.add_argument('--src', type=Path, default=None, help='folder of the Fashion-MNIST IDX files '
                        '(default: where Debian installs them)')
    parser.add_argument('--out-json', type=Path, metavar='FILE',
                        help='also write the result (top-1, test metrics, wall time, threads, date) to FILE as JSON')
    parser.add_argument('--overwrite', action='store_true', help='replace an --out-json file a quick start did not write')
    args = parser.parse_args(argv)
    work, data = args.work_dir.resolve(), args.data.resolve()
    python = sys.executable
    check_work_dir(work, data)
    if args.out_json:
        check_file_destination(args.out_json, args.overwrite, '--out-json', 'quick_start.json',
                               replaceable=is_quick_start_json, kind='a quick start result')

    data_written = not is_prepared(data)
    if data_written:
        step('prepare the data', python, ROOT / 'tools' / 'dataset_converters' / 'fashion_mnist_to_imagefolder.py',
             data, '--train-per-class', TRAIN_PER_CLASS, *(['--src', args.src] if args.src else []))
    roots = [f'{loader}.dataset.data_root={data}' for loader in ('train_dataloader', 'val_dataloader', 'test_dataloader')]
    step(f'train ({EPOCHS} epochs)', python, ROOT / 'tools' / 'train.py', CONFIG, '--work-dir', work, '--resume',
         '--cfg-options', *roots)
    checkpoint = work / f'epoch_{EPOCHS}.pth'
    metrics_file = work / 'test_metrics.json'
    step('evaluate the checkpoint on the test split', python, ROOT / 'tools' / 'test.py', CONFIG, checkpoint,
         '--work-dir', work / 'test', '--out-json', metrics_file, '--overwrite', '--cfg-options', *roots)
    folder = work / 'timm_folder'
    step('export it as a timm folder', python, ROOT / 'tools' / 'convert_checkpoint.py', checkpoint, folder,
         '--raw')  # the weights evaluated above
    images = sorted((data / 'val').glob('*/*.png'))[::1000][:8]  # one image of each of 8 classes
    plot = work / 'attention_entropy.png'
    step('attention entropy of the trained model', python, ROOT / 'tools' / 'analysis' / 'attention_entropy.py',
         '--model', CONFIG, '--checkpoint', checkpoint, '--size', '32', '--images', *images,
         '--out', plot, '--json', work / 'attention_entropy.json')

    top1 = json.loads(metrics_file.read_text())['accuracy/top1']
    outputs = {'checkpoint': checkpoint,
               'timm folder': f'{folder}  (timm.create_model("local-dir:{folder}", pretrained=True) after import '
                              'nalaformer)',
               'logs': f'{work}  (tensorboard --logdir {work})', 'attention plot': plot, 'test metrics': metrics_file}
    if args.out_json:
        result = {'tool': 'tools/quick_start.py', 'config': str(CONFIG.relative_to(ROOT)), 'epochs': EPOCHS,
                  'top1': top1, 'test_metrics': json.loads(metrics_file.read_text()),
                  'wall_s': round(time.perf_counter() - start, 1), 'data_written': data_written,
                  'omp_num_threads': os.environ.get('OMP_NUM_THREADS'), 'cores': os.cpu_count(),
                  'date': datetime.date.today().isoformat()}
        with atomic_file(args.out_json) as tmp:
            tmp.write_text(json.dumps(result, indent=1) + '\n')
        outputs['result'] = args.out_json
    print(f'\nFashion-MNIST test split, top-1: {top1:.2f}%')
    for name, value in outputs.items():
        print(f'{name + ":":18}{value}')
    return 0


if __name__ == '__main__':
    sys.exit(run_tool(main))
