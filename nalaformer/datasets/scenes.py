"""Fashion-MNIST items pasted on crops of a real photograph: small detection and segmentation sets.

The photograph is matplotlib's sample ``grace_hopper.jpg`` (installed with matplotlib); every scene is a
random crop of it (random scale, mirrored at random) with a few Fashion-MNIST items pasted at random
non-overlapping places, enlarged and tinted. Each item's mask is the set of pixels it covers, so boxes,
instance masks and label maps are exact.
"""
import json
from pathlib import Path
from typing import List, Tuple

import numpy as np
from PIL import Image

from .fashion_mnist import CLASSES, DEFAULT_SRC, read_fashion_mnist

ITEM_THRESHOLD = 40  # grey level above which a Fashion-MNIST pixel belongs to the item (its background is 0)


def _photograph() -> Image.Image:
    from matplotlib import cbook
    return Image.open(cbook.get_sample_data('grace_hopper.jpg')).convert('RGB')


def _background(photo: Image.Image, size: int, rng: np.random.Generator) -> np.ndarray:
    side = int(rng.integers(min(photo.size) // 3, min(photo.size) + 1))
    x, y = (int(rng.integers(0, d - side + 1)) for d in photo.size)
    crop = photo.crop((x, y, x + side, y + side)).resize((size, size), Image.BILINEAR)
    if rng.random() < 0.5:
        crop = crop.transpose(Image.FLIP_LEFT_RIGHT)
    return np.asarray(crop).copy()


def _place(boxes: List[Tuple[int, int, int, int]], side: int, size: int, rng: np.random.Generator, tries: int = 50):
    """Top-left corner of a side x side square inside the image that overlaps no box; None if none found."""
    for _ in range(tries):
        x, y = (int(v) for v in rng.integers(0, size - side + 1, 2))
        if all(x + side <= bx or bx + bs <= x or y + side <= by or by + bs <= y for bx, by, bs, _ in boxes):
            return x, y
    return None


def _scene(photo, items, labels, size, rng, num_items):
    """-> image (size, size, 3) uint8, [(class index, mask (size, size) bool)]."""
    image = _background(photo, size, rng)
    placed, objects = [], []
    for _ in range(num_items):
        side = int(rng.integers(size // 5, size * 2 // 5 + 1))
        corner = _place(placed, side, size, rng)
        if corner is None:
            continue
        index = int(rng.integers(len(items)))
        grey = np.asarray(Image.fromarray(items[index]).resize((side, side), Image.BILINEAR)).astype(np.float32)
        inside = grey > ITEM_THRESHOLD
        tint = rng.uniform(0.3, 1.0, 3)
        x, y = corner
        patch = image[y:y + side, x:x + side]
        patch[inside] = (grey[inside, None] * tint).astype(np.uint8)
        mask = np.zeros((size, size), bool)
        mask[y:y + side, x:x + side] = inside
        placed.append((x, y, side, index))
        objects.append((int(labels[index]), mask))
    return image, objects


def _coco_annotation(mask: np.ndarray, class_index: int, image_id: int, annotation_id: int) -> dict:
    from pycocotools import mask as mask_utils
    rle = mask_utils.encode(np.asfortranarray(mask.astype(np.uint8)))
    rle['counts'] = rle['counts'].decode('ascii')
    ys, xs = np.nonzero(mask)
    x0, y0 = int(xs.min()), int(ys.min())
    return dict(id=annotation_id, image_id=image_id, category_id=class_index + 1, iscrowd=0, segmentation=rle,
                area=float(mask.sum()), bbox=[x0, y0, int(xs.max()) + 1 - x0, int(ys.max()) + 1 - y0])


def write_scenes(out, num_images: int = 16, size: int = 256, items_per_image: int = 3, seed: int = 0,
                 src=DEFAULT_SRC) -> Path:
    """Write ``num_images`` scenes in two layouts under ``out`` and return ``out``:

    * COCO: ``coco/{train,val}2017/*.jpg``, ``coco/annotations/instances_{train,val}2017.json`` (categories
      1-10 named as Fashion-MNIST's classes, RLE masks);
    * ADE20K: ``ade/ADEChallengeData2016/{images,annotations}/{training,validation}/``, label maps with
      1 = background and 2-11 = the ten classes (0, ADE20K's ignored 'other', is unused; after
      mmseg's ``reduce_zero_label`` the classes are 0 = background, 1-10 = the items).

    The validation splits hold the same scenes as the training splits: the set measures how well a model
    fits what it was trained on.
    """
    out = Path(out)
    rng = np.random.default_rng(seed)
    items, labels = read_fashion_mnist(src, 'train')
    photo = _photograph()
    images, annotations = [], []
    coco, ade = out / 'coco', out / 'ade' / 'ADEChallengeData2016'
    for folder in [coco / 'annotations'] + [coco / f'{s}2017' for s in ('train', 'val')] + [
            ade / kind / split for kind in ('images', 'annotations') for split in ('training', 'validation')]:
        folder.mkdir(parents=True, exist_ok=True)
    for image_id in range(1, num_images + 1):
        image, objects = _scene(photo, items, labels, size, rng, items_per_image)
        label_map = np.ones((size, size), np.uint8)
        for class_index, mask in objects:
            label_map[mask] = class_index + 2
            annotations.append(_coco_annotation(mask, class_index, image_id, len(annotations) + 1))
        name = f'{image_id:06d}'
        for split, ade_split in (('train', 'training'), ('val', 'validation')):
            Image.fromarray(image).save(coco / f'{split}2017' / f'{name}.jpg', quality=95)
            Image.fromarray(image).save(ade / 'images' / ade_split / f'{name}.jpg', quality=95)
            Image.fromarray(label_map).save(ade / 'annotations' / ade_split / f'{name}.png')
        images.append(dict(id=image_id, file_name=f'{name}.jpg', width=size, height=size))
    categories = [dict(id=i + 1, name=name) for i, name in enumerate(CLASSES)]
    for split in ('train', 'val'):
        (coco / 'annotations' / f'instances_{split}2017.json').write_text(
            json.dumps(dict(images=images, annotations=annotations, categories=categories)))
    return out
