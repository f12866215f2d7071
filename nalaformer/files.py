"""Writing outputs without destroying anything: destinations checked before the work, atomic writes.

The rule every tool follows: a tool never deletes or overwrites a file or folder it did not create unless
the user passes ``--overwrite``; what it replaces is replaced atomically (built beside the destination,
then renamed into place), so an interrupted write leaves the old content or the new one, never a mix.
Destinations are checked before any work starts (:func:`check_file_destination`,
:func:`check_folder_destination`), so a bad path fails in a second, not after an hour of work.
"""
import contextlib
import os
import shutil
import tempfile
from pathlib import Path
from typing import Callable, Iterator, Optional, Sequence, Union

from .errors import DestinationError

__all__ = ['atomic_folder', 'atomic_file', 'check_file_destination', 'check_folder_destination', 'contained',
           'same_path']

PathLike = Union[str, os.PathLike]


@contextlib.contextmanager
def atomic_folder(path: PathLike) -> Iterator[Path]:
    """Yield a temporary folder beside ``path``; when the block completes it becomes ``path`` (replacing a
    folder there only then), and when it raises it is removed and ``path`` is left as it was."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=path.parent, prefix=f'.{path.name}.'))
    try:
        yield tmp
        if path.exists():
            old = Path(tempfile.mkdtemp(dir=path.parent, prefix=f'.{path.name}.old.'))
            os.replace(path, old / path.name)
            os.replace(tmp, path)
            shutil.rmtree(old)
        else:
            os.replace(tmp, path)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


@contextlib.contextmanager
def atomic_file(path: PathLike) -> Iterator[Path]:
    """Yield a temporary file name beside ``path`` (same suffix, so writers that go by it still work); when
    the block completes the file becomes ``path``, when it raises it is removed and ``path`` is untouched."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f'.{path.stem}.', suffix=f'.tmp{path.suffix}')
    os.close(fd)
    try:
        yield Path(tmp)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


def same_path(a: PathLike, b: PathLike) -> bool:
    """Whether two paths name the same file or folder (links and relative paths resolved)."""
    a, b = Path(a), Path(b)
    if a.exists() and b.exists():
        return os.path.samefile(a, b)
    return a.resolve() == b.resolve()


def contained(path: PathLike, root: PathLike) -> bool:
    """Whether ``path`` lies inside the folder ``root`` (not ``root`` itself): its folder resolved (``..``, links
    to folders), its own name kept, so that a link inside ``root`` counts as inside (removing it removes the link).
    What a run deletes or replaces must be contained in its work dir."""
    path = Path(os.path.abspath(path))
    return Path(root).resolve() in (path.parent.resolve() / path.name).parents


def _check_parent(path: Path, option: str) -> None:
    """The nearest existing folder above ``path`` is a writable folder (missing ones are created on writing)."""
    parent = path.parent.resolve()
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir():
        raise DestinationError(f'{option} {path}: {parent} is a file, not a folder; choose another path')
    if not os.access(parent, os.W_OK):
        raise DestinationError(f'{option} {path}: {parent} is not writable; choose another path')


def check_file_destination(path: PathLike, overwrite: bool = False, option: str = '--out',
                           example: str = 'output', replaceable: Optional[Callable[[Path], bool]] = None,
                           kind: str = '', inputs: Sequence[Optional[PathLike]] = ()) -> Path:
    """Check, before the work, that a file can be written at ``path`` without destroying anything.

    ``path`` must not be a folder nor one of the command's ``inputs`` (even with ``overwrite``); an existing
    file is replaced only when ``replaceable`` says the tool wrote it (``kind`` says what that is) or with
    ``overwrite``. ``option`` names the argument in messages, ``example`` a file name to suggest inside a folder.
    """
    path = Path(path)
    source = next((p for p in inputs if p is not None and same_path(p, path)), None)
    if source is not None:
        raise DestinationError(f'{option} {path} is also an input of this command; write to another path')
    if path.is_dir():
        raise DestinationError(f'{option} {path} is a folder; give a file name, e.g. {path / example}')
    if path.exists() and not overwrite and not (replaceable and replaceable(path)):
        ours = f' and is not {kind}' if kind else ''
        raise DestinationError(f'{option} {path} exists{ours}; pass --overwrite to replace it, or choose another path')
    _check_parent(path, option)
    return path


def check_folder_destination(path: PathLike, overwrite: bool = False, option: str = '--out',
                             replaceable: Optional[Callable[[Path], bool]] = None, kind: str = '') -> Path:
    """Check, before the work, that a folder can be written at ``path`` without destroying anything.

    ``path`` must be absent, an empty folder, a folder for which ``replaceable`` is true (what the tool wrote
    earlier, e.g. a timm folder; ``kind`` says what that is) or, with ``overwrite``, any folder.
    """
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise DestinationError(f'{option} {path} is a file; a folder is written there: choose a folder name')
    if path.is_dir() and not overwrite:
        entries = sorted(p.name for p in path.iterdir())
        if entries and not (replaceable and replaceable(path)):
            shown = ', '.join(entries[:5]) + (f' and {len(entries) - 5} more' if len(entries) > 5 else '')
            ours = f' and is not {kind}' if kind else ''
            raise DestinationError(
                f'{option} {path} holds other files ({shown}){ours}; writing there would delete them. Choose a new '
                f'or empty folder, or pass --overwrite to replace the folder and everything in it')
    _check_parent(path, option)
    return path
