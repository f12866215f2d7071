"""NaLaFormer: norm-aware linear attention. Importing this package registers the timm models."""
import importlib.util
import sys
from pathlib import Path


def _attach_checkout_kernels() -> None:
    """Make the top-level ``kernels/`` of a checkout importable as ``nalaformer.kernels``, as setup.py installs it,
    when the package runs from a checkout that was never installed (``PYTHONPATH=<checkout>``).

    An installed package (regular or editable) finds ``nalaformer.kernels`` itself and is left alone.
    """
    name = f'{__name__}.kernels'
    folder = Path(__file__).resolve().parent.parent / 'kernels'
    if importlib.util.find_spec(name) is not None or not (folder / '__init__.py').is_file():
        return
    spec = importlib.util.spec_from_file_location(name, folder / '__init__.py',
                                                  submodule_search_locations=[str(folder)])
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    setattr(sys.modules[__name__], 'kernels', module)


_attach_checkout_kernels()

from . import models, ops  # noqa: E402  (after the kernels are reachable: ops imports them)
from .models import NaLaAttention, NaLaFormer  # noqa: E402

__version__ = '0.1.0'
