"""tools/{dist,slurm}_{train,test}.sh build the commands mmdetection's and mmsegmentation's launchers build.

`srun` and the Python that runs torch's elastic launcher (`python3`, or `PYTHON`) are replaced by stubs that record
their arguments.
"""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TOOLS = ROOT / 'tools'
CONFIG = 'configs/ade20k/upernet_nalaformer-t_8xb2-160k_ade20k-512x512.py'
LAUNCHER_ENV = ('GPUS', 'GPUS_PER_NODE', 'CPUS_PER_TASK', 'SRUN_ARGS', 'NNODES', 'NODE_RANK', 'MASTER_ADDR', 'PORT')

RECORDER = f'''#!{sys.executable}
import json, os, sys
with open(os.environ['STUB_LOG'], 'a') as f:
    f.write(json.dumps({{'program': os.path.basename(sys.argv[0]), 'argv': sys.argv[1:],
                        'pythonpath': os.environ.get('PYTHONPATH', '')}}) + '\\n')
'''


@pytest.fixture
def stubs(tmp_path):
    """A folder with `srun`, `python3` and `my-python` stubs; returns a function that runs a launcher and gives the
    calls."""
    bin_dir = tmp_path / 'bin'
    bin_dir.mkdir()
    for name in ('srun', 'python3', 'my-python'):
        (bin_dir / name).write_text(RECORDER)
        (bin_dir / name).chmod(0o755)
    log = tmp_path / 'calls.jsonl'

    def launch(script, *args, **env):
        base = {k: v for k, v in os.environ.items() if k not in LAUNCHER_ENV and k != 'PYTHON'}
        result = subprocess.run(['bash', str(TOOLS / script), *args], capture_output=True, text=True, timeout=60,
                                env={**base, 'PATH': f'{bin_dir}{os.pathsep}{os.environ["PATH"]}',
                                     'STUB_LOG': str(log), **env})
        calls = [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
        log.unlink(missing_ok=True)
        return result, calls
    return launch


def test_slurm_train_takes_work_dir_and_gpus_from_the_environment(stubs):
    result, [call] = stubs('slurm_train.sh', 'gpu', 'upernet-t', CONFIG, 'work_dirs/upernet-t', '--amp',
                           GPUS='16', SRUN_ARGS='--quotatype=auto --exclusive')
    assert result.returncode == 0, result.stderr
    assert call['program'] == 'srun'
    assert call['argv'] == [
        '-p', 'gpu', '--job-name=upernet-t', '--gres=gpu:8', '--ntasks=16', '--ntasks-per-node=8',
        '--cpus-per-task=5', '--kill-on-bad-exit=1', '--quotatype=auto', '--exclusive',
        'python3', '-u', str(TOOLS / 'train.py'), CONFIG, '--work-dir=work_dirs/upernet-t', '--launcher=slurm', '--amp']
    assert call['pythonpath'].split(os.pathsep)[0] == str(ROOT)


def test_slurm_train_defaults_and_mmseg_style_call(stubs):
    # mmsegmentation's slurm_train.sh has no WORK_DIR: options follow the config directly
    result, [call] = stubs('slurm_train.sh', 'gpu', 'job', CONFIG, '--cfg-options', 'randomness.seed=1',
                           GPUS_PER_NODE='4', CPUS_PER_TASK='10')
    assert result.returncode == 0, result.stderr
    assert call['argv'][:7] == ['-p', 'gpu', '--job-name=job', '--gres=gpu:4', '--ntasks=8', '--ntasks-per-node=4',
                                '--cpus-per-task=10']
    assert call['argv'][-4:] == [CONFIG, '--launcher=slurm', '--cfg-options', 'randomness.seed=1']
    assert not any(a.startswith('--work-dir') for a in call['argv'])
    result, [call] = stubs('slurm_train.sh', 'gpu', 'job', CONFIG, GPUS='2')  # fewer GPUs than a node
    assert call['argv'][3:6] == ['--gres=gpu:2', '--ntasks=2', '--ntasks-per-node=2']


def test_slurm_train_old_gpu_argument_is_an_error(stubs):
    result, calls = stubs('slurm_train.sh', 'gpu', 'job', CONFIG, '16')
    assert result.returncode == 2 and not calls
    assert 'GPUS=16' in result.stderr and 'environment' in result.stderr


def test_slurm_test(stubs):
    result, [call] = stubs('slurm_test.sh', 'gpu', 'eval', CONFIG, 'ckpt.pth', '--tta', GPUS='4')
    assert result.returncode == 0, result.stderr
    assert call['argv'] == [
        '-p', 'gpu', '--job-name=eval', '--gres=gpu:4', '--ntasks=4', '--ntasks-per-node=4', '--cpus-per-task=5',
        '--kill-on-bad-exit=1', 'python3', '-u', str(TOOLS / 'test.py'), CONFIG, 'ckpt.pth', '--launcher=slurm',
        '--tta']


def test_dist_train_multi_node(stubs):
    result, [call] = stubs('dist_train.sh', CONFIG, '8', '--auto-scale-lr',
                           NNODES='2', NODE_RANK='1', MASTER_ADDR='10.1.1.1', PORT='29600')
    assert result.returncode == 0, result.stderr
    assert call['program'] == 'python3'
    assert call['argv'] == [
        '-m', 'torch.distributed.run', '--nnodes=2', '--node_rank=1', '--master_addr=10.1.1.1', '--nproc_per_node=8',
        '--master_port=29600', str(TOOLS / 'train.py'), CONFIG, '--launcher', 'pytorch', '--auto-scale-lr']
    assert call['pythonpath'].split(os.pathsep)[0] == str(ROOT)


def test_dist_test_defaults(stubs):
    result, [call] = stubs('dist_test.sh', CONFIG, 'ckpt.pth', '2', '--show-dir', 'vis')
    assert result.returncode == 0, result.stderr
    assert call['argv'] == [
        '-m', 'torch.distributed.run', '--nnodes=1', '--node_rank=0', '--master_addr=127.0.0.1', '--nproc_per_node=2',
        '--master_port=29500', str(TOOLS / 'test.py'), CONFIG, 'ckpt.pth', '--launcher', 'pytorch', '--show-dir', 'vis']


@pytest.mark.parametrize('script, args', [('dist_train.sh', [CONFIG]), ('dist_test.sh', [CONFIG, 'ckpt.pth']),
                                          ('slurm_train.sh', ['gpu', 'job']),
                                          ('slurm_test.sh', ['gpu', 'job', CONFIG])])
def test_missing_arguments_print_usage(stubs, script, args):
    result, calls = stubs(script, *args)
    assert result.returncode == 2 and not calls and result.stderr.startswith('usage:')


@pytest.mark.parametrize('script, args', [('dist_train.sh', [CONFIG, '1']), ('dist_test.sh', [CONFIG, 'ckpt.pth', '1']),
                                          ('slurm_train.sh', ['gpu', 'job', CONFIG]),
                                          ('slurm_test.sh', ['gpu', 'job', CONFIG, 'ckpt.pth'])])
def test_python_picks_the_interpreter(stubs, script, args):
    result, [call] = stubs(script, *args, PYTHON='my-python')
    assert result.returncode == 0, result.stderr
    if script.startswith('dist'):
        assert call['program'] == 'my-python' and call['argv'][:2] == ['-m', 'torch.distributed.run']
    else:
        assert call['program'] == 'srun' and 'my-python' in call['argv'] and 'python3' not in call['argv']
