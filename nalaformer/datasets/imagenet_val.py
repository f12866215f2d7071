"""The ILSVRC2012 (ImageNet-1K) validation images sorted into class folders, from the official ground truth.

The validation archive unpacks to 50,000 images in one folder (``ILSVRC2012_val_00000001.JPEG`` ...); an
ImageFolder dataset needs ``val/<wnid>/<image>``, the layout of the training images. The class of each image
comes from either ground-truth file:

* the devkit's ``data/ILSVRC2012_validation_ground_truth.txt`` (line i: the ILSVRC2012_ID, 1-1000, of image i)
  with the devkit's ``data/meta.mat``, which maps ILSVRC2012_IDs to WNIDs (read with scipy), or a text file of
  ``<ILSVRC2012_ID> <WNID>`` lines;
* Kaggle's ``LOC_val_solution.csv`` (``ImageId,PredictionString``; the first word of PredictionString is the
  WNID).
"""
import csv
import os
import re
import shutil
from pathlib import Path
from typing import Dict, Iterable, Optional, Union

from tqdm import tqdm

from ..errors import ConfigError, DatasetError, DestinationError
from ..files import atomic_folder, contained, same_path
from ..images import IMAGE_FOLDER_EXTENSIONS
from .written import check_dataset_destination, write_marker

__all__ = ['MODES', 'FULL_SET', 'flat_images', 'read_ground_truth', 'read_devkit_ground_truth', 'read_id_to_wnid',
           'read_loc_solution', 'sort_val_images']

PathLike = Union[str, os.PathLike]
# How an image gets into its class folder. No 'move': it would change the source folder, and an interrupted
# run would leave the images spread over two folders; a hard link costs no space either and leaves the source.
MODES = ('copy', 'hardlink', 'symlink')
FULL_SET = (50_000, 1000)  # images, classes of the ILSVRC2012 validation set
WNID = re.compile(r'n\d{8}')
LOC_HEADER = ['ImageId', 'PredictionString']


def _check_wnid(wnid: str, where: str) -> str:
    if not WNID.fullmatch(wnid):
        raise DatasetError(f'{where}: {wnid!r} is not a WordNet id (n followed by 8 digits, e.g. n01440764); '
                           f'give the ILSVRC2012 ground truth')
    return wnid


def read_id_to_wnid(meta: PathLike) -> Dict[int, str]:
    """ILSVRC2012_ID -> WNID from the devkit's ``meta.mat`` (``synsets``), or from a text file of
    ``<ILSVRC2012_ID> <WNID>`` lines (spaces, tabs or a comma between them)."""
    meta = Path(meta)
    if not meta.is_file():
        raise ConfigError(f'--meta {meta} does not exist; give the devkit\'s data/meta.mat (ILSVRC2012_devkit_t12)')
    if meta.suffix.lower() == '.mat':
        return _read_meta_mat(meta)
    mapping = {}
    for number, line in enumerate(meta.read_text().splitlines(), 1):
        words = line.replace(',', ' ').split()
        if not words:
            continue
        if len(words) < 2 or not words[0].isdigit():
            raise DatasetError(f'{meta} line {number}: expected "<ILSVRC2012_ID> <WNID>", got {line.strip()!r}')
        mapping[int(words[0])] = _check_wnid(words[1], f'{meta} line {number}')
    if not mapping:
        raise DatasetError(f'{meta} maps no ILSVRC2012_ID to a WNID; give the devkit\'s data/meta.mat')
    return mapping


def _read_meta_mat(meta: Path) -> Dict[int, str]:
    try:
        from scipy.io import loadmat
    except ImportError:
        raise ConfigError(f'reading {meta} needs scipy (pip install scipy); or give --meta a text file of '
                          f'"<ILSVRC2012_ID> <WNID>" lines') from None
    try:
        synsets = loadmat(str(meta), squeeze_me=True)['synsets']
        ids, wnids = synsets['ILSVRC2012_ID'], synsets['WNID']
    except (KeyError, ValueError, TypeError, IndexError, OSError) as e:
        raise DatasetError(f'{meta} is not the devkit\'s meta.mat (a "synsets" table with ILSVRC2012_ID and WNID): '
                           f'{e}') from None
    return {int(i): _check_wnid(str(w), str(meta)) for i, w in zip(ids.ravel(), wnids.ravel())}


def read_devkit_ground_truth(ground_truth: PathLike, meta: PathLike) -> Dict[str, str]:
    """Image name (without extension) -> WNID from the devkit's ``ILSVRC2012_validation_ground_truth.txt``,
    whose line i is the ILSVRC2012_ID of ``ILSVRC2012_val_<i, 8 digits>``, and ``meta`` (:func:`read_id_to_wnid`)."""
    id_to_wnid = read_id_to_wnid(meta)
    labels = {}
    for number, line in enumerate(Path(ground_truth).read_text().splitlines(), 1):
        text = line.strip()
        if not text.isdigit() or int(text) not in id_to_wnid:
            raise DatasetError(
                f'{ground_truth} line {number}: {text!r} is not an ILSVRC2012_ID that {meta} names (1-1000); give the '
                f'devkit\'s ILSVRC2012_validation_ground_truth.txt, one id per line')
        labels[f'ILSVRC2012_val_{number:08d}'] = id_to_wnid[int(text)]
    return labels


def read_loc_solution(ground_truth: PathLike) -> Dict[str, str]:
    """Image name -> WNID from Kaggle's ``LOC_val_solution.csv`` (``ImageId,PredictionString``: boxes as
    ``<WNID> x0 y0 x1 y1`` ..., every box of an image of its one class)."""
    labels = {}
    with open(ground_truth, newline='', encoding='utf-8-sig') as f:
        rows = csv.reader(f)
        header = next(rows, None)
        if header != LOC_HEADER:
            raise DatasetError(f'{ground_truth}: expected the header {",".join(LOC_HEADER)} of LOC_val_solution.csv, '
                               f'got {header}')
        for number, row in enumerate(rows, 2):
            if not row:
                continue
            where = f'{ground_truth} line {number}'
            if len(row) != 2 or not row[1].split():
                raise DatasetError(f'{where}: expected "ImageId,<WNID> x0 y0 x1 y1 ...", got {",".join(row)!r}')
            image, words = row[0].strip(), row[1].split()
            classes = set(words[::5])
            if len(classes) != 1:
                raise DatasetError(f'{where}: image {image} has boxes of several classes ({sorted(classes)}); '
                                   f'give the validation solution, one class per image')
            if image in labels:
                raise DatasetError(f'{where}: image {image} is listed twice')
            labels[image] = _check_wnid(words[0], where)
    return labels


def read_ground_truth(ground_truth: PathLike, meta: Optional[PathLike] = None) -> Dict[str, str]:
    """Image name (without extension) -> WNID from either ground-truth file; a ``LOC_val_solution.csv`` is
    recognised by its header, anything else is read as the devkit's text file and needs ``meta``."""
    ground_truth = Path(ground_truth)
    if not ground_truth.is_file():
        raise ConfigError(f'--ground-truth {ground_truth} does not exist; give the devkit\'s '
                          f'data/ILSVRC2012_validation_ground_truth.txt or Kaggle\'s LOC_val_solution.csv')
    with open(ground_truth, encoding='utf-8-sig', errors='replace') as f:
        first = f.readline()
    if first.startswith(LOC_HEADER[0]):
        if meta is not None:
            raise ConfigError(f'--meta: {ground_truth} names the WNIDs itself (LOC_val_solution.csv); leave out --meta')
        return read_loc_solution(ground_truth)
    if meta is None:
        raise ConfigError(f'{ground_truth} gives ILSVRC2012_IDs (1-1000), not WNIDs: add --meta with the devkit\'s '
                          f'data/meta.mat, which maps them')
    return read_devkit_ground_truth(ground_truth, meta)


def flat_images(src: Path) -> Dict[str, str]:
    """File name without extension -> file name, for the images directly in ``src``."""
    return {os.path.splitext(entry.name)[0]: entry.name for entry in os.scandir(src)
            if entry.is_file() and os.path.splitext(entry.name)[1].lower() in IMAGE_FOLDER_EXTENSIONS}


def _examples(names: Iterable[str], n: int = 3) -> str:
    names = list(names)
    return ', '.join(names[:n]) + (f' and {len(names) - n} more' if len(names) > n else '')


def _check_paths(src: Path, out: Path) -> None:
    if not src.is_dir():
        raise ConfigError(f'{src} is not a folder; give the folder of the flat validation images '
                          f'(ILSVRC2012_img_val.tar unpacked: ILSVRC2012_val_00000001.JPEG ...)')
    if same_path(src, out) or contained(src, out) or contained(out, src):
        raise DestinationError(f'the output folder {out} and the source folder {src} overlap; write the class '
                               f'folders to a folder of their own, e.g. data/imagenet/val')


def _place(source: Path, target: Path, mode: str) -> None:
    if mode == 'copy':
        shutil.copyfile(source, target)
    elif mode == 'symlink':
        os.symlink(source.resolve(), target)
    else:
        try:
            os.link(source, target)
        except OSError as e:
            raise DestinationError(f'--mode hardlink: cannot link {source} into {target.parent.parent} ({e.strerror}; '
                                   f'hard links need one file system); use --mode symlink or --mode copy') from None


def sort_val_images(src: PathLike, out: PathLike, labels: Dict[str, str], mode: str = 'copy',
                    overwrite: bool = False) -> Dict[str, int]:
    """Write ``out/<wnid>/<image>`` for every image ``labels`` (image name without extension -> WNID) lists,
    taken from the flat folder ``src`` (copied, hard-linked or symlinked: ``mode``). Every listed image must be
    in ``src`` (checked before anything is written). ``out`` must be absent, empty or a folder written here
    earlier (replaced), or anything with ``overwrite``; it never overlaps ``src``. Written in a folder beside
    ``out`` that is renamed into place when complete. Returns the images per class folder."""
    if mode not in MODES:
        raise ConfigError(f'mode {mode!r}: choose one of {", ".join(MODES)}')
    src, out = Path(src), Path(out)
    _check_paths(src, out)
    if not labels:
        raise DatasetError('the ground truth lists no image')
    available = flat_images(src)
    missing = [name for name in labels if name not in available]
    if missing:
        sorted_already = any(WNID.fullmatch(p.name) for p in src.iterdir() if p.is_dir())
        hint = (f'{src} holds class folders: it looks sorted already' if sorted_already else
                f'give the folder holding the flat validation images')
        raise DatasetError(f'the ground truth lists {missing[0]}, which is not in {src} ({len(missing)} of '
                           f'{len(labels)} listed images missing: {_examples(missing)}); {hint}')
    out = check_dataset_destination(out, overwrite)
    written: Dict[str, int] = {}
    with atomic_folder(out) as tmp:
        for wnid in sorted(set(labels.values())):
            (tmp / wnid).mkdir()
        for name, wnid in tqdm(sorted(labels.items()), desc=f'ImageNet val -> {out} ({mode})', unit='img'):
            _place(src / available[name], tmp / wnid / available[name], mode)
            written[wnid] = written.get(wnid, 0) + 1
        write_marker(tmp, f'nalaformer.datasets.sort_val_images ({mode})', written)
    return written
