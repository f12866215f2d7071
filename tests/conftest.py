import os
import sys
from pathlib import Path

import pytest
import torch

if not torch.cuda.is_available():
    # Triton fixes its mode when first imported (timm imports it): without a GPU, the Triton
    # kernel tests run in its interpreter.
    os.environ.setdefault('TRITON_INTERPRET', '1')

sys.path.insert(0, str(Path(__file__).parent))  # tests' own helper modules (reference_weights)

DATA = Path(__file__).parent / 'data'


@pytest.fixture(autouse=True)
def _seed_and_threads():
    torch.manual_seed(0)
    yield


@pytest.fixture(scope='session')
def release_reference():
    """Tensors produced by the authors' release code (scripts/make_reference_tensors.py)."""
    return torch.load(DATA / 'release_reference.pt', weights_only=True)
