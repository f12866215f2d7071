"""ImageFolder datasets checked before training or evaluation starts.

timm's folder reader makes a class of every folder that holds an image and numbers the classes in
sorted order, per split. So an empty (or missing) class folder in one split shifts every later class's
index in that split, images placed directly in ``train/`` make a one-class dataset, images in a
sub-folder of a class folder make a class of their own, and a dataset of more classes than the model's
``num_classes`` fails inside the loss. Each of these is refused here with one message naming the
folder and the fix; what is read (extensions) and what is not (other files) is stated.
"""
import collections
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Sequence

from timm.data.readers.img_extensions import get_img_extensions
from timm.utils.misc import natural_key

from ..errors import DatasetError

__all__ = ['SplitContents', 'scan_split', 'check_split', 'class_folders', 'compare_classes', 'IMAGE_EXTENSIONS']

# What timm's folder reader reads (compared lower-case: .JPEG counts); any other file is not read.
IMAGE_EXTENSIONS = tuple(get_img_extensions())


def _examples(names: Sequence[str], n: int = 3) -> str:
    shown = ', '.join(str(x) for x in list(names)[:n])
    return shown + (f' and {len(names) - n} more' if len(names) > n else '')


@dataclass
class SplitContents:
    """What one split folder (``data_root/split``) holds, as timm's reader would see it."""
    folder: Path
    images: Dict[str, int] = field(default_factory=dict)  # class folder -> images in it
    loose: List[str] = field(default_factory=list)  # images directly in the split folder
    nested: List[str] = field(default_factory=list)  # folders below a class folder that hold images
    other: collections.Counter = field(default_factory=collections.Counter)  # files not read, by extension

    @property
    def classes(self) -> List[str]:
        """Class folders in timm's order (natural sort)."""
        return sorted(self.images, key=natural_key)

    @property
    def empty(self) -> List[str]:
        return [name for name in self.classes if not self.images[name]]

    def describe(self) -> str:
        """One line: images read, their extensions, class folders, and what is not read."""
        read = sum(self.images.values())
        line = (f'{self.folder}: {read} images in {len(self.images)} class folders '
                f'(extensions read: {", ".join(IMAGE_EXTENSIONS)})')
        if self.other:
            kinds = ', '.join(f'{ext or "no extension"}: {n}' for ext, n in self.other.most_common(5))
            line += f'; {sum(self.other.values())} other files are not read ({kinds})'
        return line


def scan_split(folder) -> SplitContents:
    """Walk ``folder`` once: images per class folder, images outside class folders, nested image folders and
    files that are not read."""
    folder = Path(folder)
    contents = SplitContents(folder)
    for root, dirs, files in os.walk(folder, followlinks=True):
        depth = len(Path(root).relative_to(folder).parts)
        if depth == 0:  # every class folder; a hidden one (.ipynb_checkpoints) only when it holds images
            contents.images.update((name, 0) for name in dirs if not name.startswith('.'))
        images = [f for f in files if os.path.splitext(f)[1].lower() in IMAGE_EXTENSIONS]
        for f in files:
            ext = os.path.splitext(f)[1].lower()
            if ext not in IMAGE_EXTENSIONS:
                contents.other[ext] += 1
        if depth == 0:
            contents.loose += sorted(images)
        elif depth == 1 and (images or Path(root).name in contents.images):
            contents.images[Path(root).name] = contents.images.get(Path(root).name, 0) + len(images)
        elif images:
            contents.nested.append(str(Path(root).relative_to(folder)))
    return contents


def check_split(contents: SplitContents, classes: Optional[Sequence[str]] = None) -> None:
    """Raise :class:`DatasetError` for a split that timm would read as something else than one class per
    folder: images outside class folders, images in sub-folders, empty class folders, no images at all;
    ``classes`` (a class map: the classes and their order) must name every class folder."""
    folder, read = contents.folder, ', '.join(IMAGE_EXTENSIONS)
    layout = f'{folder}/<class name>/<image>'
    if contents.loose:
        where = 'and no class folders' if not any(contents.images.values()) else 'outside its class folders'
        raise DatasetError(
            f'{folder} holds {len(contents.loose)} images directly ({_examples(contents.loose)}) {where}: they would '
            f'be read as one class without a name. Put each image in the folder of its class, {layout}')
    if not any(contents.images.values()):
        others = f'; it holds {sum(contents.other.values())} files that are not read' if contents.other else ''
        raise DatasetError(f'no images under {folder} (extensions read: {read}){others}. Expected layout: {layout}')
    if contents.nested:
        leaf = Path(contents.nested[0]).name
        raise DatasetError(
            f'{folder} has images in sub-folders of class folders ({_examples(contents.nested)}): each would be read as '
            f'a class of its own (e.g. {leaf!r}). Move their images up into the class folder, {layout}')
    if contents.empty:
        raise DatasetError(
            f'class folder {folder / contents.empty[0]} has no images (extensions read: {read})'
            + (f', and so do {_examples(contents.empty[1:])}' if len(contents.empty) > 1 else '')
            + ': every later class would take another index in this split. Add its images, or remove it from '
              'every split')
    if classes is not None:
        unknown = [name for name in contents.classes if name not in classes]
        if unknown:
            raise DatasetError(f'{folder} has class folders that the dataset\'s classes do not name: '
                               f'{_examples(unknown, 5)}; the classes are {_examples(list(classes), 10)}')


def class_folders(folder) -> List[str]:
    """The class folders of a split, in timm's order, without walking the images (a cheap look at a split
    that is not loaded, e.g. the training split when evaluating)."""
    return sorted((p.name for p in Path(folder).iterdir() if p.is_dir() and not p.name.startswith('.')), key=natural_key)


def compare_classes(what: str, classes: Sequence[str], reference_what: str, reference: Sequence[str]) -> None:
    """Raise :class:`DatasetError` when two class lists differ, naming the missing and extra class folders."""
    if list(classes) == list(reference):
        return
    missing = [c for c in reference if c not in classes]
    extra = [c for c in classes if c not in reference]
    if missing or extra:
        detail = '; '.join(part for part in (
            f'it lacks {_examples(missing, 5)}' if missing else '',
            f'it has {_examples(extra, 5)} in addition' if extra else '') if part)
    else:
        detail = 'the same names in another order'
    raise DatasetError(
        f'{what} has other classes than {reference_what} ({detail}): class indices would not match. Give every '
        f'split the same class folders, or give the dataset the class map (the dataset\'s classes=[...], in the '
        f'config or with --cfg-options)')
