"""A training run's work dir: which checkpoint ``--resume`` continues from, and when a run may start there.

A work dir that holds checkpoints belongs to a run. A new run there would overwrite them (mmengine writes
``epoch_1.pth``, ``last_checkpoint``, ... again), so it is refused unless the run is resumed or the user
passes ``--overwrite``. Resuming reads and writes only inside the work dir: a copied work dir's
``last_checkpoint`` still names the original's file, and the copy's own file is taken instead.
"""
import logging
import os
import re
from pathlib import Path
from typing import List, Optional

from mmengine.config import Config
from mmengine.logging import print_log

from ..checkpoint import CheckpointError, MissingCheckpointError, check_definition, shape_mismatches
from ..errors import DestinationError
from ..files import check_folder_destination, contained, same_path
from .checkpoint import check_resumable
from .launch import model_spec

__all__ = ['run_checkpoints', 'resume_target', 'check_work_dir', 'prepare_work_dir']

# What mmengine's CheckpointHook writes into a work dir.
RUN_FILES = ('epoch_*.pth', 'iter_*.pth', 'best_*.pth', 'last_checkpoint')


def run_checkpoints(work_dir) -> List[Path]:
    """The checkpoints (and ``last_checkpoint`` pointer) a training run left in ``work_dir``."""
    work = Path(work_dir)
    return sorted({p for pattern in RUN_FILES for p in work.glob(pattern) if p.is_file()})


def _number(path: Path) -> int:
    match = re.search(r'(\d+)\.pth$', path.name)
    return int(match.group(1)) if match else -1


def resume_target(work_dir) -> Optional[Path]:
    """The checkpoint a resumed run continues from: the one ``last_checkpoint`` names (or, when that lies
    outside ``work_dir``, the file of that name inside it), else the latest ``epoch_*`` / ``iter_*``
    checkpoint; None when the work dir holds none."""
    work = Path(work_dir)
    pointer = work / 'last_checkpoint'
    if pointer.is_file():
        named = Path(pointer.read_text().strip())
        for candidate in (named, work / named.name):
            if candidate.is_file() and same_path(candidate.parent, work):
                return candidate
    found = [*work.glob('epoch_*.pth'), *work.glob('iter_*.pth')]
    return max(found, key=_number) if found else None


def check_resume_fits(cfg: Config, filename: str, content: dict) -> None:
    """Raise :class:`CheckpointError` when the checkpoint to resume was written by another model than the
    config's (other shapes, or other attention kernels), naming the config its run was trained with."""
    spec = model_spec(cfg)
    if spec is None or spec.weights_prefix is None:
        return
    model, prefix = spec.meta_model(), spec.weights_prefix
    theirs = {k[len(prefix):]: v for k, v in content['state_dict'].items() if k.startswith(prefix)}
    own = model.state_dict()
    differ = sorted(set(own) ^ set(theirs)) + shape_mismatches(theirs, own)
    if differ:
        configs = sorted(Path(filename).parent.glob('*.py'))  # tools/train.py copies the config into the work dir
        dump = ', '.join(map(str, configs)) if configs else 'its work dir holds no copy of it'
        raise CheckpointError(f'{filename} was written by another model than {spec.name} as this config builds it '
                              f'({len(differ)} tensors differ, e.g. {differ[:3]}): resume it with the config its run '
                              f'used ({dump}), or start this run in a new --work-dir')
    for definition in content['meta'].get('model_definitions') or []:
        if definition.get('module') == prefix.rstrip('.'):
            check_definition(definition, model, source=filename)


def _data_roots(cfg: Config):
    """(split, data_root) of each dataloader's dataset (and the datasets it wraps) that names a local folder."""
    for split in ('train', 'val', 'test'):
        dataset = (cfg.get(f'{split}_dataloader') or {}).get('dataset')
        while isinstance(dataset, dict):
            root = dataset.get('data_root')
            if isinstance(root, str) and root.strip('./') and '://' not in root:
                yield split, root
            dataset = dataset.get('dataset')


def check_work_dir(work_dir, cfg: Optional[Config] = None) -> Path:
    """Raise :class:`DestinationError` unless a run can write its logs and checkpoints into ``work_dir``: a
    writable folder, or a path whose nearest existing folder above is writable (it is created there), and not
    inside one of ``cfg``'s datasets (their ``data_root``)."""
    work = Path(work_dir)
    if work.exists() and not work.is_dir():
        raise DestinationError(f'--work-dir {work} is a file; give a folder for the run\'s logs and checkpoints')
    if work.is_dir() and not os.access(work, os.W_OK | os.X_OK):
        raise DestinationError(f'--work-dir {work} is not writable; choose another folder')
    for split, root in _data_roots(cfg) if cfg is not None else ():
        if same_path(work, root) or contained(work, root):
            raise DestinationError(f'--work-dir {work} lies inside the {split} data ({split}_dataloader.dataset.'
                                   f'data_root {root}): the run would write its logs and checkpoints among the data; '
                                   f'give the run a folder outside it')
    check_folder_destination(work, overwrite=True, option='--work-dir')  # the folders above it
    return work


def prepare_work_dir(cfg: Config, config_path: str, resume: Optional[str] = None, overwrite: bool = False) -> None:
    """Decide, before anything is written, what a training run does with ``cfg.work_dir``; sets ``cfg.resume``
    and ``cfg.load_from``.

    ``resume``: 'auto' (continue the run in the work dir, if any), a checkpoint path, or None (a new run;
    the config's own ``resume=True`` counts as 'auto', with ``load_from`` as that path). A new run in a
    work dir holding another run's checkpoints, or resuming another run's checkpoint into it, is refused
    unless ``overwrite`` (the earlier checkpoints are then deleted first).
    """
    work = check_work_dir(cfg.work_dir, cfg)
    dump = work / Path(config_path).name  # mmengine's copy of the config (NaLaRunner never writes it over the config)
    if resume is None and cfg.get('resume'):
        resume = cfg.get('load_from') or 'auto'
    earlier = run_checkpoints(work)
    if resume == 'auto':
        target = resume_target(work)
        if target is None:
            print_log(f'--resume: {work} holds no checkpoint to resume; starting a new run', logger='current',
                      level=logging.WARNING)
            cfg.resume = False  # mmengine would follow a last_checkpoint that points outside the work dir
            return
        check_resume_fits(cfg, str(target), check_resumable(str(target)))
        cfg.resume, cfg.load_from = True, str(target)
        print_log(f'--resume: continuing the run in {work} from {target}', logger='current')
        return
    if resume:
        if not Path(resume).is_file():
            raise MissingCheckpointError(f'--resume {resume}: no such checkpoint file')
        check_resume_fits(cfg, resume, check_resumable(resume))
        cfg.resume, cfg.load_from = True, resume
        print_log(f'--resume: continuing from {resume}', logger='current')
        if not earlier or same_path(Path(resume).parent, work):
            return
        conflict = (f'--work-dir {work} holds checkpoints of another run ({", ".join(p.name for p in earlier[:4])}); '
                    f'resuming {resume} there would overwrite them')
    else:
        if not earlier:
            return
        conflict = (f'--work-dir {work} holds checkpoints of an earlier run ({", ".join(p.name for p in earlier[:4])})'
                    f'{" and more" if len(earlier) > 4 else ""}; a new run there would overwrite them')
    if not overwrite:
        raise DestinationError(f'{conflict}. Continue that run with --resume, start this one in a new --work-dir, '
                               f'or pass --overwrite to delete them and start again there')
    if dump.is_file() and not same_path(dump, config_path):  # the earlier run's copy: this run writes its own
        earlier.append(dump)
    if int(os.environ.get('RANK', '0')) == 0:
        print_log(f'--overwrite: deleting the earlier run\'s checkpoints in {work}: '
                  f'{", ".join(p.name for p in earlier)}', logger='current', level=logging.WARNING)
        for path in earlier:
            if contained(path, work):  # what the run deletes lies in its work dir (links: the link itself)
                path.unlink(missing_ok=True)
