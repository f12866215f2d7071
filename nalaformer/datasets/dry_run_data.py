"""Small synthetic datasets in the layouts the configs read, for ``tools/train.py CONFIG --dry-run``.

Pixels are synthetic (a smooth colour gradient, filled shapes, noise) but every image is a real encoded file
(JPEG or PNG) of a realistic size for its task, so decoding and the shipped pipelines (random resizes, crops,
flips) run exactly as they would on the real data. Labels follow the shapes: a segmentation map labels the
pixels each shape covers, a COCO annotation gives each shape's polygon, box and area.

Layouts (every writer creates the folders it needs and returns the number of images written):

* :func:`write_image_folder`: ``<folder>/<class>/<index>.<ext>`` (ImageFolder; ImageNet, Fashion-MNIST);
* :func:`write_segmentation`: ``<img_dir>/<name><img_suffix>`` + ``<seg_dir>/<name><seg_suffix>``
  (mmseg's ADE20K, Cityscapes and any dataset read by suffix);
* :func:`write_coco`: ``<img_dir>/<name>.jpg`` + a COCO instances json with polygon masks (mmdet);
* :func:`write_sr_pairs`: ``<hr_dir>/<name>.png`` + ``<lr_dir>/<name>x<scale>.png``, the LR images MATLAB's
  bicubic shrink of the HR ones (DIV2K, the benchmark sets).
"""
import io
import json
import math
from pathlib import Path
from typing import Optional, Sequence, Tuple

import numpy as np
from PIL import Image, ImageDraw

from ..images import to_uint8
from .super_resolution import bicubic_lr

__all__ = ['synthetic_image', 'random_polygon', 'write_image_folder', 'write_segmentation', 'write_coco',
           'write_sr_pairs']

Size = Tuple[int, int]  # (width, height), as PIL gives sizes


def synthetic_image(rng: np.random.Generator, size: Size, grey: bool = False) -> Image.Image:
    """A ``size`` (width, height) RGB (or 'L') image: a smooth gradient between two random colours in a random
    direction, plus Gaussian noise (sigma 6 grey levels); shapes are drawn on it by the writers."""
    width, height = size
    angle = rng.uniform(0, 2 * math.pi)
    t = (np.linspace(0, 1, width, dtype=np.float32)[None, :] * math.cos(angle)
         + np.linspace(0, 1, height, dtype=np.float32)[:, None] * math.sin(angle))
    t = ((t - t.min()) / max(float(t.max() - t.min()), 1e-6))[..., None]  # (H, W, 1) in [0, 1]
    start, end = rng.uniform(0, 255, 3).astype(np.float32), rng.uniform(0, 255, 3).astype(np.float32)
    pixels = start + t * (end - start) + rng.normal(0, 6, (height, width, 1)).astype(np.float32)
    image = Image.fromarray(to_uint8(pixels, peak=255))
    return image.convert('L') if grey else image


def random_polygon(rng: np.random.Generator, size: Size, min_side: int, max_side: int) -> list:
    """A star-shaped (never self-intersecting) polygon of 5-12 vertices inside the image: [(x, y), ...] floats,
    its extent between ``min_side`` and ``max_side`` pixels."""
    width, height = size
    radius = rng.uniform(min_side, max_side) / 2
    cx, cy = rng.uniform(radius, width - radius), rng.uniform(radius, height - radius)
    angles = np.sort(rng.uniform(0, 2 * math.pi, int(rng.integers(5, 13))))
    radii = radius * rng.uniform(0.55, 1.0, len(angles))
    return [(float(np.clip(cx + r * math.cos(a), 0, width - 1)), float(np.clip(cy + r * math.sin(a), 0, height - 1)))
            for a, r in zip(angles, radii)]


def _colour(rng: np.random.Generator, grey: bool):
    return int(rng.integers(0, 256)) if grey else tuple(int(v) for v in rng.integers(0, 256, 3))


def _encoded(image: Image.Image, suffix: str) -> bytes:
    """The file content of ``image`` in the format ``suffix`` names (.jpg/.jpeg/.JPEG: JPEG quality 90; else
    PNG, compression level 1: synthetic noise compresses badly and slowly)."""
    out = io.BytesIO()
    if suffix.lower() in ('.jpg', '.jpeg'):
        image.save(out, format='JPEG', quality=90)
    else:
        image.save(out, format='PNG', compress_level=1)
    return out.getvalue()


def write_image_folder(folder, classes: Sequence[str], per_class: int = 1, size: Size = (500, 375),
                       suffix: str = '.JPEG', grey: bool = False, seed: int = 0, variants: int = 8) -> int:
    """``folder/<class>/<index><suffix>`` for every class, ``per_class`` images each. ``variants`` distinct
    images are drawn and encoded, then their bytes written in turn (1000 ImageNet classes cost 1000 file
    writes, not 1000 encodings)."""
    rng = np.random.default_rng(seed)
    contents = []
    for _ in range(variants):
        image = synthetic_image(rng, size, grey)
        draw = ImageDraw.Draw(image)
        for _ in range(3):
            draw.polygon(random_polygon(rng, size, min(size) // 6, min(size) // 2), fill=_colour(rng, grey))
        contents.append(_encoded(image, suffix))
    count = 0
    for name in classes:
        (Path(folder) / name).mkdir(parents=True, exist_ok=True)
        for i in range(per_class):
            (Path(folder) / name / f'{i:04d}{suffix}').write_bytes(contents[count % variants])
            count += 1
    return count


def write_segmentation(img_dir, seg_dir, count: int, size: Size, img_suffix: str, seg_suffix: str,
                       labels: Sequence[int], background: int, seed: int = 0, shapes: int = 6) -> int:
    """``count`` images ``img_dir/<name><img_suffix>`` and label maps ``seg_dir/<name><seg_suffix>`` (8-bit PNG,
    the same names: mmseg pairs them by suffix). Each map is ``background`` where no shape is, and each of the
    ``shapes`` polygons is drawn in the image with its own colour and in the map with a label from ``labels``."""
    rng = np.random.default_rng(seed)
    img_dir, seg_dir = Path(img_dir), Path(seg_dir)
    img_dir.mkdir(parents=True, exist_ok=True)
    seg_dir.mkdir(parents=True, exist_ok=True)
    for i in range(count):
        image, label_map = synthetic_image(rng, size), Image.new('L', size, background)
        draw, draw_label = ImageDraw.Draw(image), ImageDraw.Draw(label_map)
        for _ in range(shapes):
            polygon = random_polygon(rng, size, min(size) // 8, min(size) * 2 // 3)
            draw.polygon(polygon, fill=_colour(rng, False))
            draw_label.polygon(polygon, fill=int(rng.choice(labels)))
        name = f'dryrun_{i:06d}'
        (img_dir / f'{name}{img_suffix}').write_bytes(_encoded(image, img_suffix))
        (seg_dir / f'{name}{seg_suffix}').write_bytes(_encoded(label_map, '.png'))
    return count


def _polygon_area(polygon: Sequence[Tuple[float, float]]) -> float:
    x, y = np.asarray(polygon, dtype=np.float64).T
    return float(abs(np.dot(x, np.roll(y, 1)) - np.dot(y, np.roll(x, 1))) / 2)


def write_coco(ann_file, img_dir, classes: Sequence[str], count: int, size: Size = (640, 480),
               objects: int = 4, seed: int = 0, first_image_id: int = 1) -> int:
    """``count`` JPEG images ``img_dir/<name>.jpg`` and the COCO instances json ``ann_file`` naming them
    (``file_name`` relative to ``img_dir``). Categories are ``classes`` with ids 1..n; each image has
    ``objects`` polygons (segmentation as one polygon, bbox [x, y, w, h], area, iscrowd 0) of random
    categories, 24-300 pixels across, so detectors' minimum-size filters keep every image."""
    rng = np.random.default_rng(seed)
    img_dir, ann_file = Path(img_dir), Path(ann_file)
    img_dir.mkdir(parents=True, exist_ok=True)
    ann_file.parent.mkdir(parents=True, exist_ok=True)
    images, annotations = [], []
    for i in range(count):
        image_id = first_image_id + i
        image = synthetic_image(rng, size)
        draw = ImageDraw.Draw(image)
        for _ in range(objects):
            polygon = random_polygon(rng, size, 24, min(300, min(size) - 1))
            draw.polygon(polygon, fill=_colour(rng, False))
            xs, ys = [p[0] for p in polygon], [p[1] for p in polygon]
            annotations.append(dict(
                id=len(annotations) + 1, image_id=image_id, category_id=int(rng.integers(1, len(classes) + 1)),
                segmentation=[[round(v, 2) for point in polygon for v in point]], area=_polygon_area(polygon),
                bbox=[min(xs), min(ys), max(xs) - min(xs), max(ys) - min(ys)], iscrowd=0))
        name = f'dryrun_{image_id:012d}.jpg'
        (img_dir / name).write_bytes(_encoded(image, '.jpg'))
        images.append(dict(id=image_id, file_name=name, width=size[0], height=size[1]))
    categories = [dict(id=i + 1, name=name, supercategory='dry run') for i, name in enumerate(classes)]
    ann_file.write_text(json.dumps(dict(images=images, annotations=annotations, categories=categories)))
    return count


def write_sr_pairs(hr_dir, lr_dir, scale: int, count: int, size: Size, seed: int = 0,
                   lr_name: Optional[str] = None) -> int:
    """``count`` HR PNGs ``hr_dir/<name>.png`` of ``size`` and their x``scale`` LR partners
    ``lr_dir/<name>x<scale>.png`` (``lr_name`` formats another name from ``{}`` = the HR stem and ``{scale}``),
    each the HR image cut to a multiple of the scale and shrunk with MATLAB's bicubic, as the benchmarks'
    ``LR_bicubic`` folders are made."""
    rng = np.random.default_rng(seed)
    hr_dir, lr_dir = Path(hr_dir), Path(lr_dir)
    hr_dir.mkdir(parents=True, exist_ok=True)
    lr_dir.mkdir(parents=True, exist_ok=True)
    for i in range(count):
        image = synthetic_image(rng, size)
        draw = ImageDraw.Draw(image)
        for _ in range(8):
            draw.polygon(random_polygon(rng, size, min(size) // 10, min(size) // 2), fill=_colour(rng, False))
        stem = f'dryrun_{i:04d}'
        (hr_dir / f'{stem}.png').write_bytes(_encoded(image, '.png'))
        lr = Image.fromarray(bicubic_lr(np.asarray(image), scale))
        (lr_dir / f'{(lr_name or "{}x{scale}").format(stem, scale=scale)}.png').write_bytes(_encoded(lr, '.png'))
    return count
