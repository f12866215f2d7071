"""The overrides a user types first when debugging a shipped recipe on a CPU are legal work: the shipped
ImageNet-recipe configs (their own pipeline, model, optimizer and hooks) train on real photographs through
``tools/train.py`` with ``num_workers=0``, batch size 1, no validation or ``--amp``."""
import json
import math
from pathlib import Path

import pytest
import torch
from timm.data import Mixup

from nalaformer.classification.model import mix_batch
from real_images import PHOTOS, write_photo_imagefolder
from tool_runs import run_script

ROOT = Path(__file__).resolve().parents[1]
TRAIN = ROOT / 'tools' / 'train.py'
RECIPE = ROOT / 'configs' / 'nalaformer' / 'nalaformer-t_8xb128_in1k.py'
FINE_TUNE = ROOT / 'configs' / 'nalaformer' / 'nalaformer-t_in1k-pre_1xb64-50e_imagefolder.py'
NO_VALIDATION = ['val_dataloader=None', 'val_cfg=None', 'val_evaluator=None']
WORKERS = ['train_dataloader.num_workers=0', 'val_dataloader.num_workers=0']

# (config, options after --cfg-options, other flags): each trains one epoch on the photographs
OVERRIDES = {
    'num-workers-0': (RECIPE, [*WORKERS, 'train_dataloader.batch_size=4', 'val_dataloader.batch_size=4'], []),
    'batch-size-1': (RECIPE, ['train_dataloader.num_workers=0', 'train_dataloader.batch_size=1', *NO_VALIDATION], []),
    'no-validation': (RECIPE, ['train_dataloader.num_workers=0', 'train_dataloader.batch_size=2', *NO_VALIDATION], []),
    'amp-on-cpu': (RECIPE, [*WORKERS, 'train_dataloader.batch_size=8', 'val_dataloader.batch_size=8'], ['--amp']),
    'fine-tune-num-workers-0': (FINE_TUNE, [*WORKERS, 'model.pretrained=None', 'train_dataloader.batch_size=4'], []),
}


@pytest.fixture(scope='module')
def photos_folder(tmp_path_factory):
    return write_photo_imagefolder(tmp_path_factory.mktemp('photos'), per_class=2, val_per_class=1)


def logged_losses(work_dir: Path) -> list:
    """The training losses of the run's scalars log."""
    [scalars] = work_dir.glob('*/vis_data/scalars.json')
    return [record['loss'] for record in map(json.loads, scalars.read_text().splitlines()) if 'loss' in record]


@pytest.mark.slow
@pytest.mark.parametrize('case', sorted(OVERRIDES))
def test_shipped_recipe_trains_with_the_override(case, photos_folder, tmp_path):
    config, options, flags = OVERRIDES[case]
    work = tmp_path / 'work'
    run_script(TRAIN, config, '--work-dir', work, *flags, '--cfg-options', f'data_root={photos_folder}',
               f'train_dataloader.dataset.data_root={photos_folder}', f'val_dataloader.dataset.data_root={photos_folder}',
               f'model.num_classes={len(PHOTOS)}', 'train_cfg.max_epochs=1', 'default_hooks.logger.interval=1',
               *options, env={'OMP_NUM_THREADS': '1'})
    assert (work / 'epoch_1.pth').is_file()
    losses = logged_losses(work)
    assert losses and all(math.isfinite(loss) for loss in losses)


@pytest.mark.parametrize('batch', [1, 3, 4])
def test_mixup_takes_any_batch_size(batch):
    """Each mixed image is ``lam * x_i + (1 - lam) * x_j`` of two images of its batch, its target the same mix of
    their smoothed one-hot labels; timm alone refuses odd batches."""
    torch.manual_seed(batch)
    mixup = Mixup(mixup_alpha=0.8, cutmix_alpha=0.0, label_smoothing=0.1, num_classes=5)
    inputs, labels = torch.randn(batch, 3, 8, 8), torch.arange(batch) % 5
    mixed, targets = mix_batch(mixup, inputs.clone(), labels)
    assert mixed.shape == inputs.shape and targets.shape == (batch, 5)
    torch.testing.assert_close(targets.sum(1), torch.ones(batch))
    smoothed = torch.full((batch, 5), 0.1 / 5).scatter_(1, labels[:, None], 1 - 0.1 + 0.1 / 5)
    for i in range(batch):
        # the partner j and the weight lam that explain image i
        found = False
        for j in range(batch):
            if torch.allclose(inputs[i], inputs[j]):  # mixed with itself: only the label smoothing
                found |= torch.allclose(mixed[i], inputs[i], atol=1e-5) and torch.allclose(targets[i], smoothed[i])
                continue
            lam = ((mixed[i] - inputs[j]) * (inputs[i] - inputs[j])).sum() / ((inputs[i] - inputs[j]) ** 2).sum()
            if torch.allclose(mixed[i], lam * inputs[i] + (1 - lam) * inputs[j], atol=1e-5):
                found = torch.allclose(targets[i], lam * smoothed[i] + (1 - lam) * smoothed[j], atol=1e-5)
                break
        assert found, f'image {i} of a batch of {batch} is no mix of two of its images'
