"""Shared by tools/train.py and tools/test.py: config loading with checked overrides, runner building.

Problems with the command line or the config raise :class:`ConfigError`, which the tools print as one
line; anything raised while training or testing keeps its traceback.
"""
import difflib
import logging
import os.path as osp
from typing import Optional

import torch
from mmengine.config import Config
from mmengine.logging import print_log
from mmengine.registry import DATASETS, RUNNERS
from mmengine.runner import Runner

from ..errors import ConfigError
from ..mmcv_build import MmcvOpsError, check_mmcv_ops
from ..threads import apply_threads
from .data import LAYOUT as IMAGE_FOLDER_LAYOUT
from .sr_data import SRDataError


def check_cfg_options(cfg: Config, options: dict) -> None:
    """Reject ``--cfg-options`` keys that do not exist, naming the key and close matches.

    A new key is allowed only inside a dict that builds an object (has ``type``), whose
    constructor then validates it; anywhere else a typo would be silently ignored.
    """
    for key in options:
        node, path = cfg.to_dict(), []
        for part in key.split('.'):
            if isinstance(node, (list, tuple)) and part.isdigit() and int(part) < len(node):
                node = node[int(part)]
            elif isinstance(node, dict) and part in node:
                node = node[part]
            elif isinstance(node, dict) and 'type' in node and part == key.split('.')[-1]:
                break
            else:
                known = list(node.keys()) if isinstance(node, dict) else []
                close = difflib.get_close_matches(part, known, n=3)
                where = '.'.join(path) or 'the top level'
                hint = f'; did you mean {close}?' if close else f'; keys there: {sorted(known)[:20]}'
                raise ConfigError(f"--cfg-options {key}: no key '{part}' at {where}{hint}")
            path.append(part)


def load_config(path: str, cfg_options: Optional[dict] = None) -> Config:
    if not osp.isfile(path):
        raise ConfigError(f'config file {path} does not exist')
    cfg = Config.fromfile(path)
    if cfg_options:
        check_cfg_options(cfg, cfg_options)
        cfg.merge_from_dict(cfg_options)
    return cfg


def apply_amp(cfg: Config, dtype: str, device: Optional[str] = None) -> None:
    """Mixed precision (``dtype`` 'bfloat16' or 'float16') for the config's optimizer wrapper on ``device``
    ('cuda' or 'cpu'; default: CUDA when available): mmengine's AmpOptimWrapper with dynamic loss
    scaling on a GPU, our CPUAmpOptimWrapper (bfloat16 only) on the CPU."""
    wrapper = cfg.optim_wrapper
    if (device or ('cuda' if torch.cuda.is_available() else 'cpu')) == 'cuda':
        wrapper.update(type='AmpOptimWrapper', dtype=dtype, loss_scale='dynamic')
    elif dtype == 'bfloat16':
        wrapper.update(type='CPUAmpOptimWrapper', dtype=dtype)
    else:
        raise ConfigError('float16 mixed precision needs a GPU; on CPU use bfloat16')


def finalize_config(cfg: Config, config_path: str, work_dir: Optional[str], launcher: str) -> Config:
    """Work dir default (work_dirs/<config name>), launcher, and a gloo backend when there is no GPU; stops
    a GPU run that would need mmcv CUDA ops the installed mmcv lacks."""
    try:
        check_mmcv_ops(cfg)
    except MmcvOpsError as e:
        raise ConfigError(str(e)) from None
    cfg.launcher = launcher
    if work_dir is not None:
        cfg.work_dir = work_dir
    elif cfg.get('work_dir') is None:
        cfg.work_dir = osp.join('work_dirs', osp.splitext(osp.basename(config_path))[0])
    if launcher != 'none' and not torch.cuda.is_available():  # CPU-only distributed runs (tests, CI)
        cfg.env_cfg = dict(cfg.get('env_cfg') or {}, dist_cfg=dict(backend='gloo'))
        cfg.model_wrapper_cfg = dict(type='MMDistributedDataParallel', **(cfg.get('model_wrapper_cfg') or {}),
                                     device_ids=None)
        if cfg.get('sync_bn'):
            print_log('sync_bn needs GPUs: BatchNorm stays per process on CPU', logger='current', level=logging.WARNING)
            cfg.sync_bn = None
    return cfg


def check_dataset_files(cfg: Config, splits) -> None:
    """Name the missing path and the layout the config expects when a dataset's files are absent.

    Looks at our ImageFolder datasets (``data_root`` / ``split``), at our SR datasets (built: every file
    paired and its size checked before training starts), at OpenMMLab-style datasets
    (``data_root`` + ``ann_file`` + ``data_prefix``, through wrappers such as RepeatDataset) and at
    evaluators' ``ann_file`` (COCO). ``splits``: the dataloaders the run will build, e.g. ('train', 'val').
    """
    for split in splits:
        dataset = (cfg.get(f'{split}_dataloader') or {}).get('dataset')
        while dataset is not None and 'dataset' in dataset:
            dataset = dataset.dataset
        if dataset is None:
            continue
        if dataset.get('type') == 'ImageFolderDataset':
            folder = osp.join(dataset.data_root, dataset.get('split', 'train'))
            if not osp.isdir(folder):
                raise ConfigError(
                    f'dataset folder {folder} does not exist ({split} data). Expected layout: {IMAGE_FOLDER_LAYOUT}. '
                    f'Set {split}_dataloader.dataset.data_root in the config or with --cfg-options.')
            continue
        if dataset.get('type') in ('SRPairedDataset', 'SRBenchmarkDataset'):
            try:
                DATASETS.build(dataset)
            except SRDataError as e:
                raise ConfigError(f'{e} ({split} data; set {split}_dataloader.dataset.data_root in the config or '
                                  f'with --cfg-options)') from None
            continue
        if 'data_prefix' not in dataset:
            continue
        root = dataset.get('data_root') or ''
        expected = [p for p in (dataset.get('ann_file'), *dataset.data_prefix.values()) if p]
        paths = [(osp.join(root, p), f'{split}_dataloader.dataset.data_root (or ann_file, data_prefix)')
                 for p in expected]
        evaluators = cfg.get(f'{split}_evaluator') or []
        for evaluator in evaluators if isinstance(evaluators, (list, tuple)) else [evaluators]:
            paths += [(evaluator.ann_file, f'{split}_evaluator.ann_file')] if evaluator.get('ann_file') else []
        for path, key in paths:
            if '://' not in path and not osp.exists(path):
                raise ConfigError(
                    f'{path} does not exist ({split} data). Expected layout: {", ".join(expected)} under '
                    f'data_root {root!r}. Set {key} in the config or with --cfg-options.')


def apply_thread_policy(cfg: Config, requested: Optional[int] = None) -> str:
    """Set torch's CPU threads (:mod:`nalaformer.threads`: OMP_NUM_THREADS, else ``requested``, else the config's
    ``env_cfg.threads``, else the cores other processes leave free) and cap each data loader's workers at the
    cores the process may use (more worker processes than cores cannot load faster); returns the lines to log."""
    if requested is None:
        requested = (cfg.get('env_cfg') or {}).get('threads')
    try:
        choice = apply_threads(requested)
    except ValueError as e:
        raise ConfigError(f'--threads / env_cfg.threads: {e}') from None
    lines = [choice.describe()]
    for name in ('train_dataloader', 'val_dataloader', 'test_dataloader'):
        loader = cfg.get(name)
        if loader and loader.get('num_workers', 0) > choice.cores:
            lines.append(f'{name}.num_workers: {loader.num_workers} -> {choice.cores} (the cores available)')
            loader.num_workers = choice.cores
    return '; '.join(lines)


def build_runner(cfg: Config) -> Runner:
    if cfg.launcher == 'pytorch' and not torch.cuda.is_available() and not torch.distributed.is_initialized():
        # mmengine's pytorch launcher always selects a CUDA device; on CPU-only machines (tests, CI)
        # the gloo process group is started here and the Runner finds it initialised.
        torch.distributed.init_process_group(backend='gloo')
    if 'runner_type' in cfg:
        return RUNNERS.build(cfg)
    return Runner.from_cfg(cfg)
