"""Super-resolution data: bicubic LR images for HR folders, and a small real-photo training and test set.

* :func:`write_lr_images`: ``<stem>x<s>.png`` for every HR image, MATLAB's bicubic (antialiased) shrink of
  the HR image cut to a multiple of the scale, as the benchmarks' ``LR_bicubic`` folders are made.
* :func:`write_photo_training_set`: the detailed parts of Debian's ``mate-backgrounds`` nature photographs
  (12 JPEGs of 1280x1024 to 2560x1920) at three scales, as sub-images in DIV2K's layout.
* :func:`write_photo_test_set`: four photographs none of those training images shows, in the benchmark
  layout (set ``Unseen4``): OpenCV's ``dnn_superres/butterfly.png`` (Debian's ``opencv-doc``) and
  scikit-image's bundled ``astronaut``, ``coffee`` and ``chelsea``.

Writers never replace files they did not write unless ``overwrite``; every file and dataset folder is
written under a temporary name and renamed into place.
"""
import os
from pathlib import Path
from typing import Dict, Iterable, Sequence, Tuple, Union

import numpy as np
from tqdm import tqdm

from ..errors import ConfigError, DatasetError, DestinationError
from ..files import atomic_folder
from ..images import calculate_psnr, image_files, imresize, read_image, save_image

PHOTOS = Path('/usr/share/backgrounds/mate/nature')
BUTTERFLY = Path('/usr/share/doc/opencv-doc/examples/dnn_superres/butterfly.png')
SKIMAGE_IMAGES = ('astronaut', 'coffee', 'chelsea')
TEST_SET = 'Unseen4'
PathLike = Union[str, os.PathLike]


def bicubic_lr(hr: np.ndarray, scale: int) -> np.ndarray:
    """(H, W, 3) uint8 -> (H // scale, W // scale, 3): the HR image cut to a multiple of the scale, shrunk."""
    h, w = hr.shape[0] // scale * scale, hr.shape[1] // scale * scale
    return imresize(hr[:h, :w], 1 / scale)


def lr_path(lr_root: Path, stem: str, scale: int) -> Path:
    return lr_root / f'X{scale}' / f'{stem}x{scale}.png'


def write_lr_images(hr_dir: PathLike, lr_root: PathLike, scales: Iterable[int] = (2, 3, 4),
                    overwrite: bool = False) -> int:
    """``lr_root/X{s}/<stem>x{s}.png`` for every image in ``hr_dir`` and scale; returns the files written.

    Existing outputs are an error naming them unless ``overwrite`` (then only those files are replaced);
    nothing else in ``lr_root`` is touched.
    """
    hr_files, lr_root, scales = image_files(Path(hr_dir)), Path(lr_root), sorted(set(scales))
    bad = [s for s in scales if not (isinstance(s, int) and s >= 2)]
    if bad:
        raise ConfigError(f'scales must be integers >= 2, got {bad}')
    outputs = [(hr, s, lr_path(lr_root, hr.stem, s)) for hr in hr_files for s in scales]
    existing = [str(out) for _, _, out in outputs if out.exists()]
    if existing and not overwrite:
        raise DestinationError(f'{len(existing)} of the LR images to write exist already ({existing[0]}, ...); '
                              f'pass --overwrite to replace them')
    for s in scales:
        (lr_root / f'X{s}').mkdir(parents=True, exist_ok=True)
    for hr_file in tqdm(hr_files, desc=f'bicubic x{"/x".join(map(str, scales))} -> {lr_root}', unit='img'):
        hr = read_image(hr_file)
        for s in scales:
            save_image(bicubic_lr(hr, s), lr_path(lr_root, hr_file.stem, s))
    return len(outputs)


def refuse_existing(path: Path, overwrite: bool) -> None:
    if path.exists() and not overwrite:
        raise DestinationError(f'{path} exists already; pass overwrite=True (--overwrite) to replace it')


def detailed_tiles(image: np.ndarray, tile: int, max_bicubic_psnr: float) -> Iterable[np.ndarray]:
    """The ``tile`` x ``tile`` sub-images of ``image`` (a grid) that bicubic x2 upscaling of their x2 shrink
    reconstructs with a PSNR-Y below ``max_bicubic_psnr`` dB: the ones with detail left to learn."""
    for y in range(0, image.shape[0] - tile + 1, tile):
        for x in range(0, image.shape[1] - tile + 1, tile):
            crop = image[y:y + tile, x:x + tile]
            if calculate_psnr(imresize(bicubic_lr(crop, 2), 2), crop, crop_border=2) < max_bicubic_psnr:
                yield crop


def write_photo_training_set(out: PathLike, scales: Sequence[int] = (2, 3, 4), shrinks: Sequence[int] = (2, 3, 4),
                             tile: int = 96, max_bicubic_psnr: float = 40.0, src: PathLike = PHOTOS,
                             overwrite: bool = False) -> Path:
    """``out/DIV2K/DIV2K_train_HR/<photo>_d<shrink>_<k>.png`` and ``DIV2K_train_LR_bicubic/X{s}/...x{s}.png``.

    Each photograph is shrunk by each of ``shrinks`` with MATLAB's bicubic (that removes its JPEG blocks and
    shows its detail at several scales) and cut into ``tile`` x ``tile`` sub-images (BasicSR's
    extract_subimages: small files are quick to read for each random crop). Most of these photographs are
    smooth (bokeh, sky: the median sub-image loses nothing under bicubic x2, 50+ dB), so only the sub-images
    with detail are kept (:func:`detailed_tiles`; the test photographs measure 27-35 dB). Returns ``out/DIV2K``.
    """
    src, folder = Path(src), Path(out) / 'DIV2K'
    if not src.is_dir():
        raise DatasetError(f'{src} does not exist: install the photographs with `apt-get install '
                                f'mate-backgrounds` (bash scripts/setup.sh does) or pass another folder')
    refuse_existing(folder, overwrite)
    with atomic_folder(folder) as tmp:
        hr_dir = tmp / 'DIV2K_train_HR'
        hr_dir.mkdir()
        for photo in tqdm(image_files(src), desc=f'{src} -> {folder}', unit='photo'):
            image = read_image(photo)
            for shrink in shrinks:
                for k, crop in enumerate(detailed_tiles(bicubic_lr(image, shrink), tile, max_bicubic_psnr)):
                    save_image(crop, hr_dir / f'{photo.stem}_d{shrink}_{k:03d}.png')
        write_lr_images(hr_dir, tmp / 'DIV2K_train_LR_bicubic', scales)
    return folder


def unseen_images() -> Dict[str, np.ndarray]:
    """The four unseen photographs, (H, W, 3) uint8 each."""
    from skimage import data
    if not BUTTERFLY.is_file():
        raise DatasetError(f'{BUTTERFLY} does not exist: install it with `apt-get install opencv-doc` '
                                f'(bash scripts/setup.sh does)')
    images = {'butterfly': read_image(BUTTERFLY)}
    images.update({name: getattr(data, name)() for name in SKIMAGE_IMAGES})
    return images


def write_photo_test_set(out: PathLike, scales: Sequence[int] = (2, 3, 4), overwrite: bool = False) -> Path:
    """``out/benchmark/Unseen4/HR/<name>.png`` and ``LR_bicubic/X{s}/<name>x{s}.png``; returns the set folder."""
    folder = Path(out) / 'benchmark' / TEST_SET
    refuse_existing(folder, overwrite)
    with atomic_folder(folder) as tmp:
        (tmp / 'HR').mkdir()
        for name, image in unseen_images().items():
            save_image(image, tmp / 'HR' / f'{name}.png')
        write_lr_images(tmp / 'HR', tmp / 'LR_bicubic', scales)
    return folder


def write_photo_datasets(out: PathLike, scales: Sequence[int] = (2, 3, 4),
                         overwrite: bool = False) -> Tuple[Path, Path]:
    """Both sets under the data root ``out`` (each destination checked before anything is written)."""
    for folder in (Path(out) / 'DIV2K', Path(out) / 'benchmark' / TEST_SET):
        refuse_existing(folder, overwrite)
    return (write_photo_training_set(out, scales, overwrite=overwrite),
            write_photo_test_set(out, scales, overwrite=overwrite))
