"""What long runs meet, on real runs of tools/train.py and tools/test.py: divergence, unreadable images,
preemption (SIGTERM) and a busy CPU."""
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tool_runs import write_imagefolder

ROOT = Path(__file__).resolve().parents[1]
CONFIG = str(ROOT / 'configs' / 'nalaformer' / 'nalaformer-pico_1xb64-10e_fashion-mnist-32px.py')
ITERS_PER_EPOCH = 6  # 3 classes x 12 images, batch 6


def options(data, epochs=3, workers=0, extra=()):
    opts = [f'{d}.dataset.data_root={data}' for d in ('train_dataloader', 'val_dataloader', 'test_dataloader')]
    return opts + [f'train_dataloader.num_workers={workers}', 'val_dataloader.num_workers=0',
                   'test_dataloader.num_workers=0', 'train_dataloader.batch_size=6', 'val_dataloader.batch_size=6',
                   'model.num_classes=3', 'model.drop_path_rate=0.1', f'train_cfg.max_epochs={epochs}',
                   'default_hooks.logger.interval=1', 'log_processor.window_size=1', *extra]


def command(work, data, *args, **kwargs):
    return [sys.executable, str(ROOT / 'tools' / 'train.py'), CONFIG, '--work-dir', str(work), *args,
            '--cfg-options', *options(data, **kwargs)]


def run(cmd, env=None, timeout=900):
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, 'OMP_NUM_THREADS': '1', **(env or {})})


def weights(path):
    checkpoint = torch.load(path, map_location='cpu', weights_only=True)
    return checkpoint['state_dict'], checkpoint['ema_state_dict']


def all_finite(path) -> bool:
    return all(bool(torch.isfinite(t).all()) for state in weights(path) for t in state.values()
               if t.is_floating_point())


@pytest.fixture(scope='module')
def data_with_two_corrupt(tmp_path_factory):
    root = tmp_path_factory.mktemp('two_corrupt')
    return root, write_imagefolder(root, corrupt_train=2)['train']


@pytest.fixture(scope='module')
def reference_run(data_with_two_corrupt, tmp_path_factory):
    """Three uninterrupted epochs on the data with two unreadable training images."""
    data, _ = data_with_two_corrupt
    work = tmp_path_factory.mktemp('reference')
    result = run(command(work, data, workers=2))
    assert result.returncode == 0, result.stderr[-3000:]
    return work, result.stdout + result.stderr


@pytest.mark.xdist_group('long_runs_reference_run')
@pytest.mark.slow
def test_a_few_unreadable_training_images_are_skipped_and_named_once(data_with_two_corrupt, reference_run):
    _, corrupt = data_with_two_corrupt
    work, log = reference_run
    assert (work / 'epoch_3.pth').exists()
    for path in corrupt:  # three epochs, each image logged once
        assert log.count(f'skipped an unreadable training image (replaced by the next one): {path}') == 1
    assert re.search(r'CPU threads: 1 \(\d+ cores available, set by OMP_NUM_THREADS', log)


@pytest.mark.xdist_group('long_runs_reference_run')
@pytest.mark.slow
def test_sigterm_writes_an_iteration_checkpoint_that_resumes_exactly(data_with_two_corrupt, reference_run, tmp_path):
    data, _ = data_with_two_corrupt
    reference, _ = reference_run
    work = tmp_path / 'preempted'
    # a signal to the whole process group, as Slurm sends it: data-loader workers must survive it
    proc = subprocess.Popen(command(work, data, workers=2), cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True,
                            env={**os.environ, 'OMP_NUM_THREADS': '1'})
    lines = []
    for line in proc.stdout:
        lines.append(line)
        if 'Epoch(train) [2][2/6]' in line:
            os.killpg(proc.pid, signal.SIGTERM)
    assert proc.wait(timeout=600) == 128 + signal.SIGTERM, ''.join(lines[-30:])
    log = ''.join(lines)
    [checkpoint] = work.glob('iter_*.pth')
    trained = int(re.fullmatch(r'iter_(\d+)\.pth', checkpoint.name).group(1))
    assert ITERS_PER_EPOCH + 2 <= trained < 2 * ITERS_PER_EPOCH  # inside epoch 2
    assert f'wrote {checkpoint}' in log and '--resume' in log
    assert (work / 'last_checkpoint').read_text() == str(checkpoint)
    assert not (work / 'epoch_2.pth').exists() and not list(work.glob('.*.tmp'))

    resumed = run(command(work, data, '--resume', '--threads', '1', workers=2), env={'OMP_NUM_THREADS': ''})
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f'--resume: continuing the run in {work} from {checkpoint}' in resumed.stdout
    assert re.search(r'CPU threads: 1 \(\d+ cores available, as requested', resumed.stdout)
    # the preemption checkpoint joins the rotation (max_keep_ckpts=2): epoch_2.pth replaces it
    assert not checkpoint.exists()
    assert sorted(p.name for p in work.glob('epoch_*.pth')) == ['epoch_2.pth', 'epoch_3.pth']
    assert f'deleted the preemption checkpoint {checkpoint}: epoch_2.pth is newer' in resumed.stdout
    for ref, res in zip(weights(reference / 'epoch_3.pth'), weights(work / 'epoch_3.pth')):
        assert ref.keys() == res.keys()
        for key in ref:
            torch.testing.assert_close(res[key], ref[key], rtol=0, atol=0, msg=key)


@pytest.mark.slow
def test_a_diverging_run_stops_and_names_the_last_finite_checkpoint(tmp_path):
    data = tmp_path / 'data'
    write_imagefolder(data)
    work = tmp_path / 'diverging'
    config = tmp_path / 'diverging.py'  # lr 3e-3 in epoch 1, 3e5 in epoch 2: the loss stops being finite there
    config.write_text(f"_base_ = [{CONFIG!r}]\nparam_scheduler = [dict(type='ExponentialLR', gamma=1e8, by_epoch=True)]\n")
    cmd = command(work, data)
    cmd[2] = str(config)
    result = run(cmd, env={'OMP_NUM_THREADS': ''})
    assert result.returncode != 0
    message = result.stderr.strip().splitlines()[-1]
    assert message.startswith('error: training diverged: 3 iterations in a row'), message
    assert 'epoch 2' in message and 'non-finite loss' in message and 'learning rate 3e+05' in message
    assert f'the newest checkpoint with finite weights is {work / "epoch_1.pth"}' in message
    assert f'--resume {work / "epoch_1.pth"}' in message
    assert 'Traceback' not in result.stderr
    assert re.search(r'CPU threads: \d \(\d cores available, [\d.]+ of them busy with other processes', result.stdout)
    checkpoints = list(work.glob('*.pth'))
    assert work / 'epoch_1.pth' in checkpoints and not (work / 'epoch_2.pth').exists()
    assert all(all_finite(p) for p in checkpoints)


@pytest.mark.slow
def test_many_unreadable_training_images_stop_the_run_with_their_list(tmp_path):
    data = tmp_path / 'data'
    corrupt = write_imagefolder(data, corrupt_train=9)['train']
    result = run(command(tmp_path / 'many', data, epochs=1))
    assert result.returncode != 0
    found = re.search(r'(\d+) training images could not be read in epoch 1, more than the 5 allowed', result.stderr)
    assert found and int(found.group(1)) > 5, result.stderr[-2000:]
    assert sum(path in result.stderr for path in corrupt) == int(found.group(1))  # the list names each of them
