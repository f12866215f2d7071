"""Scripts run as a user runs them: ``python SCRIPT ARGS`` in a process of its own, from the repository root."""
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import torch
from PIL import Image, ImageDraw

ROOT = Path(__file__).resolve().parents[1]


def run_script(script: Path, *args, check: bool = True, timeout: float = 900,
               env: dict = None) -> subprocess.CompletedProcess:
    """Runs ``script`` with ``args`` (str() of each) and ``env`` added to this environment; with ``check``, a
    non-zero exit fails the test with the end of the script's output."""
    result = subprocess.run([sys.executable, str(script), *map(str, args)], capture_output=True, text=True,
                            timeout=timeout, cwd=ROOT, env={**os.environ, **(env or {})})
    if check:
        assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-5000:]
    return result


def train(config: Path, work_dir: Path, *options, **kwargs) -> Path:
    """``tools/train.py CONFIG --work-dir WORK_DIR --cfg-options OPTIONS``, checked; the work dir."""
    run_script(ROOT / 'tools' / 'train.py', config, '--work-dir', work_dir, '--cfg-options', *options, **kwargs)
    return work_dir


COLOURS = [(230, 40, 40), (40, 200, 40), (40, 40, 230)]


def write_imagefolder(root: Path, corrupt_train=0, corrupt_val=0) -> dict:
    """3 classes of coloured squares on noise (train 12 / val 4 per class, 40x40 PNG); the first
    ``corrupt_*`` files of a split (over all classes) hold bytes no decoder reads. Returns the corrupt paths."""
    g = torch.Generator().manual_seed(0)
    corrupt = {'train': [], 'val': []}
    for split, n, bad in (('train', 12, corrupt_train), ('val', 4, corrupt_val)):
        for i in range(n):
            for c, colour in enumerate(COLOURS):
                path = root / split / f'class{c}' / f'{i}.png'
                path.parent.mkdir(parents=True, exist_ok=True)
                img = Image.fromarray((torch.rand(40, 40, 3, generator=g) * 80).byte().numpy())
                x, y = torch.randint(0, 18, (2,), generator=g).tolist()
                ImageDraw.Draw(img).rectangle([x, y, x + 20, y + 20], fill=colour)
                if len(corrupt[split]) < bad:
                    path.write_bytes(b'\x89PNG\r\n\x1a\n' + os.urandom(200))
                    corrupt[split].append(str(path))
                else:
                    img.save(path)
    return corrupt


def scene(g, height, width, num_labels):
    """Noise with up to 3 coloured rectangles; the label map holds the rectangles' labels (1..num_labels)."""
    image = (torch.rand(height, width, 3, generator=g) * 60).byte()
    label = torch.zeros(height, width, dtype=torch.uint8)

    def rand(low, high):
        return int(torch.randint(low, high, (1,), generator=g))
    for _ in range(3):
        k, h, w = rand(1, num_labels + 1), rand(16, height // 2), rand(16, width // 2)
        y, x = rand(0, height - h), rand(0, width - w)
        image[y:y + h, x:x + w] = torch.tensor([40 * k % 256, 255 - 50 * k % 256, 90 * k % 256], dtype=torch.uint8)
        label[y:y + h, x:x + w] = k
    return Image.fromarray(image.numpy()), label


def write_tiny_ade(root: Path) -> Path:
    """``root`` (an ADEChallengeData2016 folder): images/{training,validation}/*.jpg + annotations/.../*.png,
    72x96 images of up to 3 coloured rectangles on noise; 6 training, 3 validation.

    Annotations as ADE20K ships them: 0 = 'other' (ignored through reduce_zero_label), 1..150 = classes.
    """
    g = torch.Generator().manual_seed(0)
    for split, n in (('training', 6), ('validation', 3)):
        (root / 'images' / split).mkdir(parents=True)
        (root / 'annotations' / split).mkdir(parents=True)
        for i in range(n):
            image, label = scene(g, 72, 96, num_labels=4)
            image.save(root / 'images' / split / f'ADE_{split[:5]}_{i:08d}.jpg')
            Image.fromarray(label.numpy()).save(root / 'annotations' / split / f'ADE_{split[:5]}_{i:08d}.png')
    return root


OBJECTS = {'cat': (230, 60, 60), 'dog': (60, 60, 230)}  # drawn as rectangles and ellipses


def _polygon(name, x, y, w, h):
    """A rectangle ('cat') or a 16-gon ellipse ('dog') in the box (x, y, w, h), as COCO's [x0, y0, x1, y1, ...]."""
    if name == 'cat':
        return [x, y, x + w, y, x + w, y + h, x, y + h]
    angles = [2 * math.pi * i / 16 for i in range(16)]
    return [v for a in angles for v in (x + w / 2 * (1 + math.cos(a)), y + h / 2 * (1 + math.sin(a)))]


def _write_coco_split(root, split, num_images, g, classes):
    (root / f'{split}2017').mkdir(parents=True)
    images, annotations = [], []
    for image_id in range(1, num_images + 1):
        img = Image.fromarray((torch.rand(120, 160, 3, generator=g) * 60).byte().numpy())
        for _ in range(2):
            name = list(OBJECTS)[int(torch.randint(0, 2, (1,), generator=g))]
            w, h = torch.randint(30, 60, (2,), generator=g).tolist()
            x, y = int(torch.randint(0, 160 - w, (1,), generator=g)), int(torch.randint(0, 120 - h, (1,), generator=g))
            polygon = _polygon(name, x, y, w, h)
            ImageDraw.Draw(img).polygon(polygon, fill=OBJECTS[name])
            area = float(w * h) if name == 'cat' else math.pi * w * h / 4
            annotations.append(dict(id=len(annotations) + 1, image_id=image_id, iscrowd=0, bbox=[x, y, w, h],
                                    category_id=list(classes).index(name) + 1, area=area, segmentation=[polygon]))
        file_name = f'{image_id:06d}.png'
        img.save(root / f'{split}2017' / file_name)
        images.append(dict(id=image_id, file_name=file_name, width=160, height=120))
    categories = [dict(id=i + 1, name=name) for i, name in enumerate(classes)]  # as COCO's json, ids 1..80
    coco = dict(images=images, annotations=annotations, categories=categories)
    (root / 'annotations' / f'instances_{split}2017.json').write_text(json.dumps(coco))


def write_tiny_coco(root: Path, classes) -> Path:
    """``root`` in the COCO layout (annotations/instances_{train,val}2017.json, {train,val}2017/): 160x120 images
    with two objects each, rectangles ('cat') and ellipses ('dog') with polygon masks; 8 train, 4 val.
    ``classes``: the category names in COCO's order (ids 1, 2, ...), 'cat' and 'dog' among them."""
    (root / 'annotations').mkdir(parents=True)
    g = torch.Generator().manual_seed(0)
    _write_coco_split(root, 'train', 8, g, classes)
    _write_coco_split(root, 'val', 4, g, classes)
    return root
