"""The data a config's training and validation dataloaders and evaluators read, written synthetic for a dry run.

Every dataset (inside wrappers such as RepeatDataset or ConcatDataset) gets its ``data_root`` moved into a
data folder (``data/coco/`` -> ``<folder>/data/coco``; absolute ``ann_file`` / ``data_prefix`` paths and the
evaluators' ``ann_file`` likewise), and the files its class reads are written there by
:mod:`nalaformer.datasets.dry_run_data`, in the layout its config names, at sizes realistic for the task:

================================  ===================================================================
dataset class (or a subclass)      what is written
================================  ===================================================================
ImageFolderDataset                 ``<split>/<class>/*``: one image per class of the model (or of
                                   ``classes``), 500x375 JPEG (input >= 128 px) or 28x28 grey PNG
SRPairedDataset                    HR PNGs of 480x360 (larger than twice the HR patch) + bicubic LR
SRBenchmarkDataset                 ``benchmark/<Set>/HR`` + ``LR_bicubic/X<scale>`` of 288x288 HR
mmseg's BaseSegDataset             images + label maps by the dataset's suffixes: Cityscapes 2048x1024
                                   PNG, others (ADE20K) 683x512; labels of the dataset's classes
mmdet's CocoDataset                640x480 JPEGs + an instances json with polygon masks, the categories
                                   named as the dataset's classes
================================  ===================================================================
"""
import inspect
import math
import shutil
from pathlib import Path, PurePath
from typing import Dict, List, Optional

from mmengine.config import Config
from mmengine.registry import DATASETS

from ..datasets.dry_run_data import write_coco, write_image_folder, write_segmentation, write_sr_pairs
from ..errors import ConfigError
from .launch import model_num_classes

__all__ = ['generate_data', 'dataset_leaves']

SEG_SIZES = {'CityscapesDataset': (2048, 1024)}  # (width, height); others: ADE20K's typical 683x512
SEG_SIZE = (683, 512)
SR_SIZE = (480, 360)  # DIV2K training HR: larger than twice the HR patch
BENCHMARK_SIZE = (288, 288)  # Set5's bird; Set5 and Set14 hold 256x256 to 720x576 images
COCO_SIZE = (640, 480)
TRAIN_IMAGES = 4  # samplers draw them again for more batches


def dataset_leaves(dataset) -> List[dict]:
    """The dataset configs that read files, below wrappers (``dataset=`` / ``datasets=[...]``)."""
    if not isinstance(dataset, dict):
        return []
    if 'dataset' in dataset:
        return dataset_leaves(dataset['dataset'])
    if 'datasets' in dataset:
        return [leaf for item in dataset['datasets'] for leaf in dataset_leaves(item)]
    return [dataset]


def _relative(path: str) -> PurePath:
    """``path`` without its anchor and ``..`` parts: where it goes inside the data folder."""
    return PurePath(*[p for p in PurePath(path or '').parts if p not in ('..', '.') and p != PurePath(path).anchor])


def _dataset_class(cfg: Config, leaf: dict) -> type:
    kind = leaf.get('type')
    if isinstance(kind, type):
        return kind
    with DATASETS.switch_scope_and_registry(cfg.get('default_scope')) as registry:
        cls = registry.get(kind)
    if cls is None:
        raise ConfigError(f'--dry-run: dataset type {kind!r} is not registered (scope {cfg.get("default_scope")!r})')
    return cls


def _default(cls: type, name: str):
    """The default of argument ``name`` of ``cls`` (or of the class it passes it on to)."""
    for klass in cls.__mro__:
        parameter = inspect.signature(klass.__init__).parameters.get(name)
        if parameter is not None and parameter.default is not inspect.Parameter.empty:
            return parameter.default
    return None


def _option(cls: type, leaf: dict, name: str):
    return leaf[name] if name in leaf else _default(cls, name)


def _classes(cls: type, leaf: dict) -> list:
    return list((leaf.get('metainfo') or {}).get('classes') or getattr(cls, 'METAINFO', {}).get('classes') or [])


def _in_folder(path: str, folder: Path) -> str:
    return str(folder / _relative(path))


def _relocate(leaf: dict, folder: Path) -> None:
    leaf['data_root'] = str(folder / _relative(leaf.get('data_root') or ''))
    if PurePath(str(leaf.get('ann_file') or '')).is_absolute():
        leaf['ann_file'] = str(folder / _relative(leaf['ann_file']))
    for key, value in (leaf.get('data_prefix') or {}).items():
        if isinstance(value, str) and PurePath(value).is_absolute():
            leaf['data_prefix'][key] = str(folder / _relative(value))


def _image_folder(cfg: Config, leaf: dict, count: int, seed: int) -> str:
    classes = leaf.get('classes')
    if not classes:
        num_classes = model_num_classes(cfg)
        if not num_classes:
            raise ConfigError('--dry-run: the ImageFolder dataset names no classes and the model no num_classes')
        classes = [f'class_{i:04d}' for i in range(num_classes)]
    size = leaf.get('input_size', 224)
    side = max(size) if isinstance(size, (list, tuple)) else size
    (width, height), suffix, grey = ((500, 375), '.JPEG', False) if side >= 128 else ((28, 28), '.png', True)
    folder = Path(leaf['data_root']) / leaf.get('split', 'train')
    n = write_image_folder(folder, classes, math.ceil(count / len(classes)), (width, height), suffix, grey, seed)
    return (f'{n} {"grey " if grey else ""}{width}x{height} {suffix.lstrip(".").upper()} images in {len(classes)} '
            f'class folders')


def _sr_paired(cls: type, leaf: dict, count: int, seed: int) -> str:
    scale, root = leaf['scale'], Path(leaf['data_root'])
    patch = _option(cls, leaf, 'patch_size') or 0
    size = (max(SR_SIZE[0], 2 * patch), max(SR_SIZE[1], 2 * patch))
    hr = root / _option(cls, leaf, 'hr_dir').format(scale=scale)
    lr = root / _option(cls, leaf, 'lr_dir').format(scale=scale)
    n = write_sr_pairs(hr, lr, scale, count, size, seed)
    return f'{n} {size[0]}x{size[1]} HR PNGs with x{scale} LR partners'


def _sr_benchmark(leaf: dict, count: int, seed: int) -> str:
    scale, root, sets = leaf['scale'], Path(leaf['data_root']), list(leaf.get('sets') or ['Set5'])
    per_set = math.ceil(count / len(sets))
    for i, name in enumerate(sets):
        folder = root / 'benchmark' / name
        write_sr_pairs(folder / 'HR', folder / 'LR_bicubic' / f'X{scale}', scale, per_set, BENCHMARK_SIZE, seed + i)
    width, height = BENCHMARK_SIZE
    return f'{per_set} {width}x{height} HR PNGs with x{scale} LR partners in benchmark set(s) {sets}'


def _segmentation(cls: type, leaf: dict, count: int, seed: int) -> str:
    root, prefix = Path(leaf['data_root']), leaf.get('data_prefix') or {}
    img_suffix, seg_suffix = _option(cls, leaf, 'img_suffix'), _option(cls, leaf, 'seg_map_suffix')
    classes = _classes(cls, leaf)
    if _option(cls, leaf, 'reduce_zero_label'):  # 0 is 'other' (ignored), 1..n the classes
        labels, background = range(1, len(classes) + 1), 0
    else:
        labels, background = range(len(classes)), 255
    size = SEG_SIZES.get(cls.__name__, SEG_SIZE)
    write_segmentation(root / prefix.get('img_path', ''), root / prefix.get('seg_map_path', ''), count, size,
                       img_suffix, seg_suffix, labels, background, seed)
    if leaf.get('ann_file'):  # a list of the image names (without suffix) to read
        ann = root / leaf['ann_file']
        ann.parent.mkdir(parents=True, exist_ok=True)
        ann.write_text(''.join(f'dryrun_{i:06d}\n' for i in range(count)))
    return (f'{count} {size[0]}x{size[1]} {img_suffix} images with {seg_suffix} label maps '
            f'({len(classes)} classes)')


def _coco(cls: type, leaf: dict, count: int, seed: int, written: Dict[str, Path]) -> str:
    root = Path(leaf['data_root'])
    ann = root / leaf['ann_file']
    classes = _classes(cls, leaf)
    if str(ann) in written:
        return f'the same annotations as above ({ann.name})'
    written[str(ann)] = ann
    write_coco(ann, root / (leaf.get('data_prefix') or {}).get('img', ''), classes, count, COCO_SIZE,
               seed=seed, first_image_id=1 + seed * 1000)
    return (f'{count} {COCO_SIZE[0]}x{COCO_SIZE[1]} JPEGs with polygon masks, {len(classes)} categories '
            f'({ann.name})')


def _write(cfg: Config, leaf: dict, count: int, seed: int, written: Dict[str, Path]) -> str:
    cls = _dataset_class(cfg, leaf)
    bases = {klass.__name__ for klass in cls.__mro__}
    if 'ImageFolderDataset' in bases:
        return _image_folder(cfg, leaf, count, seed)
    if 'SRPairedDataset' in bases:
        return _sr_paired(cls, leaf, count, seed)
    if 'SRBenchmarkDataset' in bases:
        return _sr_benchmark(leaf, count, seed)
    if 'BaseSegDataset' in bases:
        return _segmentation(cls, leaf, count, seed)
    if 'CocoDataset' in bases:
        return _coco(cls, leaf, count, seed, written)
    raise ConfigError(f'--dry-run cannot write data for dataset type {cls.__name__} (it writes ImageFolder, '
                      f'super-resolution, mmseg segmentation and COCO datasets)')


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
