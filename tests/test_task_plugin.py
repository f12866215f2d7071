"""A new task is a folder plus a config: the toy plug-in in ``tests/toy_task`` (its own model wrapper, dataset,
metric and data checks, nothing edited in the package or the tools) trains, tests and dry-runs through
``tools/train.py`` / ``tools/test.py``, and the runner core's checks serve it."""
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / 'tests' / 'toy_task' / 'squares_1xb16-4e.py'
sys.path.insert(0, str(ROOT / 'tests'))
from toy_task import write_squares  # noqa: E402  (the plug-in, as its user imports it)


def tool(name: str, *args, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, 'PYTHONPATH': os.pathsep.join([str(ROOT / 'tests'), os.environ.get('PYTHONPATH', '')]),
           'OMP_NUM_THREADS': '1'}
    return subprocess.run([sys.executable, str(ROOT / 'tools' / name), *map(str, args)], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=900)


def data_options(data: Path) -> list:
    return ['--cfg-options', f'train_dataloader.dataset.data_root={data / "train"}',
            f'val_dataloader.dataset.data_root={data / "val"}', f'test_dataloader.dataset.data_root={data / "val"}']


def coverages(folder: Path) -> np.ndarray:
    return np.array([float(p.stem.split('_')[0]) for p in folder.glob('*.png')])


def test_the_toy_task_learns_through_train_and_test(tmp_path):
    data, work = tmp_path / 'data', tmp_path / 'work'
    write_squares(data / 'train', 256, seed=0)
    write_squares(data / 'val', 64, seed=1)
    trained = tool('train.py', CONFIG, '--work-dir', work, *data_options(data), cwd=tmp_path)
    assert trained.returncode == 0, trained.stderr[-3000:]
    [best] = work.glob('best_coverage_mae_epoch_*.pth')
    tested = tool('test.py', CONFIG, best, '--work-dir', tmp_path / 'test', '--out-json', tmp_path / 'metrics.json',
                  *data_options(data), cwd=tmp_path)
    assert tested.returncode == 0, tested.stderr[-3000:]
    mae = json.loads((tmp_path / 'metrics.json').read_text())['coverage/mae']
    baseline = np.abs(coverages(data / 'val') - coverages(data / 'train').mean()).mean()  # the mean, always
    assert mae < 0.5 * baseline, (mae, baseline)


def test_the_core_checks_the_plugins_model_and_data_before_writing(tmp_path):
    typo = tool('train.py', CONFIG, '--work-dir', tmp_path / 'work', '--cfg-options', 'model.embed_dim=8',
                cwd=tmp_path)
    assert typo.returncode == 2 and "model.embed_dim: nalaformer_t (NaLaFormer) takes no argument 'embed_dim'; did " \
                                   "you mean ['embed_dims']?" in typo.stderr, typo.stderr[-2000:]
    name = tool('train.py', CONFIG, '--work-dir', tmp_path / 'work', '--cfg-options', 'model.arch=nalaformr_t',
                cwd=tmp_path)
    assert name.returncode == 2 and "unknown timm model 'nalaformr_t' (model.arch); similar names: ['nalaformer_t'" \
        in name.stderr, name.stderr[-2000:]
    missing = tool('train.py', CONFIG, '--work-dir', tmp_path / 'work', cwd=tmp_path)
    assert missing.returncode == 2 and 'data/squares/train does not exist (train data): set ' \
                                       'train_dataloader.dataset.data_root' in missing.stderr, missing.stderr[-2000:]
    assert not (tmp_path / 'work').exists()


def test_the_toy_task_dry_runs_on_data_its_plugin_writes(tmp_path):
    result = tool('train.py', CONFIG, '--dry-run', '--dry-run-iters', 2, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    assert 'train: 4 32x32 PNGs of squares' in result.stdout and 'time per iteration' in result.stdout
    assert list(tmp_path.iterdir()) == []
