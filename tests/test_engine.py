"""Classification training and evaluation through tools/train.py and tools/test.py (tiny, CPU)."""
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from PIL import Image, ImageDraw

import nalaformer  # noqa: F401  (registers the timm models used below)

from tool_runs import run_script

ROOT = Path(__file__).resolve().parents[1]
CONFIG = str(ROOT / 'configs' / 'nalaformer' / 'nalaformer-t_8xb128_in1k.py')
COLOURS = [(230, 40, 40), (40, 200, 40), (40, 40, 230)]


@pytest.fixture(scope='module')
def tiny_imagefolder(tmp_path_factory):
    """3 classes of coloured squares on noise: train 12 / val 4 images per class, 40x40."""
    root = tmp_path_factory.mktemp('tiny_imagefolder')
    g = torch.Generator().manual_seed(0)
    for split, n in (('train', 12), ('val', 4)):
        for c, colour in enumerate(COLOURS):
            (root / split / f'class{c}').mkdir(parents=True)
            for i in range(n):
                noise = (torch.rand(40, 40, 3, generator=g) * 80).byte().numpy()
                img = Image.fromarray(noise)
                x, y = torch.randint(0, 18, (2,), generator=g).tolist()
                ImageDraw.Draw(img).rectangle([x, y, x + 20, y + 20], fill=colour)
                img.save(root / split / f'class{c}' / f'{i}.png')
    return root


def tiny_options(data_root, epochs=2, extra=()):
    opts = [f'{d}.dataset.data_root={data_root}' for d in ('train_dataloader', 'val_dataloader', 'test_dataloader')]
    for d in ('train_dataloader', 'val_dataloader', 'test_dataloader'):
        opts += [f'{d}.num_workers=0', f'{d}.persistent_workers=False', f'{d}.pin_memory=False',
                 f'{d}.dataset.input_size=32']
    opts += ['train_dataloader.batch_size=6', 'val_dataloader.batch_size=6', 'test_dataloader.batch_size=6',
             'train_dataloader.sampler.num_repeats=1',
             'model.num_classes=3', 'model.embed_dims=[16,32,48,64]', 'model.depths=[1,1,1,1]',
             'model.num_heads=[1,2,3,4]', 'model.head_hidden_size=32', 'model.drop_path_rate=0.1',
             'param_scheduler=[]', 'optim_wrapper.optimizer.lr=2e-3',
             f'train_cfg.max_epochs={epochs}', 'default_hooks.logger.interval=1', 'log_processor.window_size=1', 'env_cfg.cudnn_benchmark=False']
    return opts + list(extra)


def run_tool(tool, *args, **kwargs):
    return run_script(ROOT / 'tools' / tool, *args, **kwargs)


def train(work_dir, data_root, epochs=2, extra=(), **kwargs):
    return run_tool('train.py', CONFIG, '--work-dir', work_dir, '--cfg-options',
                    *tiny_options(data_root, epochs, extra), **kwargs)


def logged_scalars(work_dir):
    [scalars] = Path(work_dir).glob('*/vis_data/scalars.json')
    return [json.loads(line) for line in scalars.read_text().splitlines()]


def load_weights(path):
    return torch.load(path, map_location='cpu', weights_only=True)['state_dict']


@pytest.mark.slow
def test_training_decreases_loss_and_test_tool_evaluates(tiny_imagefolder, tmp_path):
    work = tmp_path / 'run'
    # colour is the class here, so no RandAugment (its colour ops would erase the label)
    train(work, tiny_imagefolder, epochs=6, extra=['model.mixup=None', 'train_dataloader.dataset.transform.auto_augment=None',
                                                   'train_dataloader.dataset.transform.re_prob=0.0'])
    rows = logged_scalars(work)
    losses = [r['loss'] for r in rows if 'loss' in r]
    assert len(losses) == 6 * 6
    assert sum(losses[-6:]) / 6 < 0.8 * sum(losses[:6]) / 6
    val = [r for r in rows if 'accuracy/top1' in r]
    assert len(val) == 6 and all('ema/accuracy/top1' in r for r in val)
    assert val[-1]['accuracy/top1'] > 50.0  # 3 classes: chance is 33%
    # checkpoints: plain data only (weights_only) and no temporary files left behind
    checkpoint = torch.load(work / 'epoch_6.pth', map_location='cpu', weights_only=True)
    assert {'state_dict', 'optimizer', 'param_schedulers', 'message_hub', 'ema_state_dict'} <= set(checkpoint)
    assert list(work.glob('best_accuracy_top1_epoch_*.pth'))
    assert not list(work.glob('.*.tmp'))
    out = run_tool('test.py', CONFIG, work / 'epoch_6.pth', '--work-dir', tmp_path / 'test',
                   '--cfg-options', *tiny_options(tiny_imagefolder))
    metrics = eval(out.stdout.strip().splitlines()[-1])  # the dict printed by tools/test.py
    assert set(metrics) >= {'accuracy/top1', 'accuracy/top5'}
    assert metrics['accuracy/top5'] == 100.0 and metrics['accuracy/top1'] > 50.0


@pytest.mark.slow
def test_killed_run_resumes_to_the_same_weights(tiny_imagefolder, tmp_path):
    reference = tmp_path / 'uninterrupted'
    train(reference, tiny_imagefolder, epochs=3)
    killed = tmp_path / 'killed'
    cmd = [sys.executable, str(ROOT / 'tools' / 'train.py'), CONFIG, '--work-dir', str(killed), '--cfg-options',
           *tiny_options(tiny_imagefolder, 3)]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    deadline = time.time() + 600
    while not (killed / 'epoch_1.pth').exists():
        assert proc.poll() is None and time.time() < deadline, 'training died before its first checkpoint'
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGKILL)  # mid epoch 2
    proc.wait()
    assert not (killed / 'epoch_3.pth').exists()
    train(killed, tiny_imagefolder, epochs=3, extra=['resume=True'])
    ref, res = load_weights(reference / 'epoch_3.pth'), load_weights(killed / 'epoch_3.pth')
    assert ref.keys() == res.keys()
    for key in ref:
        torch.testing.assert_close(res[key], ref[key], rtol=0, atol=1e-6, msg=key)
    ema_ref = torch.load(reference / 'epoch_3.pth', weights_only=True)['ema_state_dict']
    ema_res = torch.load(killed / 'epoch_3.pth', weights_only=True)['ema_state_dict']
    for key in ema_ref:
        torch.testing.assert_close(ema_res[key], ema_ref[key], rtol=0, atol=1e-6, msg=key)


@pytest.mark.slow
def test_ddp_two_processes_hold_identical_weights(tiny_imagefolder, tmp_path):
    work = tmp_path / 'ddp'
    config = tmp_path / 'ddp_config.py'
    config.write_text(f"_base_ = [{CONFIG!r}]\n"
                      "custom_imports = dict(imports=['nalaformer.classification', 'engine_probe'], allow_failed_imports=False)\n"
                      "custom_hooks = [dict(type='DualEMAHook', momentum=1e-3), dict(type='EpochSeedHook'),\n"
                      "                dict(type='ResumableCheckpointHook'), dict(type='DumpRankWeightsHook')]\n")
    cmd = [sys.executable, '-m', 'torch.distributed.run', '--nproc_per_node', '2', '--master_port', '29531',
           str(ROOT / 'tools' / 'train.py'), str(config), '--launcher', 'pytorch', '--work-dir', str(work),
           '--cfg-options', *tiny_options(tiny_imagefolder, 1)]
    env = {**os.environ, 'PYTHONPATH': f'{ROOT / "tests"}{os.pathsep}{os.environ.get("PYTHONPATH", "")}',
           'OMP_NUM_THREADS': '1'}
    result = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, env=env, timeout=900)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-5000:]
    rank0 = torch.load(work / 'rank0_weights.pt', weights_only=True)
    rank1 = torch.load(work / 'rank1_weights.pt', weights_only=True)
    # parameters are synchronised by DDP; BatchNorm running statistics stay per process without SyncBN (CPU)
    params = [k for k in rank0 if not k.endswith(('running_mean', 'running_var', 'num_batches_tracked'))]
    assert len(params) > 50
    for key in params:
        torch.testing.assert_close(rank0[key], rank1[key], rtol=0, atol=0, msg=key)
    losses = [r['loss'] for r in logged_scalars(work) if 'loss' in r]
    assert len(losses) == 3  # 36 images / (2 ranks x 6 per rank) iterations in the epoch
    trained = load_weights(work / 'epoch_1.pth')
    torch.testing.assert_close(trained['model.proj.weight'], rank0['model.proj.weight'])


@pytest.mark.slow
def test_amp_bf16_training_is_finite(tiny_imagefolder, tmp_path):
    work = tmp_path / 'amp'
    train(work, tiny_imagefolder, epochs=1, extra=['train_cfg.val_interval=5'])  # fp32 reference run
    run_tool('train.py', CONFIG, '--amp', '--work-dir', tmp_path / 'amp_bf16', '--cfg-options',
             *tiny_options(tiny_imagefolder, 1, ['train_cfg.val_interval=5']))
    losses = [r['loss'] for r in logged_scalars(tmp_path / 'amp_bf16') if 'loss' in r]
    assert len(losses) == 6 and all(torch.isfinite(torch.tensor(losses)))


@pytest.mark.slow
def test_dual_ema_tracking_the_raw_weights_reports_the_raw_metrics(tiny_imagefolder, tmp_path):
    work = tmp_path / 'ema'
    train(work, tiny_imagefolder, epochs=1, extra=['custom_hooks.0.momentum=0.99999'])  # EMA ~ raw weights
    [val] = [r for r in logged_scalars(work) if 'accuracy/top1' in r]
    assert val['ema/accuracy/top1'] == val['accuracy/top1'] and val['ema/accuracy/top5'] == val['accuracy/top5']


@pytest.mark.slow
def test_auto_scale_lr_and_ema_follow_the_total_batch(tiny_imagefolder, tmp_path):
    """The release's rules at 6 images x 2 accumulation steps: lr x 12 / 1024, EMA decay 0.99996 ** (6 / 512) per
    iteration; both are logged, and the best raw and the best EMA checkpoints are kept."""
    work = tmp_path / 'scaled'
    result = run_tool('train.py', CONFIG, '--auto-scale-lr', '--work-dir', work, '--cfg-options',
                      *tiny_options(tiny_imagefolder, 1, ['optim_wrapper.accumulative_counts=2']))
    log = result.stdout + result.stderr
    assert 'total batch 12 (1 processes x 6 images x 2 accumulation steps) / base_batch_size 1024' in log
    lrs = [r['lr'] for r in logged_scalars(work) if 'lr' in r]
    assert lrs and lrs == pytest.approx([2e-3 * 12 / 1024] * len(lrs))
    [momentum] = re.findall(r'EMA momentum ([0-9.e+-]+) per iteration', log)
    assert float(momentum) == pytest.approx(1 - 0.99996 ** (6 / 512), rel=1e-3)
    assert list(work.glob('best_accuracy_top1_epoch_1.pth')) and list(work.glob('best_ema_accuracy_top1_epoch_1.pth'))


@pytest.mark.slow
def test_missing_dataset_folder_is_named(tmp_path):
    result = train(tmp_path / 'w', tmp_path / 'no_such_dataset', check=False)
    assert result.returncode != 0 and 'Traceback' not in result.stderr
    assert f'{tmp_path / "no_such_dataset" / "train"} does not exist' in result.stderr
    assert 'Expected layout' in result.stderr


@pytest.mark.slow
def test_test_tool_evaluates_release_checkpoints_and_names_wrong_variants(tiny_imagefolder, tmp_path):
    import argparse

    import timm
    model = timm.create_model('nalaformer_t', num_classes=3, embed_dims=[16, 32, 48, 64], depths=[1, 1, 1, 1],
                              num_heads=[1, 2, 3, 4], head_hidden_size=32)
    release = tmp_path / 'release.pth'
    torch.save({'model': model.state_dict(), 'args': argparse.Namespace(model='NALAFORMER_T')}, release)
    out = run_tool('test.py', CONFIG, release, '--work-dir', tmp_path / 't', '--cfg-options',
                   *tiny_options(tiny_imagefolder))
    assert 'accuracy/top1' in out.stdout.strip().splitlines()[-1]
    other = timm.create_model('nalaformer_xt', num_classes=3)
    wrong = tmp_path / 'xt.pth'
    torch.save({'model': other.state_dict()}, wrong)
    bad = run_tool('test.py', CONFIG, wrong, '--work-dir', tmp_path / 't2', '--cfg-options',
                   *tiny_options(tiny_imagefolder), check=False)
    assert bad.returncode != 0 and 'looks like nalaformer_xt' in bad.stderr
    no_ema = run_tool('test.py', CONFIG, release, '--ema', '--work-dir', tmp_path / 't3', '--cfg-options',
                      *tiny_options(tiny_imagefolder), check=False)
    assert no_ema.returncode != 0 and 'has no EMA weights' in no_ema.stderr and "'model'" in no_ema.stderr
    assert 'Traceback' not in no_ema.stderr  # a problem with the arguments: one line


@pytest.mark.slow
def test_wandb_offline_and_missing(tiny_imagefolder, tmp_path):
    opts = tiny_options(tiny_imagefolder, 1, ['train_cfg.val_interval=5'])
    run_tool('train.py', CONFIG, '--wandb', 'nalaformer-test', '--work-dir', tmp_path / 'offline', '--cfg-options',
             *opts, env={'WANDB_MODE': 'offline', 'WANDB_SILENT': 'true'})
    [run] = (tmp_path / 'offline').glob('*/vis_data/wandb/offline-run-*')  # beside the run's other logs
    assert list(run.glob('*.wandb')), 'the offline wandb run holds no data'
    fake = tmp_path / 'no_wandb'
    fake.mkdir()
    (fake / 'wandb.py').write_text('raise ImportError("wandb is not installed")\n')
    result = run_tool('train.py', CONFIG, '--wandb', 'nalaformer-test', '--work-dir', tmp_path / 'missing',
                      '--cfg-options', *opts, env={'PYTHONPATH': str(fake)})
    assert 'wandb is not installed' in result.stderr
    assert (tmp_path / 'missing' / 'epoch_1.pth').exists()


# ----------------------------------------------------------------------------------------------
# Our own checkpoints through our own tools: EMA, recorded definitions, damaged files, errors
# ----------------------------------------------------------------------------------------------
RELU = 'model.attn_types=[relu,relu,relu,relu]'
TINY_MODEL = dict(num_classes=3, embed_dims=[16, 32, 48, 64], depths=[1, 1, 1, 1], num_heads=[1, 2, 3, 4],
                  head_hidden_size=32)


@pytest.fixture(scope='module')
def relu_run(tiny_imagefolder, tmp_path_factory):
    """2 epochs of a ReLU-attention model; a fast EMA so that its weights differ from the raw ones."""
    work = tmp_path_factory.mktemp('relu_run')
    train(work, tiny_imagefolder, epochs=2, extra=[RELU, 'custom_hooks.0.momentum=0.3'])
    return work


def ema_of(checkpoint: dict) -> dict:
    """mmengine's averaged model: 'module.<runner key>' and a step counter."""
    return {k[len('module.'):]: v for k, v in checkpoint['ema_state_dict'].items() if k != 'steps'}


@pytest.mark.xdist_group('engine_relu_run')
@pytest.mark.slow
def test_runner_checkpoints_convert_with_raw_or_ema_weights(relu_run, tmp_path):
    import timm
    from safetensors.torch import load_file

    from nalaformer.checkpoint import Checkpoint
    checkpoint = torch.load(relu_run / 'epoch_2.pth', map_location='cpu', weights_only=True)
    [recorded] = checkpoint['meta']['model_definitions']
    assert recorded['module'] == 'model' and recorded['model_args']['attn_types'] == ['relu'] * 4
    raw = {k[len('model.'):]: v for k, v in checkpoint['state_dict'].items()}
    ema = {k[len('model.'):]: v for k, v in ema_of(checkpoint).items()}
    assert any(not torch.equal(raw[k], ema[k]) for k in raw)
    for flag, want in ((['--raw'], raw), (['--ema'], ema), ([], ema)):  # EMA by default where the run kept them
        out = run_tool('convert_checkpoint.py', relu_run / 'epoch_2.pth', tmp_path / 'w.safetensors', *flag)
        assert 'nalaformer_t' in out.stdout and 'relu' in out.stdout
        got = load_file(str(tmp_path / 'w.safetensors'))
        assert got.keys() == want.keys() and all(torch.equal(got[k], want[k]) for k in want)
        assert Checkpoint.read(tmp_path / 'w.safetensors').definitions[0]['model_args'] == recorded['model_args']
    # the runner checkpoint itself also serves pretrained= (raw or EMA), with its definition checked
    for ema_flag, want in ((False, raw), (True, ema)):
        model = timm.create_model('nalaformer_t', pretrained=True, pretrained_ema=ema_flag, attn_types='relu',
                                  pretrained_cfg_overlay=dict(file=str(relu_run / 'epoch_2.pth')), **TINY_MODEL)
        assert all(torch.equal(v, want[k]) for k, v in model.state_dict().items())
    with pytest.raises(ValueError, match='relu'):
        timm.create_model('nalaformer_t', pretrained=True, **TINY_MODEL,
                          pretrained_cfg_overlay=dict(file=str(relu_run / 'epoch_2.pth')))


@pytest.mark.xdist_group('engine_relu_run')
@pytest.mark.slow
def test_runner_checkpoints_become_timm_folders_with_raw_or_ema_weights(relu_run, tiny_imagefolder, tmp_path):
    """convert_checkpoint.py RUN.pth DIR [--raw | --ema]: timm rebuilds the run's model (its architecture and attention
    from the folder alone) with exactly the raw or EMA weights, and tools/test.py evaluates the folder."""
    import timm
    checkpoint = torch.load(relu_run / 'epoch_2.pth', map_location='cpu', weights_only=True)
    raw = {k[len('model.'):]: v for k, v in checkpoint['state_dict'].items()}
    ema = {k[len('model.'):]: v for k, v in ema_of(checkpoint).items()}
    for flag, want in ((['--raw'], raw), (['--ema'], ema)):
        run_tool('convert_checkpoint.py', relu_run / 'epoch_2.pth', tmp_path / f'folder{flag}', *flag)
        model = timm.create_model(f'local-dir:{tmp_path / f"folder{flag}"}', pretrained=True,
                                  pretrained_ema=flag == ['--ema'])
        assert model.attn_types == ('relu',) * 4 and model.num_classes == TINY_MODEL['num_classes']
        assert model.state_dict().keys() == want.keys()
        assert all(torch.equal(v, want[k]) for k, v in model.state_dict().items())
    options = [*tiny_options(tiny_imagefolder), RELU]
    by_folder = run_tool('test.py', CONFIG, tmp_path / "folder['--ema']", '--work-dir', tmp_path / 'a',
                         '--cfg-options', *options)
    by_flag = run_tool('test.py', CONFIG, relu_run / 'epoch_2.pth', '--ema', '--work-dir', tmp_path / 'b',
                       '--cfg-options', *options)
    assert eval(by_folder.stdout.strip().splitlines()[-1]) == eval(by_flag.stdout.strip().splitlines()[-1])


@pytest.mark.xdist_group('engine_relu_run')
@pytest.mark.slow
def test_test_tool_ema_evaluates_exactly_the_ema_weights(relu_run, tiny_imagefolder, tmp_path):
    from nalaformer.checkpoint import Checkpoint, load_checkpoint_into
    from nalaformer.classification import TimmClassifier
    checkpoint = torch.load(relu_run / 'epoch_2.pth', map_location='cpu', weights_only=True)
    model = TimmClassifier('nalaformer_t', attn_types='relu', **TINY_MODEL)
    load_checkpoint_into(model, Checkpoint.read(relu_run / 'epoch_2.pth'), ema=True)
    ema = ema_of(checkpoint)
    assert model.state_dict().keys() == ema.keys() and all(torch.equal(v, ema[k]) for k, v in model.state_dict().items())

    options = [*tiny_options(tiny_imagefolder), RELU]
    run_tool('convert_checkpoint.py', relu_run / 'epoch_2.pth', tmp_path / 'ema.safetensors', '--ema')
    by_flag = run_tool('test.py', CONFIG, relu_run / 'epoch_2.pth', '--ema', '--work-dir', tmp_path / 'a',
                       '--cfg-options', *options)
    by_file = run_tool('test.py', CONFIG, tmp_path / 'ema.safetensors', '--work-dir', tmp_path / 'b',
                       '--cfg-options', *options)
    assert eval(by_flag.stdout.strip().splitlines()[-1]) == eval(by_file.stdout.strip().splitlines()[-1])


@pytest.mark.xdist_group('engine_relu_run')
@pytest.mark.slow
def test_test_tool_reads_the_checkpoint_once_and_enters_the_model_once(relu_run, tiny_imagefolder, tmp_path,
                                                                       monkeypatch):
    """docs/checkpoints.md: on tools/test.py's path the file is read once and the weights enter the model once."""
    import importlib.util

    from nalaformer.errors import run_tool as run_in_process
    spec = importlib.util.spec_from_file_location('test_tool', ROOT / 'tools' / 'test.py')
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    checkpoint, reads, entries = relu_run / 'epoch_2.pth', [], []
    load, load_state_dict = torch.load, torch.nn.Module.load_state_dict

    def counted_load(f, *args, **kwargs):
        reads.append(Path(f))
        return load(f, *args, **kwargs)

    def counted_load_state_dict(module, *args, **kwargs):
        entries.append(type(module).__name__)
        return load_state_dict(module, *args, **kwargs)

    monkeypatch.setattr(torch, 'load', counted_load)
    monkeypatch.setattr(torch.nn.Module, 'load_state_dict', counted_load_state_dict)
    argv = [CONFIG, str(checkpoint), '--work-dir', str(tmp_path), '--cfg-options', *tiny_options(tiny_imagefolder),
            RELU]
    assert run_in_process(tool.main, argv) == 0
    assert reads.count(checkpoint) == 1, reads
    assert entries == ['TimmClassifier'], entries


@pytest.mark.xdist_group('engine_relu_run')
@pytest.mark.slow
def test_test_tool_refuses_a_checkpoint_of_another_attention(relu_run, tiny_imagefolder, tmp_path):
    bad = run_tool('test.py', CONFIG, relu_run / 'epoch_2.pth', '--work-dir', tmp_path / 'a',
                   '--cfg-options', *tiny_options(tiny_imagefolder), check=False)
    assert bad.returncode != 0 and 'Traceback' not in bad.stderr
    assert "attn_types=['relu', 'relu', 'relu', 'relu']" in bad.stderr
    assert "attn_types=['nala', 'nala', 'softmax', 'softmax']" in bad.stderr
    assert '--cfg-options model.attn_types=' in bad.stderr and '--accept-definition-change' in bad.stderr
    accepted = run_tool('test.py', CONFIG, relu_run / 'epoch_2.pth', '--accept-definition-change',
                        '--work-dir', tmp_path / 'b', '--cfg-options', *tiny_options(tiny_imagefolder))
    assert 'accuracy/top1' in accepted.stdout.strip().splitlines()[-1]


@pytest.mark.xdist_group('engine_relu_run')
@pytest.mark.slow
def test_truncated_last_checkpoint_names_the_one_to_resume_from(relu_run, tiny_imagefolder, tmp_path):
    import shutil
    work = tmp_path / 'run'
    shutil.copytree(relu_run, work)
    assert (work / 'epoch_1.pth').is_file()  # the last two epoch checkpoints are kept
    last = work / 'epoch_2.pth'
    (work / 'last_checkpoint').write_text(str(last))
    last.write_bytes(last.read_bytes()[:len(last.read_bytes()) // 2])
    result = train(work, tiny_imagefolder, epochs=3, extra=[RELU, 'custom_hooks.0.momentum=0.3', 'resume=True'],
                   check=False)
    assert result.returncode != 0
    assert f'{last} is not a readable PyTorch checkpoint: it is truncated or corrupt' in result.stderr
    assert f'resume from it with --resume {work / "epoch_1.pth"}' in result.stderr


@pytest.mark.slow
def test_unreadable_validation_image_keeps_its_traceback_and_names_the_image(tiny_imagefolder, tmp_path):
    import shutil
    data = tmp_path / 'data'
    shutil.copytree(tiny_imagefolder, data)
    broken = data / 'val' / 'class1' / '3.png'
    broken.write_bytes(b'not an image')
    result = train(tmp_path / 'w', data, epochs=1, check=False)
    assert result.returncode != 0
    assert 'Traceback (most recent call last)' in result.stderr
    assert f'cannot read image {broken}' in result.stderr
