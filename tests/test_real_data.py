"""End-to-end check on real images: a pico NaLa-Swin learns Fashion-MNIST from scratch on a CPU (the pico
NaLaFormer's check is the quick start's: tests/test_quick_start.py).

Data: Debian's dataset-fashion-mnist (installed by scripts/setup.sh), converted to ImageFolder
with tools/dataset_converters/fashion_mnist_to_imagefolder.py (3000 train / 1000 val images).
"""
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SOURCE = Path('/usr/share/datasets/fashion-mnist')
SWIN_CONFIG = ROOT / 'configs' / 'swin_protocol' / 'nala-swin-pico_1xb64-10e_fashion-mnist-32px.py'


def _train_on_fashion_mnist(config: Path, tmp_path: Path) -> list:
    """Convert the data, train ``config`` for 10 epochs on it; the per-epoch validation scalars."""
    assert (SOURCE / 'train-images-idx3-ubyte.gz').is_file(), \
        f'{SOURCE} is missing: run `bash scripts/setup.sh` (as root) or `apt-get install dataset-fashion-mnist`'
    data = tmp_path / 'fashion-mnist'
    subprocess.run([sys.executable, str(ROOT / 'tools' / 'dataset_converters' / 'fashion_mnist_to_imagefolder.py'),
                    str(data), '--train-per-class', '300', '--val-per-class', '100'], check=True, capture_output=True)
    work = tmp_path / 'work'
    result = subprocess.run(
        [sys.executable, str(ROOT / 'tools' / 'train.py'), str(config), '--work-dir', str(work), '--cfg-options',
         *[f'{d}.dataset.data_root={data}' for d in ('train_dataloader', 'val_dataloader', 'test_dataloader')]],
        capture_output=True, text=True, cwd=ROOT, timeout=1800)
    assert result.returncode == 0, result.stderr[-5000:]
    [scalars] = work.glob('*/vis_data/scalars.json')
    val = [json.loads(line) for line in scalars.read_text().splitlines() if 'accuracy/top1' in line]
    assert len(val) == 10
    print(f"Fashion-MNIST val top-1 per epoch: {[round(v['accuracy/top1'], 1) for v in val]}, "
          f"EMA last: {val[-1]['ema/accuracy/top1']:.1f}")
    return val


@pytest.mark.slow
def test_pico_nala_swin_learns_fashion_mnist(tmp_path):
    """The Swin-T protocol's model (the default attn_types: global NaLa stages, then windowed softmax) learns too."""
    val = _train_on_fashion_mnist(SWIN_CONFIG, tmp_path)
    assert val[-1]['accuracy/top1'] > 70.0  # chance is 10%
    assert val[-1]['accuracy/top1'] > val[0]['accuracy/top1']
