"""Dataset folders written here, recognised again: a marker file records what wrote the folder and how many
images each of its sub-folders holds, so that a converter may replace its own earlier output while a folder
holding anything else is left alone (unless ``--overwrite``)."""
import json
from pathlib import Path
from typing import Dict

from ..files import check_folder_destination

__all__ = ['MARKER', 'is_written_dataset', 'write_marker', 'check_dataset_destination']

# Written into every dataset folder made here, beside the folders it counts.
MARKER = 'nalaformer_dataset.json'


def is_written_dataset(folder: Path) -> bool:
    """``folder`` is a dataset written here, unchanged: its marker, the folders it counts and nothing else,
    each folder holding the number of images the marker records."""
    try:
        written = json.loads((folder / MARKER).read_text())['images']
    except (OSError, ValueError, KeyError, TypeError):
        return False
    if {p.name for p in folder.iterdir()} != {MARKER, *written}:
        return False
    return all(sum(1 for p in (folder / split).rglob('*') if p.is_file()) == n for split, n in written.items())


def write_marker(folder: Path, writer: str, written: Dict[str, int]) -> None:
    """Record in ``folder`` that ``writer`` wrote it, with the images of each sub-folder (``written``)."""
    (folder / MARKER).write_text(json.dumps({'writer': writer, 'images': written}, indent=1) + '\n')


def check_dataset_destination(out, overwrite: bool = False) -> Path:
    """``out`` may be written: absent, empty, a dataset written here earlier, or anything with ``overwrite``."""
    return check_folder_destination(out, overwrite, 'the output folder', replaceable=is_written_dataset,
                                    kind=f'a dataset written by nalaformer.datasets as it was written (its {MARKER} '
                                         f'records what it holds)')
