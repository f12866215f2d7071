"""The README's quick start, as a newcomer runs it: tools/quick_start.py on the Fashion-MNIST that setup installs."""
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.xdist_group('quick_start')  # one worker under pytest -n: the tests share the quick start run

ROOT = Path(__file__).resolve().parents[1]
SOURCE = Path('/usr/share/datasets/fashion-mnist')


def quick_start(work, data):
    return subprocess.run([sys.executable, str(ROOT / 'tools' / 'quick_start.py'), '--work-dir', str(work),
                           '--data', str(data)], capture_output=True, text=True, timeout=1800)


@pytest.fixture(scope='module')
def first_run(tmp_path_factory):
    assert (SOURCE / 'train-images-idx3-ubyte.gz').is_file(), \
        f'{SOURCE} is missing: run `bash scripts/setup.sh` (as root) or `apt-get install dataset-fashion-mnist`'
    root = tmp_path_factory.mktemp('quick_start')
    start = time.monotonic()
    result = quick_start(root / 'work', root / 'data')
    print(f'quick start: {time.monotonic() - start:.0f} s')
    return root / 'work', root / 'data', result


@pytest.mark.slow
def test_quick_start_trains_evaluates_and_exports(first_run):
    work, data, result = first_run
    assert result.returncode == 0, (result.stdout[-3000:], result.stderr[-5000:])

    # the whole test split is the val set, and the trained model reaches the bar on it
    assert sum(1 for _ in (data / 'val').glob('*/*.png')) == 10_000
    top1 = json.loads((work / 'test_metrics.json').read_text())['accuracy/top1']
    assert top1 >= 85.0, top1
    assert f'top-1: {top1:.2f}%' in result.stdout
    # tools/test.py re-evaluates the checkpoint to what training measured after its last epoch
    [scalars] = work.glob('*/vis_data/scalars.json')
    val = [json.loads(line) for line in scalars.read_text().splitlines() if 'accuracy/top1' in line]
    assert len(val) == 10 and val[-1]['accuracy/top1'] == pytest.approx(top1, abs=1e-6)
    assert val[-1]['accuracy/top1'] > val[0]['accuracy/top1']  # it learned during the run

    # the timm folder holds the checkpoint's weights; the entropy analysis ran on the trained model
    import timm

    import nalaformer  # noqa: F401
    state_dict = torch.load(work / 'epoch_10.pth', map_location='cpu', weights_only=True)['state_dict']
    model = timm.create_model(f'local-dir:{work / "timm_folder"}', pretrained=True)
    assert all(torch.equal(v, state_dict[f'model.{k}']) for k, v in model.state_dict().items())
    entropy = json.loads((work / 'attention_entropy.json').read_text())
    assert (work / 'attention_entropy.png').stat().st_size > 0 and 'nala' in json.dumps(entropy)
    for line in ('checkpoint:', 'timm folder:', 'tensorboard --logdir', 'attention plot:'):
        assert line in result.stdout


@pytest.mark.slow
def test_quick_start_run_again_resumes_and_writes_its_outputs_again(first_run):
    """The finished run is resumed (no training), the data folder kept, the quick start's own outputs (metrics,
    timm folder, plots) written again over the earlier ones."""
    work, data, first = first_run
    assert first.returncode == 0, first.stderr[-3000:]
    data_files = {p: p.stat().st_mtime_ns for p in data.rglob('*')}
    checkpoint = (work / 'epoch_10.pth').read_bytes()
    again = quick_start(work, data)
    assert again.returncode == 0, (again.stdout[-3000:], again.stderr[-5000:])
    assert 'prepare the data' not in again.stdout
    assert {p: p.stat().st_mtime_ns for p in data.rglob('*')} == data_files
    assert (work / 'epoch_10.pth').read_bytes() == checkpoint and not (work / 'epoch_11.pth').exists()
    top1 = json.loads((work / 'test_metrics.json').read_text())['accuracy/top1']
    assert f'top-1: {top1:.2f}%' in again.stdout and f'top-1: {top1:.2f}%' in first.stdout
