"""What the runner core asks of ImageFolder datasets (:mod:`nalaformer.engine.datasets`): their folders checked
before a run, their class lists compared across splits, the model and the checkpoint, and synthetic class folders
for ``--dry-run``."""
import math
import os
import os.path as osp
from pathlib import Path
from typing import Optional, Sequence

from mmengine.config import Config

from ..datasets.dry_run_data import write_image_folder
from ..engine.datasets import DatasetSupport, dataset_leaves, register_dataset_support
from ..engine.launch import model_spec
from ..errors import ConfigError, DatasetError
from .data import LAYOUT, ImageFolderDataset
from .dataset_check import check_split, class_folders, compare_classes, scan_split

__all__ = ['model_num_classes']


def model_num_classes(cfg: Config) -> Optional[int]:
    """The number of classes of a classification config's model (its ``num_classes``, else the timm model's
    default, read off a meta-device build); None for models without classes."""
    spec = model_spec(cfg)
    if spec is None:
        return None
    return spec.kwargs['num_classes'] if 'num_classes' in spec.kwargs else getattr(spec.meta_model(), 'num_classes',
                                                                                     None)


def image_folder(cfg: Config, split: str) -> Optional[dict]:
    """The ImageFolderDataset config of a split's dataloader (below dataset wrappers), or None."""
    leaves = dataset_leaves((cfg.get(f'{split}_dataloader') or {}).get('dataset'))
    return next((leaf for leaf in leaves if leaf.get('type') in ('ImageFolderDataset', ImageFolderDataset)), None)


def split_folder(dataset: dict) -> str:
    return osp.join(dataset['data_root'], dataset.get('split', 'train'))


def check_files(cfg: Config, split: str, dataset: dict) -> None:
    folder = split_folder(dataset)
    if not osp.isdir(folder):
        raise DatasetError(f'dataset folder {folder} does not exist ({split} data). Expected layout: {LAYOUT}. Set '
                           f'{split}_dataloader.dataset.data_root in the config or with --cfg-options.')


def check_full_batch(cfg: Config, folder: str, images: int) -> None:
    """A training loader that drops incomplete batches (``drop_last``, as the release's) must get one full batch
    per process, or an epoch would train on nothing."""
    loader = cfg.train_dataloader
    processes = int(os.environ.get('WORLD_SIZE', '1'))
    if loader.get('drop_last') and images < loader.batch_size * processes:
        raise DatasetError(
            f'the training data {folder} has {images} images, fewer than one batch of train_dataloader.batch_size='
            f'{loader.batch_size} per process x {processes} processes, and train_dataloader.drop_last=True drops '
            f'incomplete batches: an epoch would train on nothing. Set a smaller train_dataloader.batch_size, or '
            f'train_dataloader.drop_last=False')


def check_run(cfg: Config, splits: Sequence[str], trained_classes: Optional[Sequence[str]], source: str) -> None:
    """Each ImageFolder split the run builds checked (:func:`check_split`); their class lists (the class map
    when one is given, else the class folders) equal to each other, to the training split's when only
    evaluating, to those the checkpoint was trained with, and in number to the model's ``num_classes``."""
    lists = []  # (what, classes)
    for split in splits:
        dataset = image_folder(cfg, split)
        if dataset is None:
            continue
        folder = split_folder(dataset)
        contents = scan_split(folder)
        check_split(contents, dataset.get('classes'))  # the dataset logs what it reads when it is built
        if split == 'train':
            check_full_batch(cfg, folder, sum(contents.images.values()))
        lists.append((f'the {split} data {folder}', list(dataset.get('classes') or contents.classes)))
    if not lists:
        return
    train = image_folder(cfg, 'train')
    if 'train' not in splits and train is not None:  # evaluating: the classes are those of training
        folder = split_folder(train)
        if train.get('classes') or osp.isdir(folder):
            lists.append((f'the training data {folder}', list(train.get('classes') or class_folders(folder))))
    if trained_classes:
        lists.append((f'the classes {source} was trained with', list(trained_classes)))
    for what, classes in lists[1:]:
        compare_classes(lists[0][0], lists[0][1], what, classes)
    num_classes = model_num_classes(cfg)
    what, classes = lists[0]
    if num_classes is not None and num_classes != len(classes):
        raise DatasetError(
            f'{what} has {len(classes)} classes but the model has num_classes={num_classes}: set --cfg-options '
            f'model.num_classes={len(classes)} (a new classifier when fine-tuning), or check the data folder')


def write_data(cfg: Config, dataset: dict, count: int, seed: int, written: dict) -> str:
    """One image per class of the model (or of ``classes``), at least ``count``: 500x375 JPEGs for inputs of
    128 px and more, else 28x28 grey PNGs (Fashion-MNIST)."""
    classes = dataset.get('classes')
    if not classes:
        num_classes = model_num_classes(cfg)
        if not num_classes:
            raise ConfigError('--dry-run: the ImageFolder dataset names no classes and the model no num_classes')
        classes = [f'class_{i:04d}' for i in range(num_classes)]
    size = dataset.get('input_size', 224)
    side = max(size) if isinstance(size, (list, tuple)) else size
    (width, height), suffix, grey = ((500, 375), '.JPEG', False) if side >= 128 else ((28, 28), '.png', True)
    n = write_image_folder(Path(split_folder(dataset)), classes, math.ceil(count / len(classes)), (width, height),
                           suffix, grey, seed)
    return (f'{n} {"grey " if grey else ""}{width}x{height} {suffix.lstrip(".").upper()} images in {len(classes)} '
            f'class folders')


register_dataset_support(ImageFolderDataset, DatasetSupport(check_files, check_run, write_data))
