"""ImageFolder datasets with timm transforms (folders checked when built, unreadable training images
replaced and handed to :class:`~nalaformer.engine.hooks.UnreadableImageHook`), and timm's repeated-augmentation
sampler."""
import logging
from pathlib import Path
from typing import Optional

from mmengine.dist import get_dist_info
from mmengine.logging import print_log
from mmengine.registry import DATA_SAMPLERS, DATASETS
from PIL import Image
from timm.data import ImageDataset
from timm.data.distributed_sampler import RepeatAugSampler as TimmRepeatAugSampler

from ..errors import DatasetError
from ..images import rgb_image
from .augment import create_transform
from .dataset_check import check_split, scan_split

MAX_SUBSTITUTES = 10  # readable images looked for after an unreadable one
LAYOUT = '<data_root>/<split>/<class_name>/<image>.{jpg,jpeg,png,...} (ImageNet: <root>/train/n01440764/*.JPEG)'


@DATASETS.register_module()
class ImageFolderDataset:
    """``data_root/split`` in ImageFolder layout, transformed by ``timm.data.create_transform`` (with Posterize
    defined at every magnitude: :mod:`nalaformer.classification.augment`).

    Args:
        data_root: dataset root. split: sub-folder ('train', 'val', ...).
        input_size: crop size (int or (H, W)). is_training: train augmentation (default: split == 'train').
        transform: further ``create_transform`` arguments (auto_augment, re_prob, crop_pct, ...).
        classes: the class map: class names in index order. Every class folder must be one of them (a split
            may lack some, e.g. a val split without images of a class); without it the split's class folders,
            in timm's order, are the classes, and every split must have the same ones.

    The folder is checked when the dataset is built (:func:`~nalaformer.engine.dataset_check.check_split`):
    images outside class folders or in sub-folders of them, and empty class folders, are errors naming
    the folder; what is read and what is not is logged. 16-bit images are scaled to 8 bits (:func:`rgb_image`).

    ``skip_unreadable`` (default: when training): an image that cannot be read is replaced by the next
    readable one and items carry ``unreadable`` (its path, or ''), which :class:`UnreadableImageHook` counts,
    logs and limits. Otherwise (evaluation) an unreadable image stops the run, naming it: a metric over other
    images than asked for would be a wrong answer. Items are ``dict(inputs=(3, H, W) float tensor,
    data_samples=class index[, unreadable=path or ''])``.
    """

    def __init__(self, data_root: str, split: str = 'train', input_size=224, is_training: Optional[bool] = None,
                 transform: Optional[dict] = None, classes: Optional[list] = None,
                 skip_unreadable: Optional[bool] = None):
        folder = Path(data_root) / split
        if not folder.is_dir():
            raise DatasetError(
                f'dataset folder {folder} does not exist. Expected layout: {LAYOUT}. '
                f'Set the data root with --cfg-options train_dataloader.dataset.data_root=... '
                f'(and val_dataloader / test_dataloader).')
        contents = scan_split(folder)
        check_split(contents, classes)
        print_log(contents.describe(), logger='current', level=logging.INFO)
        self.is_training = split == 'train' if is_training is None else is_training
        self.skip_unreadable = self.is_training if skip_unreadable is None else skip_unreadable
        transform = create_transform(input_size, is_training=self.is_training, **(transform or {}))
        classes = tuple(classes) if classes is not None else tuple(contents.classes)
        self.dataset = ImageDataset(str(folder), transform=transform,
                                    class_map={name: i for i, name in enumerate(classes)})
        self.metainfo = dict(classes=classes)

    def __len__(self) -> int:
        return len(self.dataset)

    def load(self, index: int) -> dict:
        """Item ``index``; an image that cannot be read raises OSError naming its path."""
        file, target = self.dataset.reader[index]
        path = self.dataset.reader.filename(index, absolute=True)
        try:
            with file, Image.open(file) as image:
                image = rgb_image(image)
        except (OSError, ValueError) as e:
            raise OSError(f'cannot read image {path} (item {index}): {e}. Replace or remove the file.') from e
        return dict(inputs=self.dataset.transform(image), data_samples=target)

    def __getitem__(self, index: int) -> dict:
        if not self.skip_unreadable:
            return self.load(index)
        unreadable = ''  # collated into a list of strings
        for attempt in range(MAX_SUBSTITUTES + 1):
            try:
                return dict(self.load((index + attempt) % len(self)), unreadable=unreadable)
            except OSError:
                unreadable = unreadable or str(self.dataset.reader.filename(index, absolute=True))
        raise OSError(f'cannot read image {unreadable} nor the {MAX_SUBSTITUTES} images after it in '
                      f'{self.dataset.reader.root}: is the dataset folder damaged?')


@DATA_SAMPLERS.register_module()
class RepeatAugSampler(TimmRepeatAugSampler):
    """timm's repeated augmentation (each image ``num_repeats`` times per epoch across ranks).

    ``seed`` is accepted because mmengine passes it to every sampler; timm seeds the shuffle by epoch.
    """

    def __init__(self, dataset, num_repeats: int = 3, shuffle: bool = True, seed: Optional[int] = None):
        rank, world_size = get_dist_info()
        super().__init__(dataset, num_replicas=world_size, rank=rank, shuffle=shuffle, num_repeats=num_repeats)
