"""What the runner core asks of a task's datasets, and the task plug-ins answer.

The core checks a run's data before it touches the work dir, and ``--dry-run`` writes synthetic data in a
config's layout, without knowing any task: a task plug-in registers a :class:`DatasetSupport` for its dataset
classes (its own, or a library's such as mmseg's ``BaseSegDataset``); a class is served by the support of its
nearest registered base class. Datasets without one get the OpenMMLab check (``data_root`` + ``ann_file`` +
``data_prefix`` exist) and no dry-run data.
"""
import inspect
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Sequence

from mmengine.config import Config
from mmengine.registry import DATASETS

from ..errors import ConfigError

__all__ = ['DatasetSupport', 'register_dataset_support', 'dataset_support', 'dataset_leaves', 'dataset_class',
           'dataset_option', 'dataset_classes']


@dataclass(frozen=True)
class DatasetSupport:
    """A task's answers for its dataset classes; each one optional.

    Attributes:
        check_files: ``(cfg, split, dataset) -> None``: raise a :class:`~nalaformer.errors.DatasetError` naming the
            missing or bad file and the config key to set, before anything is built (``dataset``: the config dict
            of one dataset of the ``{split}_dataloader``, below wrappers).
        check_run: ``(cfg, splits, trained_classes, source) -> None``: checks across the splits a run builds (e.g.
            their class lists agree with each other, the model and the checkpoint ``source`` was trained with),
            called once per run after every ``check_files``.
        write_data: ``(cfg, dataset, count, seed, written) -> str``: for ``--dry-run``, write ``count`` synthetic
            samples where ``dataset`` (its ``data_root`` already in the temporary folder) reads them, in its
            layout; returns a line saying what was written. ``written``: {path: ...} of files written for
            earlier datasets of the run (annotation files shared by splits are written once).
    """
    check_files: Optional[Callable] = None
    check_run: Optional[Callable] = None
    write_data: Optional[Callable] = None


SUPPORT: Dict[type, DatasetSupport] = {}


def register_dataset_support(dataset_cls: type, support: DatasetSupport) -> None:
    """Serve ``dataset_cls`` and its subclasses with ``support`` (a plug-in calls this when it is imported)."""
    SUPPORT[dataset_cls] = support


def dataset_support(dataset_cls: type) -> Optional[DatasetSupport]:
    """The support registered for ``dataset_cls`` or its nearest base class, or None."""
    return next((SUPPORT[klass] for klass in dataset_cls.__mro__ if klass in SUPPORT), None)


def dataset_leaves(dataset) -> List[dict]:
    """The dataset configs that read files, below wrappers (``dataset=`` / ``datasets=[...]``)."""
    if not isinstance(dataset, dict):
        return []
    if 'dataset' in dataset:
        return dataset_leaves(dataset['dataset'])
    if 'datasets' in dataset:
        return [leaf for item in dataset['datasets'] for leaf in dataset_leaves(item)]
    return [dataset]


def dataset_class(cfg: Config, dataset: dict) -> type:
    """The registered class a dataset config builds (in the config's default scope)."""
    kind = dataset.get('type')
    if isinstance(kind, type):
        return kind
    with DATASETS.switch_scope_and_registry(cfg.get('default_scope')) as registry:
        cls = registry.get(kind)
    if cls is None:
        raise ConfigError(f'dataset type {kind!r} is not registered (scope {cfg.get("default_scope")!r}): import '
                          f'its task plug-in in the config, e.g. custom_imports = dict(imports=['
                          f'\'nalaformer.classification\'])  (or nalaformer.sr, nalaformer.dense, your own)')
    return cls


def dataset_option(cls: type, dataset: dict, name: str):
    """Argument ``name`` of a dataset config: its value, else the default of ``cls`` (or of the class it passes
    the argument on to)."""
    if name in dataset:
        return dataset[name]
    for klass in cls.__mro__:
        parameter = inspect.signature(klass.__init__).parameters.get(name)
        if parameter is not None and parameter.default is not inspect.Parameter.empty:
            return parameter.default
    return None


def dataset_classes(cls: type, dataset: dict) -> Sequence[str]:
    """The class names an OpenMMLab dataset config reads (its ``metainfo``, else the class's ``METAINFO``)."""
    return list((dataset.get('metainfo') or {}).get('classes') or getattr(cls, 'METAINFO', {}).get('classes') or [])
