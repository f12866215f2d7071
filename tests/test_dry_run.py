"""``tools/train.py CONFIG --dry-run``: every shipped config trains a few iterations and validates on synthetic data
in its own layout, reports finite timings and memory, and writes nothing outside its temporary folder.

The fast tier dry-runs one config per task family (the cheapest real one) and checks the data writers, the
sampler and the user errors in-process; the slow tier (``-m slow``) dry-runs every other config under configs/.
"""
import json
import math
import os
import re
import runpy
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from mmengine.config import Config
from mmengine.registry import DATA_SAMPLERS, DATASETS, DefaultScope

import nalaformer.classification  # noqa: F401  (registers the datasets and the runner core's samplers)
from nalaformer.engine.dry_run import REPORT_NAME, DryRunSampler
from nalaformer.engine.datasets import dataset_leaves
from nalaformer.engine.dry_run_layouts import generate_data
from nalaformer.errors import run_tool

ROOT = Path(__file__).resolve().parents[1]
TRAIN = ROOT / 'tools' / 'train.py'
CONFIGS = sorted(p for p in (ROOT / 'configs').rglob('*.py') if '_base_' not in p.parts)
# The cheapest real config of each task family.
FAST = {'classification': 'configs/nalaformer/nalaformer-pico_1xb64-10e_fashion-mnist-32px.py',
        'super-resolution': 'configs/sr/nalasr-light_8xb16-500k_div2k-x4.py',
        'segmentation': 'configs/ade20k/fpn_nalaformer-xt_8xb4-40k_ade20k-512x512.py',
        'detection': 'configs/coco/retinanet_nalaformer-xt_fpn_1x_coco.py'}
PICO = ROOT / FAST['classification']
SECONDS = r'([0-9.e+-]+|n/a) s'


def files_under(folder: Path) -> set:
    return {p.relative_to(folder) for p in folder.rglob('*') if '.git' not in p.parts and '__pycache__' not in p.parts
            and not p.name.endswith('.pyc')}


def dry_run(config: Path, tmp_path: Path, *options) -> subprocess.CompletedProcess:
    """``tools/train.py CONFIG --dry-run OPTIONS`` run from an empty folder, its temporary files in another empty
    folder; checks that it succeeds and leaves both folders (and the repository) as they were."""
    cwd, tmp = tmp_path / 'cwd', tmp_path / 'tmp'
    cwd.mkdir()
    tmp.mkdir()
    before = files_under(ROOT)
    result = subprocess.run([sys.executable, str(TRAIN), str(config), '--dry-run', *map(str, options)],
                            capture_output=True, text=True, cwd=cwd, timeout=1800,
                            env={**os.environ, 'TMPDIR': str(tmp)})
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-5000:]
    assert list(cwd.iterdir()) == [] and list(tmp.iterdir()) == []  # no work_dirs/, no data, no temporary files
    assert not [p for p in files_under(ROOT) - before if 'dryrun' in p.name or config.stem in str(p)]
    return result


def check_report(stdout: str, config: Path, iters: int) -> dict:
    """The report block's figures, checked: ``iters`` iterations run at batch 2 (or the shipped batch, when
    smaller), validation on min(iters, 2) batches, finite positive timings and memory, a finite last loss."""
    block = stdout[stdout.index('dry run of '):]
    head = re.match(r'dry run of (\S+) on the CPU \((\d+) threads?\): (\d+) training iterations? \(batch (\d+) per '
                    r'process(?: instead of (\d+))?\), (?:(\d+) validation iterations?|no validation)', block)
    assert head, block
    assert Path(head.group(1)).resolve() == config.resolve()
    assert int(head.group(3)) == iters and int(head.group(4)) == min(2, int(head.group(5) or head.group(4)))
    cfg = Config.fromfile(str(config))
    if cfg.get('val_dataloader') and cfg.get('val_cfg') is not None:
        assert int(head.group(6)) == min(iters, 2), block
    first = rf' after a first iteration of {SECONDS}' if iters > 1 else ''
    timing = re.search(rf'time per iteration {SECONDS} \(data {SECONDS}, model step {SECONDS}\){first}; '
                       rf'last loss (\S+)', block)
    memory = re.search(r'peak memory ([0-9.]+) GiB \(RSS\)', block)
    assert timing and memory, block
    figures = [float(v) for v in timing.groups()[:-1]] + [float(memory.group(1))]
    assert all(math.isfinite(v) and v > 0 for v in figures), block
    assert math.isfinite(float(timing.groups()[-1])), block
    if head.group(6):
        val = re.search(rf'validation {SECONDS} per iteration \(data {SECONDS}\)', block)
        assert val and all(math.isfinite(float(v)) and float(v) > 0 for v in val.groups()), block
    assert 'work dir (temporary, removed)' in block
    return dict(iteration_s=figures[0], peak_gib=figures[-1])


@pytest.mark.parametrize('family', sorted(FAST))
def test_dry_run_of_one_config_per_task_family(family, tmp_path):
    """The full default dry run (3 iterations) where it is cheap, one iteration for the dense tasks."""
    config, iters = ROOT / FAST[family], 3 if family == 'classification' else 1
    check_report(dry_run(config, tmp_path, '--dry-run-iters', iters).stdout, config, iters)


# Detection (1333x800) and Cityscapes (2048x1024 slide validation) take 2-7 min and up to 11 GiB each on one
# core: one worker runs them one after another, so two of them never share the memory.
HEAVY = ('coco', 'cityscapes')
SWEEP = [pytest.param(p, id=str(p.relative_to(ROOT / 'configs')),
                      marks=pytest.mark.xdist_group('dry_run_heavy') if p.parent.name in HEAVY else ())
         for p in CONFIGS if str(p.relative_to(ROOT)) not in FAST.values()]


@pytest.mark.slow
@pytest.mark.parametrize('config', SWEEP)
def test_dry_run_of_every_shipped_config(config, tmp_path):
    """Every config the fast tier does not dry-run, one training iteration and one validation batch each."""
    check_report(dry_run(config, tmp_path, '--dry-run-iters', 1).stdout, config, 1)


def test_work_dir_keeps_the_report_and_loses_the_checkpoints(tmp_path):
    work = tmp_path / 'work'
    stdout = dry_run(PICO, tmp_path, '--work-dir', work, '--dry-run-iters', 2).stdout
    assert f'work dir (kept, with this report in {REPORT_NAME}): {work}' in stdout
    report = json.loads((work / REPORT_NAME).read_text())
    assert report['train']['iterations'] == 2 and report['train']['batch_sizes'] == [2]
    assert report['batch_size']['train'] == dict(dry_run=2, shipped=64, observed=[2])
    assert report['val']['iterations'] == 2 and set(report['val']['metrics']) >= {'accuracy/top1', 'ema/accuracy/top1'}
    assert all(math.isfinite(v) for v in report['train']['losses'])
    assert report['peak_rss_bytes'] > 2 ** 20 and report['train']['iteration_s'] > 0
    assert report['checkpoints']['count'] >= 1 and 'epoch_1.pth' in report['checkpoints_deleted']
    assert not list(work.glob('*.pth')) and not (work / 'last_checkpoint').exists()  # --resume finds no run there
    assert (work / PICO.name).is_file() and list(work.glob('*/*.log'))  # the config copy and the log are kept


# ---------------------------------------------------------------- in-process: errors, sampler, data writers

TRAIN_MAIN = runpy.run_path(str(TRAIN))['main']


@pytest.mark.parametrize('options, message', [
    (['--resume'], 'leave out --resume and --overwrite'),
    (['--dry-run-iters', '0'], '--dry-run-iters: expected a whole number >= 1'),
    (['--cfg-options', 'train_dataloader.dataset.type=NoSuchDataset'], "dataset type 'NoSuchDataset' is not"),
])
def test_user_errors_are_one_line(options, message, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert run_tool(TRAIN_MAIN, [str(PICO), '--dry-run', *options]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith('error: ') and message in err and '\n' not in err
    assert list(tmp_path.iterdir()) == []


def test_a_work_dir_holding_a_run_is_refused_untouched(tmp_path, capsys):
    (tmp_path / 'epoch_3.pth').write_bytes(b'a run')
    assert run_tool(TRAIN_MAIN, [str(PICO), '--dry-run', '--work-dir', str(tmp_path)]) == 2
    assert 'holds a run\'s checkpoints (epoch_3.pth' in capsys.readouterr().err
    assert [p.name for p in tmp_path.iterdir()] == ['epoch_3.pth']


def test_sampler_gives_the_shipped_samplers_indices_again_when_they_run_out():
    dataset = list(range(4))
    sampler = DryRunSampler(dataset, dict(type='DefaultSampler', shuffle=True), num_samples=6, seed=1)
    shipped = DATA_SAMPLERS.build(dict(type='DefaultSampler', shuffle=True, seed=1), default_args=dict(dataset=dataset))
    assert len(sampler) == 6 and sampler.dataset is dataset
    order = list(shipped)
    assert list(sampler) == order + order[:2]
    sampler.set_epoch(3)
    shipped.set_epoch(3)
    assert list(sampler)[:4] == list(shipped)


def data_configs() -> list:
    """One config per dataset layout (classification ImageNet and Fashion-MNIST, SR, ADE20K, Cityscapes, COCO and
    the custom COCO config)."""
    names = ['nalaformer/nalaformer-t_8xb128_in1k.py', 'nalaformer/nalaformer-pico_1xb64-10e_fashion-mnist-32px.py',
             'sr/nalasr-light_8xb16-500k_div2k-x3.py', 'ade20k/upernet_nalaformer-t_8xb2-160k_ade20k-512x512.py',
             'cityscapes/upernet_nalaformer-t_8xb2-80k_cityscapes-512x1024.py',
             'coco/mask-rcnn_nalaformer-t_fpn_1x_coco.py', 'coco/mask-rcnn_nalaformer-t_fpn_1x_custom-coco.py']
    return [ROOT / 'configs' / name for name in names]


@pytest.mark.parametrize('config', data_configs(), ids=lambda p: p.name)
def test_written_data_is_what_the_shipped_datasets_read(config, tmp_path):
    cfg = Config.fromfile(str(config))
    notes = generate_data(cfg, tmp_path, val_count=2)
    assert len(notes) == 2 and all(str(tmp_path) in dataset_leaves(cfg[f'{s}_dataloader'].dataset)[0]['data_root']
                                   for s in ('train', 'val'))
    for split, count in (('train', 4), ('val', 2)):
        with DefaultScope.overwrite_default_scope(cfg.get('default_scope')):
            dataset = DATASETS.build(cfg[f'{split}_dataloader'].dataset)
        classes = len(dataset.metainfo.get('classes') or ())
        assert len(dataset) == (max(count, classes) if 'ImageFolder' in type(dataset).__name__ else count)
        item = dataset[0]  # decoded and through the shipped pipeline
        inputs = item['inputs']
        assert torch.is_tensor(inputs) and inputs.ndim == 3 and inputs.shape[0] in (1, 3), type(dataset)
    for evaluator in [cfg.val_evaluator] if isinstance(cfg.val_evaluator, dict) else cfg.val_evaluator:
        assert not evaluator.get('ann_file') or Path(evaluator.ann_file).is_file()
