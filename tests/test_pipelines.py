"""Every shipped training pipeline applied to thousands of real-pixel samples under fixed seeds: nothing raises,
nothing is replaced (unreadable-image substitution is off; mmengine's re-draw of a sample whose pipeline gave
nothing is bypassed), every sample has the shape the config asks for.

The configs are read from configs/ (every file but _base_/); configs whose training pipelines are identical
share one run. The photographs are scikit-image's (tests/real_images.py); segmentation and detection data take
the dry run's layouts (:mod:`nalaformer.engine.dry_run_layouts`, the task plug-ins' ``write_data``) with every image replaced by a photograph."""
import json
import random
from collections import defaultdict
from pathlib import Path

import numpy as np
import pytest
import torch
from mmengine.config import Config
from mmengine.registry import DATASETS, DefaultScope
from PIL import Image

from nalaformer.classification import ImageFolderDataset, augment
from nalaformer.engine.datasets import dataset_leaves
from nalaformer.engine.dry_run_layouts import generate_data
from nalaformer.sr import SRPairedDataset
from real_images import photos, random_crop, write_photo_imagefolder

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = sorted(p for p in (ROOT / 'configs').rglob('*.py') if '_base_' not in p.parts)
SAMPLES = 4000  # the release's RandAugment reached 0-bit Posterize on about 1 sample in 450
DENSE_SAMPLES = 1000  # mmseg / mmdet pipelines: 20-250 ms a sample (Cityscapes 2048x1024 the slowest)
PLACE = ('data_root', 'split', 'classes', 'ann_file', 'data_prefix', 'metainfo')  # where the data are, not how


TRAIN_DATASETS = {path: dataset_leaves(Config.fromfile(str(path)).train_dataloader.dataset.to_dict())[0]
                  for path in CONFIGS}


def train_datasets(kinds):
    """{pipeline as JSON: [config paths]} of the configs whose training dataset type is one of ``kinds``."""
    found = defaultdict(list)
    for path, dataset in TRAIN_DATASETS.items():
        if dataset.get('type') in kinds:
            pipeline = {k: v for k, v in dataset.items() if k not in (*PLACE, 'type')}
            found[json.dumps(pipeline, sort_keys=True)].append(path)
    return found


CLASSIFICATION = train_datasets({'ImageFolderDataset'})
SUPER_RESOLUTION = train_datasets({'SRPairedDataset'})
DENSE = train_datasets({'ADE20KDataset', 'CityscapesDataset', 'CocoDataset'})


def names(group: dict):
    """A test id: the first config of the group and how many more share its pipeline."""
    return lambda key: group[key][0].stem + (f'+{len(group[key]) - 1}' if len(group[key]) > 1 else '')


def seed_everything(seed: int = 0) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def test_every_shipped_config_is_covered():
    """A config whose training data is neither kind (a new task) must get its pipeline test here."""
    covered = {p.stem for group in (CLASSIFICATION, SUPER_RESOLUTION, DENSE) for paths in group.values()
               for p in paths}
    assert covered == {p.stem for p in CONFIGS}
    assert len(DENSE) >= 4  # ADE20K, Cityscapes, COCO 1x, COCO 3x multi-scale
    assert {'nalaformer-t_8xb128_in1k', 'nalaformer-t_in1k-pre_1xb64-50e_imagefolder',
            'nalaformer-t_in1k-pre_8xb64-30e_in1k-384px', 'nala-swin-t_table5-table6-nala_8xb128-300e_in1k'} <= covered


@pytest.fixture(scope='module')
def photo_folder(tmp_path_factory):
    return write_photo_imagefolder(tmp_path_factory.mktemp('photos'), per_class=6)


@pytest.mark.slow
@pytest.mark.parametrize('pipeline', sorted(CLASSIFICATION), ids=names(CLASSIFICATION))
def test_classification_pipeline(pipeline, photo_folder, monkeypatch):
    settings = json.loads(pipeline)
    zero_bits = []

    def counted_posterize(image, bits_to_keep, **kwargs):
        zero_bits.extend([bits_to_keep] if bits_to_keep == 0 else [])
        return posterize(image, bits_to_keep, **kwargs)

    posterize = augment.posterize
    monkeypatch.setattr(augment, 'posterize', counted_posterize)
    dataset = ImageFolderDataset(str(photo_folder), 'train', skip_unreadable=False, **settings)
    size = settings.get('input_size', 224)
    size = (size, size) if isinstance(size, int) else tuple(size[-2:])
    seed_everything()
    for i in range(SAMPLES):
        item = dataset[i % len(dataset)]
        assert item['inputs'].shape == (3, *size) and torch.isfinite(item['inputs']).all()
    if 'inc1' in str(settings.get('transform', {}).get('auto_augment')):  # the case that raised on Pillow 13
        assert zero_bits, f'{SAMPLES} samples never reached 0-bit Posterize: the test lost its edge case'


def test_posterize_keeps_the_top_bits_at_every_depth():
    """0 bits: black (Pillow <= 12.3's result, which Pillow 13 refuses); 8: unchanged; else the top bits."""
    from PIL import Image
    for name in ('coffee', 'camera'):  # RGB and grey
        pixels = photos()[name]
        for bits in range(9):
            out = np.asarray(augment.posterize(Image.fromarray(pixels), bits))
            assert out.shape == pixels.shape
            np.testing.assert_array_equal(out, pixels & np.uint8((0xFF << (8 - bits)) & 0xFF))


def test_shipped_randaugment_never_raises_at_any_magnitude():
    """Every operation of the recipe's policy at every magnitude the noise can draw (0-10, where it is clipped),
    on a real photograph."""
    from PIL import Image
    image = Image.fromarray(photos()['chelsea'])
    transform = augment.create_transform(224, is_training=True, auto_augment='rand-m9-mstd0.5-inc1')
    ops = transform.transforms[2].ops
    assert 'PosterizeIncreasing' in {op.name for op in ops}
    for op in ops:
        op.prob, op.magnitude_std = 1.0, 0.0
        for magnitude in np.linspace(0, 10, 41):
            op.magnitude = magnitude
            assert op(image).size == image.size


@pytest.fixture(scope='module')
def div2k_photos(tmp_path_factory):
    """DIV2K's layout (HR and bicubic LR x2/x3/x4) of the colour photographs."""
    from nalaformer.datasets.super_resolution import write_lr_images
    from nalaformer.images import save_image
    root = tmp_path_factory.mktemp('sr')
    hr_dir = root / 'DIV2K' / 'DIV2K_train_HR'
    hr_dir.mkdir(parents=True)
    for name, photo in photos().items():
        if photo.ndim == 3:
            h, w = (d - d % 12 for d in photo.shape[:2])
            save_image(photo[:h, :w], hr_dir / f'{name}.png')
    write_lr_images(hr_dir, root / 'DIV2K' / 'DIV2K_train_LR_bicubic', (2, 3, 4))
    return root


@pytest.mark.slow
@pytest.mark.parametrize('pipeline', sorted(SUPER_RESOLUTION), ids=names(SUPER_RESOLUTION))
def test_super_resolution_pipeline(pipeline, div2k_photos):
    settings = json.loads(pipeline)
    dataset = SRPairedDataset(str(div2k_photos), **settings)
    patch, scale = settings['patch_size'], settings['scale']
    seed_everything()
    for i in range(SAMPLES // 4):
        item = dataset[i % len(dataset)]
        assert item['inputs'].shape == (3, patch // scale, patch // scale)
        assert item['data_samples']['gt'].shape == (3, patch, patch)


def replace_pixels(folder: Path, seed: int) -> int:
    """Every image under ``folder`` replaced by a crop of a photograph resized to its size, in its format."""
    rng = np.random.default_rng(seed)
    pictures = [p if p.ndim == 3 else np.repeat(p[..., None], 3, axis=2) for p in photos().values()]
    count = 0
    for path in sorted(p for p in folder.rglob('*') if p.suffix.lower() in ('.jpg', '.jpeg', '.png')):
        with Image.open(path) as image:
            size, mode = image.size, image.mode
        crop = Image.fromarray(random_crop(pictures[count % len(pictures)], rng)).resize(size, Image.BICUBIC)
        crop.convert(mode).save(path)
        count += 1
    return count


@pytest.mark.slow
@pytest.mark.parametrize('pipeline', sorted(DENSE), ids=names(DENSE))
def test_dense_pipeline(pipeline, tmp_path):
    """The shipped segmentation / detection training pipeline on photographs in the dataset's own layout, the
    labels (segmentation maps, COCO polygons) those of the dry run's shapes."""
    cfg = Config.fromfile(str(DENSE[pipeline][0]))
    generate_data(cfg, tmp_path, val_count=1, train_count=16)
    leaf = dataset_leaves(cfg.train_dataloader.dataset)[0]
    prefix = leaf.get('data_prefix') or {}
    images = Path(leaf['data_root']) / prefix.get('img_path', prefix.get('img', ''))
    assert replace_pixels(images, seed=0) == 16
    with DefaultScope.overwrite_default_scope(cfg.default_scope):
        dataset = DATASETS.build(cfg.train_dataloader.dataset)
    crop = cfg.get('crop_size')
    seed_everything()
    for i in range(DENSE_SAMPLES):
        item = dataset.prepare_data(i % len(dataset))  # None would make mmengine draw another sample
        assert item is not None, f'sample {i}: the pipeline gave nothing'
        inputs = item['inputs']
        assert inputs.dtype == torch.uint8 and inputs.shape[0] == 3
        if crop:  # segmentation: a crop of the config's size (smaller only where the image is)
            assert all(0 < n <= c for n, c in zip(inputs.shape[1:], crop))
            seg = item['data_samples'].gt_sem_seg.data
            assert seg.shape[1:] == inputs.shape[1:]
        else:  # detection: boxes inside the image
            boxes = item['data_samples'].gt_instances.bboxes.tensor
            h, w = inputs.shape[1:]
            assert ((boxes[:, 0::2] >= 0) & (boxes[:, 0::2] <= w) & (boxes[:, 1::2] >= 0)
                    & (boxes[:, 1::2] <= h)).all()
