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

# Under pytest-xdist (`pytest -n 2`) the workers share the cores: each takes its share of threads, and the
# tools the tests start inherit it through OMP_NUM_THREADS (torch's default, one thread per core in every
# worker, makes the workers' threads spin against each other). An OMP_NUM_THREADS set by the caller wins.
WORKERS = int(os.environ.get('PYTEST_XDIST_WORKER_COUNT', '1'))
if WORKERS > 1 and not os.environ.get('OMP_NUM_THREADS'):
    from nalaformer.threads import available_cores
    os.environ['OMP_NUM_THREADS'] = str(max(1, available_cores() // WORKERS))
    torch.set_num_threads(int(os.environ['OMP_NUM_THREADS']))

DATA = Path(__file__).parent / 'data'


@pytest.fixture(autouse=True)
def _seed_and_threads():
    torch.manual_seed(0)
    yield


@pytest.fixture(scope='session')
def release_reference():
    """Tensors produced by the authors' release code (scripts/make_reference_tensors.py)."""
    return torch.load(DATA / 'release_reference.pt', weights_only=True)


def pytest_collection_modifyitems(items):
    """Modules with slow tests first, each kept whole (its module fixtures are built once): under pytest-xdist
    the long trainings start early and the fast tier fills in the end."""
    slow = {item.path for item in items if item.get_closest_marker('slow')}
    items.sort(key=lambda item: item.path not in slow)
