"""Paired super-resolution datasets in the layout every SR codebase uses (BasicSR's PairedImageDataset).

Training (``data_root`` holds ``DIV2K/``)::

    DIV2K/DIV2K_train_HR/0001.png ...
    DIV2K/DIV2K_train_LR_bicubic/X2/0001x2.png ...       (X3/0001x3.png, X4/0001x4.png)

Testing (``data_root`` holds ``benchmark/``; every set folder present is evaluated under its name)::

    benchmark/Set5/HR/baby.png ...
    benchmark/Set5/LR_bicubic/X2/babyx2.png ...          (Manga109's ``<name>_LRBI_x2.png`` too)

An LR image is its HR partner shrunk by the scale: LR size = HR size // scale (the HR image is cut to
LR size x scale, as benchmark HR images need not be multiples of every scale). Files are paired and their
sizes checked when the dataset is built; a problem raises :class:`SRDataError` (or the image layer's
:class:`~nalaformer.images.ImageError`) naming the file.
``tools/dataset_converters/bicubic_downsample.py`` writes missing LR folders.
"""
from pathlib import Path
from typing import List, Optional, Sequence, Tuple

import numpy as np
import torch
from mmengine.registry import DATASETS

from ..errors import DatasetError
from ..images import image_files, image_size, read_image

# How an LR file is named after its HR partner's stem: DIV2K and most benchmarks, then Manga109's packs.
LR_NAMES = ('{}x{scale}', '{}_LRBI_x{scale}')
BENCHMARK_LAYOUT = '<data_root>/benchmark/<Set>/HR/*.png + <data_root>/benchmark/<Set>/LR_bicubic/X{s}/*x{s}.png'
_CONVERT_HINT = 'python3 tools/dataset_converters/bicubic_downsample.py HR_DIR LR_DIR --scales S'


class SRDataError(DatasetError):
    """A super-resolution dataset whose files do not pair up or have the wrong sizes."""


def paired_files(hr_dir: Path, lr_dir: Path, scale: int) -> List[Tuple[Path, Path]]:
    """(HR, LR) file pairs of two folders, checked: every HR image has an LR partner named ``<stem>x<scale>``
    (or ``<stem>_LRBI_x<scale>``), every LR image an HR one, and LR size = HR size // scale."""
    hr_files = image_files(hr_dir)
    lr_by_stem = {p.stem: p for p in image_files(lr_dir)}
    pairs = []
    for hr in hr_files:
        names = [template.format(hr.stem, scale=scale) for template in LR_NAMES]
        lr = next((lr_by_stem.pop(n) for n in names if n in lr_by_stem), None)
        if lr is None:
            raise SRDataError(f'{hr} has no LR partner: expected {lr_dir / names[0]}.png. Write the LR images '
                              f'with {_CONVERT_HINT}')
        pairs.append((hr, lr))
    if lr_by_stem:
        orphan = sorted(lr_by_stem.values())[0]
        raise SRDataError(f'{orphan} has no HR partner in {hr_dir} ({len(lr_by_stem)} LR images without one; '
                          f'an x{scale} LR image of HR <name>.png is named <name>x{scale}.png)')
    for hr, lr in pairs:
        (w, h), lr_size = image_size(hr), image_size(lr)
        if lr_size != (w // scale, h // scale):
            raise SRDataError(
                f'{lr} is {lr_size[0]}x{lr_size[1]} but its HR partner {hr} is {w}x{h}: an x{scale} LR image must '
                f'be {w // scale}x{h // scale} (HR size // scale). Is it another scale\'s LR image? Rewrite it '
                f'with {_CONVERT_HINT}')
    return pairs


def read_pair(hr: Path, lr: Path, scale: int) -> Tuple[np.ndarray, np.ndarray]:
    """-> HR (h * scale, w * scale, 3), LR (h, w, 3) uint8; the HR image cut to LR size x scale."""
    hr_image, lr_image = read_image(hr), read_image(lr)
    h, w = lr_image.shape[:2]
    if hr_image.shape[0] // scale != h or hr_image.shape[1] // scale != w:  # the file changed since pairing
        raise SRDataError(f'{lr} ({w}x{h}) is not {hr} ({hr_image.shape[1]}x{hr_image.shape[0]}) // {scale}')
    return hr_image[:h * scale, :w * scale], lr_image


def to_tensor(image: np.ndarray) -> torch.Tensor:
    """(H, W, 3) uint8 -> (3, H, W) uint8."""
    return torch.from_numpy(np.ascontiguousarray(image.transpose(2, 0, 1)))


def random_pair_crop(hr: np.ndarray, lr: np.ndarray, scale: int, patch_size: int, where: str):
    """A random LR patch of patch_size // scale and its HR patch (BasicSR's paired_random_crop)."""
    lr_patch = patch_size // scale
    h, w = lr.shape[:2]
    if h < lr_patch or w < lr_patch:
        raise SRDataError(f'{where}: LR image {w}x{h} is smaller than the LR patch {lr_patch}x{lr_patch} '
                          f'(patch_size {patch_size} // scale {scale}); use a smaller patch_size or drop the image')
    top, left = np.random.randint(0, h - lr_patch + 1), np.random.randint(0, w - lr_patch + 1)
    lr = lr[top:top + lr_patch, left:left + lr_patch]
    hr = hr[top * scale:(top + lr_patch) * scale, left * scale:(left + lr_patch) * scale]
    return hr, lr


def random_flip_rotate(images: Sequence[np.ndarray], flip: bool, rotate: bool) -> List[np.ndarray]:
    """The same random horizontal flip, vertical flip and transpose for every image (BasicSR's augment):
    with both on, each of the 8 flips/90-degree rotations of the square is equally likely."""
    hflip = flip and np.random.rand() < 0.5
    vflip = rotate and np.random.rand() < 0.5
    transpose = rotate and np.random.rand() < 0.5
    out = []
    for image in images:
        if hflip:
            image = image[:, ::-1]
        if vflip:
            image = image[::-1]
        if transpose:
            image = image.transpose(1, 0, 2)
        out.append(image)
    return out


def check_scale(scale) -> int:
    if not (isinstance(scale, int) and scale >= 1):
        raise SRDataError(f'scale must be a positive integer, got {scale!r}')
    return scale


@DATASETS.register_module()
class SRPairedDataset(torch.utils.data.Dataset):
    """HR/LR image pairs from two folders under ``data_root``; random paired crops, flips and rotations.

    Args:
        data_root: the folder holding ``hr_dir`` and ``lr_dir``.
        scale: 2, 3, 4, ... hr_dir / lr_dir: relative to data_root; ``{scale}`` is filled in.
        patch_size: HR patch side (the LR patch is patch_size // scale); None: whole images (evaluation).
        flip: random horizontal flips. rotate: random vertical flips and transposes (with flip: all 8
            90-degree rotations and mirrorings).
        cache: keep every decoded pair in memory after its first read (small datasets: a crop then costs
            no PNG decoding; each loader worker keeps its own copy).

    Items: ``dict(inputs=LR (3, h, w) uint8, data_samples=dict(gt=HR (3, h * scale, w * scale) uint8,
    name=HR file stem))``.
    """

    def __init__(self, data_root: str, scale: int, hr_dir: str = 'DIV2K/DIV2K_train_HR',
                 lr_dir: str = 'DIV2K/DIV2K_train_LR_bicubic/X{scale}', patch_size: Optional[int] = 192,
                 flip: bool = True, rotate: bool = True, cache: bool = False):
        self.scale = check_scale(scale)
        if patch_size is not None and patch_size % scale:
            raise SRDataError(f'patch_size {patch_size} is not a multiple of the scale {scale}')
        root = Path(data_root)
        self.hr_dir, self.lr_dir = root / hr_dir.format(scale=scale), root / lr_dir.format(scale=scale)
        for folder in (self.hr_dir, self.lr_dir):
            if not folder.is_dir():
                raise SRDataError(f'folder {folder} does not exist. Expected layout: <data_root>/{hr_dir}/*.png + '
                                  f'<data_root>/{lr_dir}/*x{{scale}}.png with data_root {str(root)!r}')
        self.pairs = paired_files(self.hr_dir, self.lr_dir, scale)
        self.patch_size, self.flip, self.rotate = patch_size, flip, rotate
        self.cache = {} if cache else None
        self.metainfo = dict(scale=scale, hr_dir=str(self.hr_dir), lr_dir=str(self.lr_dir))

    def __len__(self) -> int:
        return len(self.pairs)

    def __getitem__(self, index: int) -> dict:
        hr_path, lr_path = self.pairs[index]
        if self.cache is None:
            hr, lr = read_pair(hr_path, lr_path, self.scale)
        else:
            if index not in self.cache:
                self.cache[index] = read_pair(hr_path, lr_path, self.scale)
            hr, lr = self.cache[index]
        if self.patch_size is not None:
            hr, lr = random_pair_crop(hr, lr, self.scale, self.patch_size, str(lr_path))
            hr, lr = random_flip_rotate((hr, lr), self.flip, self.rotate)
        return dict(inputs=to_tensor(lr), data_samples=dict(gt=to_tensor(hr), name=hr_path.stem))


@DATASETS.register_module()
class SRBenchmarkDataset(torch.utils.data.Dataset):
    """Every benchmark set under ``data_root/benchmark`` (``<Set>/HR``, ``<Set>/LR_bicubic/X{scale}``), whole images.

    Args:
        data_root: the folder holding ``benchmark/``. scale: 2, 3, 4, ...
        sets: set folder names to read (an error naming a missing one); None: every folder present.

    Items: ``dict(inputs=LR (3, h, w) uint8, data_samples=dict(gt=HR (3, h * scale, w * scale) uint8,
    name=HR file stem, set=set folder name))``.
    """

    def __init__(self, data_root: str, scale: int, sets: Optional[Sequence[str]] = None):
        self.scale = check_scale(scale)
        benchmark = Path(data_root) / 'benchmark'
        if not benchmark.is_dir():
            raise SRDataError(f'folder {benchmark} does not exist. Expected layout: {BENCHMARK_LAYOUT}')
        found = sorted(p.name for p in benchmark.iterdir() if p.is_dir() and not p.name.startswith('.'))
        if sets is None:
            sets = found
        missing = [s for s in sets if s not in found]
        if missing or not sets:
            raise SRDataError(f'{benchmark} holds the sets {found}, not {missing or "any"}. Expected layout: '
                              f'{BENCHMARK_LAYOUT}')
        self.sets = list(sets)
        self.items = [(name, hr, lr) for name in self.sets for hr, lr in
                      paired_files(benchmark / name / 'HR', benchmark / name / 'LR_bicubic' / f'X{scale}', scale)]
        self.metainfo = dict(scale=scale, sets=tuple(self.sets))

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, index: int) -> dict:
        name, hr_path, lr_path = self.items[index]
        hr, lr = read_pair(hr_path, lr_path, self.scale)
        return dict(inputs=to_tensor(lr), data_samples=dict(gt=to_tensor(hr), name=hr_path.stem, set=name))
