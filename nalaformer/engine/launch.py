"""Shared by tools/train.py and tools/test.py: config loading with checked overrides, runner building.

Problems with the command line or the config raise :class:`ConfigError`, which the tools print as one
line; anything raised while training or testing keeps its traceback.
"""
import difflib
import inspect
import logging
import os.path as osp
import re
from typing import List, Optional, Sequence

import timm
import torch
from mmengine.config import Config
from mmengine.hooks import CheckpointHook
from mmengine.logging import print_log
from mmengine.registry import METRICS, RUNNERS
from mmengine.runner import Runner

from ..checkpoint import check_checkpoint_file
from ..errors import ConfigError, DatasetError
from ..mmcv_build import MmcvOpsError, check_mmcv_ops
from ..threads import apply_threads
from .datasets import dataset_class, dataset_leaves, dataset_support
from .model_spec import TimmModelSpec, UnknownModelError

_MISSING = object()
# Registries whose objects configs build from dicts with a ``type`` (the timm models of the task wrappers, which take
# ``**kwargs``, are checked by building them: check_model_keywords).
_REGISTRIES = ('OPTIMIZERS', 'OPTIM_WRAPPERS', 'HOOKS', 'PARAM_SCHEDULERS', 'DATASETS', 'DATA_SAMPLERS', 'METRICS',
               'VISUALIZERS', 'VISBACKENDS', 'LOOPS', 'LOG_PROCESSORS', 'TRANSFORMS', 'MODELS')
# Classes whose ``**kwargs`` go to a known function (mmengine's CheckpointHook: to Runner.save_checkpoint).
_FORWARDED_KWARGS = {CheckpointHook: Runner.save_checkpoint}
# mmengine Runner settings a config may leave out, with mmengine's default: ``--cfg-options compile=True`` is a
# setting, not a typo.
_RUNNER_DEFAULTS = {'compile': False}
# Keys mmengine takes out of such a dict before building (the optimizer wrapper's constructor settings).
_BUILDER_KEYS = {'_scope_', 'constructor', 'paramwise_cfg'}


def _expected_type(old, new) -> Optional[str]:
    """What a ``--cfg-options`` value replacing ``old`` must be, when ``new`` is not that; else None.

    Strings are not checked (mmengine's parser turns ``split=2017`` into a number and cannot be told
    otherwise), nor is anything replacing None. A single value may stand for a list of such values
    (``attn_types=nala``, ``input_size=32``) and a list of values for one (``input_size=[32,48]``).
    """
    if old is None or new is None or isinstance(old, str):
        return None
    if isinstance(new, (list, tuple)) and not isinstance(old, (list, tuple, dict)):
        return next((_expected_type(old, item) for item in new if _expected_type(old, item)), None)
    if isinstance(old, bool):
        return None if isinstance(new, (bool, str)) else 'True or False'
    if isinstance(old, (int, float)):
        return None if isinstance(new, (int, float)) and not isinstance(new, bool) else 'a number'
    if isinstance(old, dict):
        return None if isinstance(new, dict) else 'a dict (or None)'
    if isinstance(old, (list, tuple)):
        items = [item for item in old if item is not None]
        kinds = {type(item) if not isinstance(item, (int, float)) or isinstance(item, bool) else float
                 for item in items}
        if len(kinds) != 1:  # empty or mixed: nothing to compare with
            return None
        for item in new if isinstance(new, (list, tuple)) else [new]:
            expected = _expected_type(items[0], item)
            if expected:
                return f'{expected}, or a list of them'
    return None


# Ranges of well-known settings, by the last part of their key: (smallest value, whole numbers only).
_RANGES = {'batch_size': (1, True), 'max_epochs': (1, True), 'max_iters': (1, True), 'val_interval': (1, True),
           'num_workers': (0, True), 'lr': (0, False), 'weight_decay': (0, False), 'momentum': (0, False),
           'num_heads': (1, True), 'embed_dim': (1, True), 'embed_dims': (1, True), 'window_size': (1, True),
           'drop_path_rate': (0, False)}


def _range_problem(key: str, value) -> Optional[str]:
    """Why a number given for ``key`` cannot be meant (NaN anywhere; a batch size of 0, a negative lr, ...)."""
    values = value if isinstance(value, (list, tuple)) else [value]
    numbers = [v for v in values if isinstance(v, (int, float)) and not isinstance(v, bool)]
    if any(v != v for v in numbers):
        return 'a number, not NaN'
    minimum, whole = _RANGES.get(key.split('.')[-1], (None, False))
    if minimum is None:
        return None
    if any(v < minimum or v in (float('inf'), float('-inf')) or (whole and v != int(v)) for v in numbers):
        return f'{"a whole number" if whole else "a finite number"} >= {minimum}'
    return None


def _registered(registry, kind, scope: Optional[str]):
    """The class a config dict's ``type`` names in an mmengine registry or, for OpenMMLab configs, in that of the
    config's scope (``mmseg``, ``mmdet``); None when none is found."""
    if isinstance(kind, type):
        return kind
    if not isinstance(kind, str):
        return None
    for name in ([kind] if '.' in kind or not scope else [f'{scope}.{kind}', kind]):
        try:
            found = registry.get(name)
        except (KeyError, ImportError):
            continue
        if found is not None:
            return found
    return None


def _check_new_argument(key: str, type_name, name: str, scope: Optional[str] = None) -> None:
    """A ``--cfg-options`` key that adds argument ``name`` to a dict building ``type_name``: named with close
    names when the class (found in mmengine's registries, or those of the config's ``scope``) does not take it;
    the timm models of the task wrappers are checked by :func:`check_model_keywords`, classes taking
    ``**kwargs`` by themselves."""
    import mmengine.registry
    if name in _BUILDER_KEYS:
        return
    registries = [getattr(mmengine.registry, registry) for registry in _REGISTRIES]
    cls = next((found for found in (_registered(registry, type_name, scope) for registry in registries)
                if found is not None), None)
    if cls is None:
        return
    type_name = getattr(type_name, '__name__', type_name)
    try:
        parameters = dict(inspect.signature(cls).parameters)
        forwarded = next((to for base, to in _FORWARDED_KWARGS.items() if issubclass(cls, base)), None)
        if forwarded is not None:  # its **kwargs go to a known function: the arguments of both
            parameters = {k: p for k, p in {**parameters, **inspect.signature(forwarded).parameters}.items()
                          if p.kind != p.VAR_KEYWORD}
    except (TypeError, ValueError):
        return
    if name in parameters or any(p.kind == p.VAR_KEYWORD for p in parameters.values()):
        return
    known = [p for p in parameters if p not in ('self', 'args')]
    close = difflib.get_close_matches(name, known, n=3, cutoff=0.5)
    hint = f'did you mean {close}?' if close else f'its arguments are {known}'
    raise ConfigError(f"--cfg-options {key}: {type_name} takes no argument '{name}'; {hint}")


def _option_value(cfg: Config, key: str):
    """The config's value at a dotted ``--cfg-options`` key (``_MISSING`` for a new key inside a dict that
    builds an object); a key that does not exist is named with close matches."""
    node, path = cfg.to_dict(), []
    parts = key.split('.')
    for part in parts:
        if isinstance(node, (list, tuple)) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        elif isinstance(node, dict) and part in node:
            node = node[part]
        elif not path and part in _RUNNER_DEFAULTS and len(parts) == 1:
            node = _RUNNER_DEFAULTS[part]
        elif isinstance(node, dict) and 'type' in node:
            _check_new_argument(key, node['type'], part, cfg.get('default_scope'))
            return _MISSING  # a new argument (or dict of them) of the object the dict builds
        else:
            known = list(node.keys()) if isinstance(node, dict) else []
            close = difflib.get_close_matches(part, known, n=3)
            where = '.'.join(path) or 'the top level'
            hint = f'; did you mean {close}?' if close else f'; keys there: {sorted(known)[:20]}'
            raise ConfigError(f"--cfg-options {key}: no key '{part}' at {where}{hint}")
        path.append(part)
    return node


def check_cfg_options(cfg: Config, options: dict) -> None:
    """Reject ``--cfg-options`` keys that do not exist (naming close matches), values of another type than
    the config's (naming the key, the value and the type expected), NaN, and values out of the range of
    well-known settings (batch sizes, epochs, learning rates, ...).

    A new key is allowed only inside a dict that builds an object (has ``type``), whose
    constructor then validates it (e.g. ``model.kernel_kwargs.alpha=5``); anywhere else a typo would be
    silently ignored.
    """
    for key, value in options.items():
        old = _option_value(cfg, key)
        expected = (None if old is _MISSING else _expected_type(old, value)) or _range_problem(key, value)
        if expected:
            given = f'the text {value!r}' if isinstance(value, str) else repr(value)
            has = '' if old is _MISSING else f' (the config has {old!r})'
            raise ConfigError(f'--cfg-options {key}: expected {expected}{has}, got {given}')


def model_spec(cfg: Config) -> Optional[TimmModelSpec]:
    """Which part of ``cfg`` is the timm model, with which keywords (:mod:`nalaformer.engine.model_spec`): the
    first dict under ``model`` (breadth first: ``model``, ``model.backbone``, ``model.module.backbone``, ...)
    whose registered class implements ``timm_model_spec``, asked there; None when the config has none."""
    from mmengine.registry import MODELS
    queue = [('model.', cfg.get('model'))]
    while queue:
        prefix, node = queue.pop(0)
        if not isinstance(node, dict):
            continue
        wrapper = _registered(MODELS, node.get('type'), cfg.get('default_scope'))
        if hasattr(wrapper, 'timm_model_spec'):
            return wrapper.timm_model_spec(dict(node), prefix)
        queue += [(f'{prefix}{key}.', value) for key, value in node.items() if isinstance(value, dict)]
    return None


def _whole(value) -> bool:
    """Whether ``value`` is a whole number (an int, or a float without fraction), or a list of them."""
    if isinstance(value, (list, tuple)):
        return bool(value) and all(map(_whole, value))
    return isinstance(value, int) and not isinstance(value, bool) or isinstance(value, float) and value.is_integer()


def check_model_keywords(cfg: Config) -> None:
    """Build the config's timm model (:func:`model_spec`, whatever the wrapper) on the meta device (no memory, no
    weights, under a second) so that an unknown model name, an argument it does not take, or a value it
    rejects (e.g. a kernel keyword) is named before anything is written or built; the close names of a
    misspelt argument are given."""
    spec = model_spec(cfg)
    if spec is None:
        return
    prefix, arch, kwargs = spec.prefix, spec.name, spec.kwargs
    try:
        spec.meta_model()
        return
    except UnknownModelError:
        raise
    except (TypeError, ValueError, ArithmeticError) as e:
        error = e
    except (RuntimeError, NotImplementedError):
        return  # something the meta device cannot run: the real build will tell
    with torch.device('meta'):
        model_cls = type(timm.create_model(arch))
    parameters = inspect.signature(model_cls).parameters
    for key, value in kwargs.items():  # values of another type than the model's defaults, named first
        default = parameters[key].default if key in parameters else inspect.Parameter.empty
        expected = None if default is inspect.Parameter.empty else _expected_type(default, value)
        if expected:
            given = f'the text {value!r}' if isinstance(value, str) else repr(value)
            raise ConfigError(f'{prefix}{key}: expected {expected} ({model_cls.__name__}\'s default is {default!r}), '
                              f'got {given}')
    bad = re.search(r"unexpected keyword argument '(\w+)'", str(error))
    if bad:
        known = sorted((set(parameters) | spec.wrapper_args) - {'self', 'kwargs', 'model_kwargs'})
        close = difflib.get_close_matches(bad.group(1), known, n=3, cutoff=0.5)
        hint = f'did you mean {close}?' if close else f'its arguments are {known}'
        raise ConfigError(f"{prefix}{bad.group(1)}: {arch} ({model_cls.__name__}) takes no argument "
                          f"'{bad.group(1)}'; {hint}") from None
    if isinstance(error, ValueError):  # a value the model (or one of its attention kernels) rejects
        raise ConfigError(f'{prefix.rstrip(".")} ({arch}): {error}') from None
    for key, value in kwargs.items():  # a fraction where the model's default is a whole number (a size, a count)
        default = parameters[key].default if key in parameters else None
        if _whole(default) and not _whole(value) and _expected_type(default, value) is None:
            many = ', or a list of them' if isinstance(value, (list, tuple)) else ''
            raise ConfigError(f'{prefix}{key}: expected a whole number{many} ({model_cls.__name__}\'s default is '
                              f'{default!r}), got {value!r}') from None
    raise ConfigError(f'{prefix.rstrip(".")} ({arch}) cannot be built with these arguments: {error}') from None


def load_config(path: str, cfg_options: Optional[dict] = None) -> Config:
    """A config file with ``--cfg-options`` merged in, keys and value types checked, and its model's
    keywords checked against the model (:func:`check_model_keywords`)."""
    if not osp.isfile(path):
        raise ConfigError(f'config file {path} does not exist')
    cfg = Config.fromfile(path)
    if cfg_options:
        check_cfg_options(cfg, cfg_options)
        cfg.merge_from_dict(cfg_options)
    check_model_keywords(cfg)
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
    fit_dataloaders(cfg)
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


DATALOADERS = ('train_dataloader', 'val_dataloader', 'test_dataloader')


def fit_dataloaders(cfg: Config) -> None:
    """Make data loader settings that only hold with worker processes follow a ``num_workers=0`` override (the
    first thing a user debugging on a CPU types): ``persistent_workers`` and ``prefetch_factor`` are dropped,
    with a log line, instead of torch refusing them."""
    for name in DATALOADERS:
        loader = cfg.get(name)
        if loader and loader.get('pin_memory') and not torch.cuda.is_available():
            loader.pin_memory = False  # nothing to pin for; torch warns about it in every epoch
        if not loader or loader.get('num_workers', 0) != 0:
            continue
        dropped = [key for key in ('persistent_workers', 'prefetch_factor') if loader.get(key)]
        for key in dropped:
            loader.pop(key)
        if dropped:
            print_log(f'{name}.num_workers=0: loading in the main process, so {" and ".join(dropped)} '
                      f'(which need worker processes) are off', logger='current', level=logging.INFO)


def check_openmmlab_files(cfg: Config, split: str, dataset: dict) -> None:
    """The files an OpenMMLab-style dataset (``data_root`` + ``ann_file`` + ``data_prefix``) and the split's
    evaluators (``ann_file``, COCO) read exist; an error naming the path, the layout and the key to set."""
    if 'data_prefix' not in dataset:
        return
    root = dataset.get('data_root') or ''
    expected = [p for p in (dataset.get('ann_file'), *dataset['data_prefix'].values()) if p]
    paths = [(osp.join(root, p), f'{split}_dataloader.dataset.data_root (or ann_file, data_prefix)') for p in expected]
    evaluators = cfg.get(f'{split}_evaluator') or []
    for evaluator in evaluators if isinstance(evaluators, (list, tuple)) else [evaluators]:
        paths += [(evaluator.ann_file, f'{split}_evaluator.ann_file')] if evaluator.get('ann_file') else []
    for path, key in paths:
        if '://' not in path and not osp.exists(path):
            raise DatasetError(
                f'{path} does not exist ({split} data). Expected layout: {", ".join(expected)} under '
                f'data_root {root!r}. Set {key} in the config or with --cfg-options.')


def check_dataset_files(cfg: Config, splits, trained_classes: Optional[Sequence[str]] = None,
                        source: str = 'the checkpoint') -> None:
    """Check the data a run reads before anything is built or written: each dataset of the ``splits`` (e.g.
    ('train', 'val'); below wrappers such as RepeatDataset) by its task plug-in's ``check_files``
    (:mod:`nalaformer.engine.datasets`), else by :func:`check_openmmlab_files`; then each plug-in's
    ``check_run`` once, with the classes the weights to evaluate were trained with (``trained_classes``, read
    from ``source``), when known."""
    run_checks = []
    for split in splits:
        for dataset in dataset_leaves((cfg.get(f'{split}_dataloader') or {}).get('dataset')):
            support = dataset_support(dataset_class(cfg, dataset))
            if support is not None and support.check_files is not None:
                support.check_files(cfg, split, dataset)
            else:
                check_openmmlab_files(cfg, split, dataset)
            if support is not None and support.check_run is not None and support.check_run not in run_checks:
                run_checks.append(support.check_run)
    for check in run_checks:
        check(cfg, splits, trained_classes, source)


def report_lines(cfg: Config, metrics: dict) -> List[str]:
    """Lines that present ``metrics`` of a test run to a reader, from the evaluators of ``cfg.test_evaluator``
    that define ``report_lines(metrics)`` (super-resolution: one line per benchmark set); [] otherwise."""
    evaluators = cfg.get('test_evaluator') or []
    lines = []
    for evaluator in evaluators if isinstance(evaluators, (list, tuple)) else [evaluators]:
        metric = _registered(METRICS, evaluator.get('type'), cfg.get('default_scope'))
        if hasattr(metric, 'report_lines'):
            lines += metric.report_lines(metrics)
    return lines


def check_starting_weights(cfg: Config) -> None:
    """Name the config key of a checkpoint a training run starts from when the file is missing, is no checkpoint or
    belongs to another model, before anything is written: the model's ``pretrained`` or a backbone's ``init_cfg``
    (asked of the wrapper of the config's timm model, :func:`model_spec`: its ``check_starting_weights``) and
    ``load_from`` (read; a whole-runner checkpoint may fit partly, as a detector's of other classes)."""
    spec = model_spec(cfg)
    check = getattr(spec.wrapper, 'check_starting_weights', None) if spec is not None else None
    if check is not None:
        check(spec.part(cfg), spec.prefix)
    load_from = cfg.get('load_from')
    if load_from and not cfg.get('resume') and '://' not in str(load_from):
        check_checkpoint_file(load_from, 'load_from')


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
    for name in DATALOADERS:
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
