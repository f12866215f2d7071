"""A toy task plug-in, written as a user would add a task: a folder and a config, nothing edited elsewhere.

The task: how much of a grey image a bright square covers (a number in [0, 1]), regressed by any timm model. The
plug-in registers its model wrapper (which tells the runner core which part of the config is the timm model), its
dataset (a folder of PNGs named ``<coverage>_<n>.png``) with the core's data checks and dry-run data, and its
metric. ``tests/test_task_plugin.py`` trains and tests it through ``tools/train.py`` / ``tools/test.py``.
"""
from pathlib import Path
from typing import Optional

import numpy as np
import timm
import torch
from mmengine.evaluator import BaseMetric
from mmengine.model import BaseModel
from mmengine.registry import DATASETS, METRICS, MODELS

from nalaformer.engine.datasets import DatasetSupport, register_dataset_support
from nalaformer.engine.model_spec import TimmModelSpec
from nalaformer.errors import DatasetError
from nalaformer.images import image_files, read_image, save_image, to_uint8

SIZE = 32


def square_image(coverage: float, rng: np.random.Generator) -> np.ndarray:
    """(SIZE, SIZE, 3) uint8: a dark noisy background with a bright square covering ``coverage`` of it."""
    side = int(round(np.sqrt(coverage) * SIZE))
    image = rng.uniform(0, .25, (SIZE, SIZE, 1))
    top, left = rng.integers(0, SIZE - side + 1, 2)
    image[top:top + side, left:left + side] = rng.uniform(.75, 1)
    return to_uint8(np.repeat(image, 3, axis=2))


def write_squares(folder: Path, count: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    for i in range(count):
        side = int(rng.integers(2, SIZE + 1))
        save_image(square_image((side / SIZE) ** 2, rng), folder / f'{(side / SIZE) ** 2:.6f}_{i:04d}.png')


@DATASETS.register_module()
class SquareDataset(torch.utils.data.Dataset):
    """Items: ``dict(inputs=(3, SIZE, SIZE) float in [0, 1], data_samples=coverage)``."""

    def __init__(self, data_root: str):
        self.files = image_files(Path(data_root))

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, index: int) -> dict:
        path = self.files[index]
        image = torch.from_numpy(read_image(path).transpose(2, 0, 1).copy()).float() / 255
        return dict(inputs=image, data_samples=torch.tensor(float(path.stem.split('_')[0])))


def check_files(cfg, split: str, dataset: dict) -> None:
    folder = Path(dataset['data_root'])
    if not folder.is_dir():
        raise DatasetError(f'{folder} does not exist ({split} data): set {split}_dataloader.dataset.data_root')


def write_data(cfg, dataset: dict, count: int, seed: int, written: dict) -> str:
    write_squares(Path(dataset['data_root']), count, seed)
    return f'{count} {SIZE}x{SIZE} PNGs of squares'


register_dataset_support(SquareDataset, DatasetSupport(check_files=check_files, write_data=write_data))


@MODELS.register_module()
class CoverageRegressor(BaseModel):
    """``timm.create_model(arch, num_classes=1, **model_kwargs)`` regressing the coverage, L1 loss."""

    def __init__(self, arch: str, init_cfg: Optional[dict] = None, **model_kwargs):
        super().__init__(init_cfg=init_cfg)
        self.model = timm.create_model(arch, num_classes=1, **model_kwargs)

    @classmethod
    def timm_model_spec(cls, model_cfg: dict, prefix: str = 'model.') -> TimmModelSpec:
        return TimmModelSpec.of_wrapper(cls, model_cfg, prefix, model_cfg['arch'], model_args=dict(num_classes=1),
                                        weights_prefix='model.')

    def forward(self, inputs: torch.Tensor, data_samples: Optional[torch.Tensor] = None, mode: str = 'tensor'):
        predicted = self.model(inputs).squeeze(1)
        if mode == 'loss':
            return dict(loss=torch.nn.functional.l1_loss(predicted, data_samples.float()))
        if mode == 'predict':
            return [dict(predicted=float(p), coverage=float(c)) for p, c in zip(predicted, data_samples)]
        return predicted


@METRICS.register_module()
class CoverageError(BaseMetric):
    """Mean absolute error of the coverage, as ``coverage/mae``."""

    default_prefix = 'coverage'

    def process(self, data_batch, data_samples) -> None:
        self.results += [abs(item['predicted'] - item['coverage']) for item in data_samples]

    def compute_metrics(self, results: list) -> dict:
        return dict(mae=float(np.mean(results)))
