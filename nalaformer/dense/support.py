"""What the runner core asks of mmseg's and mmdet's datasets (:mod:`nalaformer.engine.datasets`): synthetic images
with label maps, or with COCO instance annotations, in the dataset's layout for ``--dry-run`` (their files are
checked by the core's OpenMMLab check)."""
from pathlib import Path

from mmengine.config import Config

from ..datasets.dry_run_data import write_coco, write_segmentation
from ..engine.datasets import DatasetSupport, dataset_classes, dataset_class, dataset_option, register_dataset_support

__all__ = ['register_library_datasets']

SEG_SIZES = {'CityscapesDataset': (2048, 1024)}  # (width, height)
SEG_SIZE = (683, 512)  # ADE20K's typical image
COCO_SIZE = (640, 480)


def write_segmentation_data(cfg: Config, dataset: dict, count: int, seed: int, written: dict) -> str:
    """Images and label maps named by the dataset's suffixes, of the dataset's classes (Cityscapes 2048x1024)."""
    cls = dataset_class(cfg, dataset)
    root, prefix = Path(dataset['data_root']), dataset.get('data_prefix') or {}
    img_suffix, seg_suffix = dataset_option(cls, dataset, 'img_suffix'), dataset_option(cls, dataset, 'seg_map_suffix')
    classes = dataset_classes(cls, dataset)
    if dataset_option(cls, dataset, 'reduce_zero_label'):  # 0 is 'other' (ignored), 1..n the classes
        labels, background = range(1, len(classes) + 1), 0
    else:
        labels, background = range(len(classes)), 255
    size = SEG_SIZES.get(cls.__name__, SEG_SIZE)
    write_segmentation(root / prefix.get('img_path', ''), root / prefix.get('seg_map_path', ''), count, size,
                       img_suffix, seg_suffix, labels, background, seed)
    if dataset.get('ann_file'):  # a list of the image names (without suffix) to read
        ann = root / dataset['ann_file']
        ann.parent.mkdir(parents=True, exist_ok=True)
        ann.write_text(''.join(f'dryrun_{i:06d}\n' for i in range(count)))
    return f'{count} {size[0]}x{size[1]} {img_suffix} images with {seg_suffix} label maps ({len(classes)} classes)'


def write_coco_data(cfg: Config, dataset: dict, count: int, seed: int, written: dict) -> str:
    """640x480 JPEGs and an instances json with polygon masks, the categories named as the dataset's classes."""
    root = Path(dataset['data_root'])
    ann = root / dataset['ann_file']
    if str(ann) in written:
        return f'the same annotations as above ({ann.name})'
    written[str(ann)] = ann
    classes = dataset_classes(dataset_class(cfg, dataset), dataset)
    write_coco(ann, root / (dataset.get('data_prefix') or {}).get('img', ''), classes, count, COCO_SIZE,
               seed=seed, first_image_id=1 + seed * 1000)
    return f'{count} {COCO_SIZE[0]}x{COCO_SIZE[1]} JPEGs with polygon masks, {len(classes)} categories ({ann.name})'


def register_library_datasets(scope: str) -> None:
    """Serve the datasets of ``scope`` ('mmseg' or 'mmdet', imported by the caller)."""
    if scope == 'mmseg':
        from mmseg.datasets import BaseSegDataset
        register_dataset_support(BaseSegDataset, DatasetSupport(write_data=write_segmentation_data))
    else:
        from mmdet.datasets import CocoDataset
        register_dataset_support(CocoDataset, DatasetSupport(write_data=write_coco_data))
