"""ImageFolder datasets with timm transforms, and timm's repeated-augmentation sampler."""
from pathlib import Path
from typing import Optional

from mmengine.dist import get_dist_info
from PIL import Image
from mmengine.registry import DATA_SAMPLERS, DATASETS
from timm.data import ImageDataset, create_transform
from timm.data.distributed_sampler import RepeatAugSampler as TimmRepeatAugSampler

LAYOUT = '<data_root>/<split>/<class_name>/<image>.{jpg,jpeg,png,...} (ImageNet: <root>/train/n01440764/*.JPEG)'


@DATASETS.register_module()
class ImageFolderDataset:
    """``data_root/split`` in ImageFolder layout, transformed by ``timm.data.create_transform``.

    Args:
        data_root: dataset root. split: sub-folder ('train', 'val', ...).
        input_size: crop size (int or (H, W)). is_training: train augmentation (default: split == 'train').
        transform: further ``create_transform`` arguments (auto_augment, re_prob, crop_pct, ...).
        classes: expected class names; the folder must hold exactly these (fine-tuning safety).

    Items are ``dict(inputs=(3, H, W) float tensor, data_samples=class index)``. An image that
    cannot be read raises an error naming its path (timm's dataset would skip it, naming its index).
    """

    def __init__(self, data_root: str, split: str = 'train', input_size=224, is_training: Optional[bool] = None,
                 transform: Optional[dict] = None, classes: Optional[list] = None):
        folder = Path(data_root) / split
        if not folder.is_dir():
            raise FileNotFoundError(
                f'dataset folder {folder} does not exist. Expected layout: {LAYOUT}. '
                f'Set the data root with --cfg-options train_dataloader.dataset.data_root=... '
                f'(and val_dataloader / test_dataloader).')
        self.is_training = split == 'train' if is_training is None else is_training
        transform = create_transform(input_size, is_training=self.is_training, **(transform or {}))
        try:
            self.dataset = ImageDataset(str(folder), transform=transform)
        except RuntimeError as e:  # timm's reader found no images
            raise FileNotFoundError(f'no images found under {folder}. Expected layout: {LAYOUT}') from e
        class_to_idx = self.dataset.reader.class_to_idx
        if classes is not None and list(classes) != sorted(class_to_idx):
            raise ValueError(f'{folder} has classes {sorted(class_to_idx)[:10]}, expected {list(classes)[:10]}')
        self.metainfo = dict(classes=tuple(sorted(class_to_idx, key=class_to_idx.get)))

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index: int) -> dict:
        file, target = self.dataset.reader[index]
        path = self.dataset.reader.filename(index, absolute=True)
        try:
            with file, Image.open(file) as image:
                image = image.convert('RGB')
        except (OSError, ValueError) as e:
            raise OSError(f'cannot read image {path} (item {index}): {e}. Replace or remove the file.') from e
        return dict(inputs=self.dataset.transform(image), data_samples=target)


@DATA_SAMPLERS.register_module()
class RepeatAugSampler(TimmRepeatAugSampler):
    """timm's repeated augmentation (each image ``num_repeats`` times per epoch across ranks).

    ``seed`` is accepted because mmengine passes it to every sampler; timm seeds the shuffle by epoch.
    """

    def __init__(self, dataset, num_repeats: int = 3, shuffle: bool = True, seed: Optional[int] = None):
        rank, world_size = get_dist_info()
        super().__init__(dataset, num_replicas=world_size, rank=rank, shuffle=shuffle, num_repeats=num_repeats)
