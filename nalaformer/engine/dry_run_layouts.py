"""The data a config's training and validation dataloaders and evaluators read, written synthetic for a dry run.

Every dataset (inside wrappers such as RepeatDataset or ConcatDataset) gets its ``data_root`` moved into a
data folder (``data/coco/`` -> ``<folder>/data/coco``; absolute ``ann_file`` / ``data_prefix`` paths and the
evaluators' ``ann_file`` likewise), and its task plug-in writes there the files its class reads, in the layout
its config names, at sizes realistic for the task (``write_data`` of :mod:`nalaformer.engine.datasets`): class
folders (classification), HR/LR pairs and benchmark sets (super-resolution), images with label maps (mmseg) or
COCO annotations (mmdet).
"""
import shutil
from pathlib import Path, PurePath
from typing import Dict, List, Optional

from mmengine.config import Config

from ..errors import ConfigError
from .datasets import dataset_class, dataset_leaves, dataset_support

__all__ = ['generate_data']

TRAIN_IMAGES = 4  # samplers draw them again for more batches


def _relative(path: str) -> PurePath:
    """``path`` without its anchor and ``..`` parts: where it goes inside the data folder."""
    return PurePath(*[p for p in PurePath(path or '').parts if p not in ('..', '.') and p != PurePath(path).anchor])


def _in_folder(path: str, folder: Path) -> str:
    return str(folder / _relative(path))


def _relocate(leaf: dict, folder: Path) -> None:
    leaf['data_root'] = str(folder / _relative(leaf.get('data_root') or ''))
    if PurePath(str(leaf.get('ann_file') or '')).is_absolute():
        leaf['ann_file'] = str(folder / _relative(leaf['ann_file']))
    for key, value in (leaf.get('data_prefix') or {}).items():
        if isinstance(value, str) and PurePath(value).is_absolute():
            leaf['data_prefix'][key] = str(folder / _relative(value))


def _write(cfg: Config, leaf: dict, count: int, seed: int, written: Dict[str, Path]) -> str:
    cls = dataset_class(cfg, leaf)
    support = dataset_support(cls)
    if support is None or support.write_data is None:
        raise ConfigError(f'--dry-run cannot write data for dataset type {cls.__name__}: its task plug-in registers '
                          f'no write_data (nalaformer.engine.datasets.DatasetSupport)')
    return support.write_data(cfg, leaf, count, seed, written)


def generate_data(cfg: Config, folder: Path, val_count: int, train_count: int = TRAIN_IMAGES) -> List[str]:
    """Point the training and validation datasets and evaluators of ``cfg`` at ``folder`` and write there what
    they read: ``train_count`` training images, ``val_count`` validation images (ImageFolder: at least one per
    class). Returns one line per dataset saying what was written."""
    notes, written = [], {}
    val_anns: List[Path] = []
    for seed, split in enumerate(('train', 'val')):
        loader = cfg.get(f'{split}_dataloader')
        if not loader:
            continue
        for leaf in dataset_leaves(loader.get('dataset')):
            _relocate(leaf, folder)
            count = train_count if split == 'train' else val_count
            notes.append(f'{split}: {_write(cfg, leaf, count, seed, written)}')
            if split == 'val' and leaf.get('ann_file'):
                val_anns.append(Path(leaf['data_root']) / leaf['ann_file'])
    evaluators = cfg.get('val_evaluator') or []
    for evaluator in evaluators if isinstance(evaluators, (list, tuple)) else [evaluators]:
        if evaluator.get('ann_file'):
            evaluator['ann_file'] = _in_folder(evaluator['ann_file'], folder)
            _ensure_evaluator_file(Path(evaluator['ann_file']), val_anns)
        if evaluator.get('outfile_prefix'):
            evaluator['outfile_prefix'] = _in_folder(evaluator['outfile_prefix'], folder / 'results')
    return notes


def _ensure_evaluator_file(path: Path, val_anns: List[Path]) -> None:
    """An evaluator's ``ann_file`` that is not the validation dataset's: a copy of that one's."""
    if path.exists():
        return
    source: Optional[Path] = next((p for p in val_anns if p.is_file()), None)
    if source is None:
        raise ConfigError(f'--dry-run: val_evaluator.ann_file {path} is none of the validation data\'s files')
    path.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(source, path)
