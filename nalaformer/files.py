"""Writing folders atomically: build beside the destination, then rename into place."""
import contextlib
import os
import shutil
import tempfile
from pathlib import Path
from typing import Iterator, Union

__all__ = ['atomic_folder']


@contextlib.contextmanager
def atomic_folder(path: Union[str, os.PathLike]) -> Iterator[Path]:
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
