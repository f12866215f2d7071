"""What the runner core asks of super-resolution datasets (:mod:`nalaformer.engine.datasets`): every file paired
and its size checked before a run, and synthetic HR/LR pairs in the dataset's layout for ``--dry-run``."""
import math
from pathlib import Path

from mmengine.config import Config
from mmengine.registry import DATASETS

from ..datasets.dry_run_data import write_sr_pairs
from ..engine.datasets import DatasetSupport, dataset_option, register_dataset_support
from ..errors import DatasetError
from .data import SRBenchmarkDataset, SRPairedDataset

TRAIN_SIZE = (480, 360)  # DIV2K training HR: larger than twice the HR patch
BENCHMARK_SIZE = (288, 288)  # Set5's bird; Set5 and Set14 hold 256x256 to 720x576 images


def check_files(cfg: Config, split: str, dataset: dict) -> None:
    """Build the dataset: it pairs every file and checks its size, naming the file."""
    try:
        DATASETS.build(dataset)
    except DatasetError as e:
        raise DatasetError(f'{e} ({split} data; set {split}_dataloader.dataset.data_root in the config or with '
                           f'--cfg-options)') from None


def write_paired(cfg: Config, dataset: dict, count: int, seed: int, written: dict) -> str:
    scale, root = dataset['scale'], Path(dataset['data_root'])
    patch = dataset_option(SRPairedDataset, dataset, 'patch_size') or 0
    size = (max(TRAIN_SIZE[0], 2 * patch), max(TRAIN_SIZE[1], 2 * patch))
    hr = root / dataset_option(SRPairedDataset, dataset, 'hr_dir').format(scale=scale)
    lr = root / dataset_option(SRPairedDataset, dataset, 'lr_dir').format(scale=scale)
    n = write_sr_pairs(hr, lr, scale, count, size, seed)
    return f'{n} {size[0]}x{size[1]} HR PNGs with x{scale} LR partners'


def write_benchmark(cfg: Config, dataset: dict, count: int, seed: int, written: dict) -> str:
    scale, root, sets = dataset['scale'], Path(dataset['data_root']), list(dataset.get('sets') or ['Set5'])
    per_set = math.ceil(count / len(sets))
    for i, name in enumerate(sets):
        folder = root / 'benchmark' / name
        write_sr_pairs(folder / 'HR', folder / 'LR_bicubic' / f'X{scale}', scale, per_set, BENCHMARK_SIZE, seed + i)
    width, height = BENCHMARK_SIZE
    return f'{per_set} {width}x{height} HR PNGs with x{scale} LR partners in benchmark set(s) {sets}'


register_dataset_support(SRPairedDataset, DatasetSupport(check_files=check_files, write_data=write_paired))
register_dataset_support(SRBenchmarkDataset, DatasetSupport(check_files=check_files, write_data=write_benchmark))
