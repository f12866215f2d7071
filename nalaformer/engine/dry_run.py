"""``tools/train.py CONFIG --dry-run``: a few training iterations and a short validation of a config as shipped,
on synthetic data in the config's own layout, on the CPU, in a temporary folder; then a report of the time per
iteration, the data time and the peak memory.

What differs from the config as shipped, and nothing else (the report lists each change):

* the batch per process: 2 (timm's Mixup in batch mode needs an even batch), at most the shipped one;
* ``num_workers=0`` and ``persistent_workers=False``: data loads in the process that is measured;
* the length: one epoch of ``iters`` iterations (epoch-based loops; the shipped sampler draws the indices,
  :class:`DryRunSampler` stops it) or ``max_iters=iters`` (iteration-based), validated at its end on
  ``val_iters`` batches;
* checkpoints the config starts from that are not files here (``init_cfg`` Pretrained, ``pretrained``,
  ``load_from``: the user may not have them yet) are dropped; ``resume`` is off;
* every dataset's ``data_root`` (and absolute ``ann_file`` / ``data_prefix`` paths, evaluators' ``ann_file``)
  points into the temporary folder, where :mod:`nalaformer.datasets.dry_run_data` writes what the dataloaders
  and evaluators read.

The run goes into a temporary work dir (removed) unless ``--work-dir`` is given; there the report is kept as
``dry_run.json`` and the checkpoints the dry run wrote are deleted (a later ``--resume`` must not continue from
them). Python's temporary files go into the temporary folder as well.
"""
import copy
import json
import logging
import math
import os
import resource
import shutil
import tempfile
import time
from pathlib import Path
from typing import List, Optional

import torch
from mmengine.config import Config
from mmengine.logging import print_log
from mmengine.registry import DATA_SAMPLERS
from mmengine.runner import Runner

from ..errors import ConfigError, DestinationError
from ..files import atomic_file
from .dry_run_layouts import generate_data
from .dry_run_probe import DryRunProbe
from .work_dir import run_checkpoints

__all__ = ['DryRun', 'DryRunSampler', 'TRAIN_BATCH', 'REPORT_NAME']

TRAIN_BATCH = 2  # even: timm's Mixup in 'batch' mode mixes the batch with its reverse
REPORT_NAME = 'dry_run.json'


@DATA_SAMPLERS.register_module()
class DryRunSampler(torch.utils.data.Sampler):
    """The first ``num_samples`` indices of the config's own sampler (built from ``sampler`` as mmengine builds
    it), drawn from it again when it runs out: the shipped sampling, stopped after a few batches."""

    def __init__(self, dataset, sampler: dict, num_samples: int, seed: Optional[int] = None):
        self.dataset = dataset  # batch samplers (mmdet's AspectRatioBatchSampler) read it
        self.sampler = DATA_SAMPLERS.build(copy.deepcopy(sampler), default_args=dict(dataset=dataset, seed=seed))
        self.num_samples = num_samples

    def __iter__(self):
        given = 0
        while given < self.num_samples:
            drawn = 0
            for index in self.sampler:
                yield index
                given, drawn = given + 1, drawn + 1
                if given == self.num_samples:
                    return
            if drawn == 0:
                return

    def __len__(self) -> int:
        return self.num_samples

    def set_epoch(self, epoch: int) -> None:
        if hasattr(self.sampler, 'set_epoch'):
            self.sampler.set_epoch(epoch)


def _is_local_file(path) -> bool:
    return isinstance(path, str) and '://' not in path and os.path.isfile(path)


def _drop_missing_checkpoints(node, where: str, changes: List[str]) -> None:
    """Remove the ``init_cfg`` Pretrained entries and ``pretrained`` paths below ``node`` whose file is not here."""
    if isinstance(node, (list, tuple)):
        for i, item in enumerate(node):
            _drop_missing_checkpoints(item, f'{where}.{i}', changes)
        return
    if not isinstance(node, dict):
        return
    for key in list(node.keys()):
        value = node[key]
        if key == 'init_cfg' and value:
            entries = value if isinstance(value, (list, tuple)) else [value]
            missing = [e for e in entries if isinstance(e, dict) and e.get('type') == 'Pretrained'
                       and not _is_local_file(e.get('checkpoint'))]
            if missing:
                kept = [e for e in entries if not any(e is m for m in missing)]
                node[key] = kept if isinstance(value, (list, tuple)) else None
                names = ', '.join(str(e.get('checkpoint')) for e in missing)
                changes.append(f'{where}.init_cfg dropped (Pretrained {names}: not a file here)')
        elif key == 'pretrained' and isinstance(value, str) and not _is_local_file(value):
            node[key] = None
            changes.append(f'{where}.pretrained dropped ({value}: not a file here)')
        else:
            _drop_missing_checkpoints(value, f'{where}.{key}', changes)


class DryRun:
    """One dry run: a temporary folder (work dir unless ``work_dir`` is given, generated data, Python's temporary
    files), the config rewritten (:meth:`rewrite`), the runner probed (:meth:`attach`), the report
    (:meth:`finish`). Use it as a context manager: the temporary folder is removed however the run ends."""

    def __init__(self, config_path: str, work_dir: Optional[str] = None, iters: int = 3, val_iters: int = 2):
        if not (isinstance(iters, int) and iters >= 1) or not (isinstance(val_iters, int) and val_iters >= 1):
            raise ConfigError(f'--dry-run-iters: expected a whole number >= 1, got {iters} (validation: {val_iters})')
        if work_dir is not None:
            if Path(work_dir).exists() and not Path(work_dir).is_dir():
                raise DestinationError(f'--work-dir {work_dir} is a file; give a folder for the dry run\'s logs')
            earlier = run_checkpoints(work_dir) if Path(work_dir).is_dir() else []
            if earlier:
                raise DestinationError(f'--work-dir {work_dir} holds a run\'s checkpoints ({earlier[0].name}, ...); '
                                       f'a dry run goes into a work dir of its own: give another --work-dir')
        self.config_path, self.iters, self.val_iters = config_path, iters, val_iters
        self.kept_work_dir = work_dir
        self.root: Optional[Path] = None
        self.changes: List[str] = []
        self.data: List[str] = []
        self.probe = DryRunProbe()
        self.times = dict(start=time.perf_counter())
        self.batches = {}  # split -> (dry-run batch, shipped batch)
        self._saved_tempdir = self._saved_env = None

    # ------------------------------------------------------------------ the temporary folder

    def __enter__(self) -> 'DryRun':
        self._saved_env = os.environ.get('CUDA_VISIBLE_DEVICES')
        if not torch.cuda.is_initialized():
            os.environ['CUDA_VISIBLE_DEVICES'] = ''  # the CPU (a login node), before anything starts CUDA
        self.root = Path(tempfile.mkdtemp(prefix='nalaformer-dry-run-'))
        (self.root / 'tmp').mkdir()
        self._saved_tempdir, tempfile.tempdir = tempfile.tempdir, str(self.root / 'tmp')
        return self

    def __exit__(self, *exc) -> None:
        tempfile.tempdir = self._saved_tempdir
        if self._saved_env is None:
            os.environ.pop('CUDA_VISIBLE_DEVICES', None)
        else:
            os.environ['CUDA_VISIBLE_DEVICES'] = self._saved_env
        shutil.rmtree(self.root, ignore_errors=True)

    @property
    def work_dir(self) -> str:
        return self.kept_work_dir if self.kept_work_dir is not None else str(self.root / 'work')

    # ------------------------------------------------------------------ the config

    def rewrite(self, cfg: Config) -> None:
        """Make ``cfg`` (loaded and finalized) a dry run: batches, workers, length, checkpoints, data (written)."""
        if cfg.get('launcher', 'none') != 'none':
            raise ConfigError('--dry-run runs in one process: leave out --launcher (it measures one process\'s batch)')
        for split in ('train', 'val'):
            self._shrink_loader(cfg, split)
        self._shorten(cfg)
        _drop_missing_checkpoints(cfg.get('model'), 'model', self.changes)
        if cfg.get('load_from') and not _is_local_file(cfg.load_from):
            self.changes.append(f'load_from dropped ({cfg.load_from}: not a file here)')
            cfg.load_from = None
        if cfg.get('resume'):
            self.changes.append('resume=True turned off (a dry run starts a new run)')
            cfg.resume = False
        start = time.perf_counter()
        val_batch = self.batches['val'][0] if 'val' in self.batches else 1
        self.data = generate_data(cfg, self.root / 'data', val_count=self.val_iters * val_batch)
        self.times['data'] = time.perf_counter() - start
        self.changes.append(f'data roots point at synthetic data in the temporary folder {self.root / "data"}')

    def _shrink_loader(self, cfg: Config, split: str) -> None:
        loader = cfg.get(f'{split}_dataloader')
        if not loader:
            return
        shipped = loader.get('batch_size', 1)
        batch = min(shipped, TRAIN_BATCH)
        self.batches[split] = (batch, shipped)
        if batch != shipped:
            self.changes.append(f'{split}_dataloader.batch_size {shipped} -> {batch}')
        if loader.get('num_workers', 0) != 0 or loader.get('persistent_workers'):
            self.changes.append(f'{split}_dataloader.num_workers {loader.get("num_workers", 0)} -> 0 '
                                f'(persistent_workers off)')
        loader.batch_size, loader.num_workers, loader.persistent_workers = batch, 0, False

    def _limit_sampler(self, cfg: Config, split: str, batches: int) -> None:
        loader = cfg[f'{split}_dataloader']
        loader.sampler = dict(type='DryRunSampler', sampler=loader.sampler, num_samples=batches * loader.batch_size)

    def _shorten(self, cfg: Config) -> None:
        train_cfg = cfg.get('train_cfg')
        if not train_cfg or 'train' not in self.batches:
            raise ConfigError(f'{self.config_path} has no train_dataloader / train_cfg: nothing to dry-run')
        loop = str(train_cfg.get('type', ''))
        by_epoch = train_cfg.get('by_epoch', 'Epoch' in loop)
        if by_epoch:
            self.changes.append(f'train_cfg.max_epochs {train_cfg.get("max_epochs")} -> 1 epoch of {self.iters} '
                                f'iterations (the shipped sampler, stopped)')
            train_cfg.update(max_epochs=1, val_interval=1)
            self._limit_sampler(cfg, 'train', self.iters)
        elif 'max_iters' in train_cfg:
            self.changes.append(f'train_cfg.max_iters {train_cfg.max_iters} -> {self.iters}')
            train_cfg.update(max_iters=self.iters, val_interval=self.iters)
        else:
            raise ConfigError(f'--dry-run: train_cfg {dict(train_cfg)} is neither epoch- nor iteration-based')
        if 'val_begin' in train_cfg:
            train_cfg.val_begin = 1
        if 'val' in self.batches and cfg.get('val_cfg') is not None and cfg.get('val_evaluator') is not None:
            self._limit_sampler(cfg, 'val', self.val_iters)
            self.changes.append(f'validation on {self.val_iters} batches')

    # ------------------------------------------------------------------ the run

    def attach(self, runner: Runner) -> None:
        """Probe ``runner``'s iterations and checkpoint writes."""
        self.times['built'] = time.perf_counter()
        self.probe.attach(runner)

    def finish(self) -> dict:
        """The report: printed as one block, and written as ``dry_run.json`` into the work dir; deletes the
        checkpoints the dry run wrote into a kept work dir."""
        end = time.perf_counter()
        deleted = []
        if self.kept_work_dir is not None:
            for path in run_checkpoints(self.kept_work_dir):
                path.unlink()
                deleted.append(path.name)
        report = self.probe.summary()
        report.update(
            config=self.config_path,
            threads=torch.get_num_threads(),
            batch_size={split: dict(dry_run=b, shipped=s) for split, (b, s) in self.batches.items()},
            peak_rss_bytes=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
            total_s=end - self.times['start'], data_generation_s=self.times.get('data'),
            changes=self.changes, data=self.data,
            work_dir=self.work_dir, work_dir_temporary=self.kept_work_dir is None,
            checkpoints_deleted=deleted)
        for split, sizes in report['batch_size'].items():
            sizes['observed'] = report[split]['batch_sizes']  # what the iterations were given
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            report['peak_gpu_bytes'] = torch.cuda.max_memory_allocated()
        with atomic_file(Path(self.work_dir) / REPORT_NAME) as tmp:
            tmp.write_text(json.dumps(report, indent=1, default=str) + '\n')
        text = format_report(report)
        print_log('dry run finished', logger='current', level=logging.INFO)
        print(text, flush=True)
        return report


def _seconds(value: Optional[float]) -> str:
    if value is None or not math.isfinite(value):
        return 'n/a'
    return f'{value:.3g} s' if value < 100 else f'{value:.0f} s'


def _batch(report: dict, split: str) -> str:
    sizes = report['batch_size'].get(split)
    if not sizes:
        return ''
    given = '/'.join(map(str, sizes.get('observed') or [sizes['dry_run']]))
    same = given == str(sizes['shipped'])
    return f' (batch {given} per process{"" if same else " instead of " + str(sizes["shipped"])})'


def format_report(report: dict) -> str:
    """The user-facing block of a dry run's :meth:`DryRun.finish` report."""
    train, val = report['train'], report['val']
    where = f'on the {report["device"].upper()} ({report["threads"]} thread{"s" * (report["threads"] != 1)})'
    head = (f'dry run of {report["config"]} {where}: {train["iterations"]} training iteration'
            f'{"s" * (train["iterations"] != 1)}{_batch(report, "train")}, ')
    head += (f'{val["iterations"]} validation iteration{"s" * (val["iterations"] != 1)}{_batch(report, "val")}'
             if val['iterations'] else 'no validation (the config has none)')
    lines = [head]
    first = f' after a first iteration of {_seconds(train["first_iteration_s"])}' if train['iterations'] > 1 else ''
    lines.append(f'  time per iteration {_seconds(train["iteration_s"])} (data {_seconds(train["data_s"])}, '
                 f'model step {_seconds(train["step_s"])}){first}; last loss {train["last_loss"]:.4g}'
                 if train['last_loss'] is not None else
                 f'  time per iteration {_seconds(train["iteration_s"])} (data {_seconds(train["data_s"])}){first}')
    if val['iterations']:
        metrics = ', '.join(sorted(val['metrics'])) or 'none'
        lines.append(f'  validation {_seconds(val["iteration_s"])} per iteration (data {_seconds(val["data_s"])}), '
                     f'{_seconds(val["total_s"])} in all with the metrics ({metrics})')
    memory = f'peak memory {report["peak_rss_bytes"] / 2 ** 30:.2f} GiB (RSS)'
    if 'peak_gpu_bytes' in report:
        memory += f', {report["peak_gpu_bytes"] / 2 ** 30:.2f} GiB on the GPU'
    saved = report['checkpoints']
    if saved['count']:
        memory += f'; {saved["count"]} checkpoint{"s" * (saved["count"] != 1)} saved in {_seconds(saved["total_s"])}'
    lines.append(f'  {memory}; the dry run took {_seconds(report["total_s"])} after start-up (data generated in '
                 f'{_seconds(report["data_generation_s"])})')
    lines.append('  changed from the config as shipped:')
    lines += [f'    {change}' for change in report['changes']]
    lines.append('  data (synthetic, removed afterwards):')
    lines += [f'    {note}' for note in report['data']]
    if report['work_dir_temporary']:
        lines.append(f'  work dir (temporary, removed): {report["work_dir"]}')
    else:
        deleted = report['checkpoints_deleted']
        lines.append(f'  work dir (kept, with this report in {REPORT_NAME}): {report["work_dir"]}'
                     + (f'; the dry run\'s checkpoints were deleted ({", ".join(deleted)})' if deleted else ''))
    return '\n'.join(lines)
