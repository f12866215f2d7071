"""The mmcv build decision (CPU or CUDA ops) with faked toolchains and devices, and the start-up check of
tools/train.py / tools/test.py for GPU runs that need mmcv CUDA ops."""
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from nalaformer.mmcv_build import INSTALL_HINT, MmcvOpsError, Toolchain, build_plan, check_mmcv_ops

ROOT = Path(__file__).resolve().parents[1]
NVCC = '/usr/local/cuda/bin/nvcc'


def test_cuda_ops_for_the_visible_gpus():
    plan = build_plan(Toolchain(nvcc=NVCC, nvcc_cuda='12.8', torch_cuda='12.8', capabilities=[(8, 0), (9, 0)]))
    assert plan.cuda and plan.arch_list == '8.0;9.0' and plan.cache_tag == 'cu128-sm80-90'


def test_an_explicit_architecture_list_wins_and_builds_without_a_gpu():
    plan = build_plan(Toolchain(nvcc=NVCC, nvcc_cuda='12.4', torch_cuda='12.1', arch_override='9.0'))
    assert plan.cuda and plan.arch_list == '9.0' and plan.cache_tag == 'cu121-sm90'
    with_gpu = build_plan(Toolchain(nvcc=NVCC, nvcc_cuda='12.4', torch_cuda='12.1', capabilities=[(8, 6)],
                                    arch_override='9.0'))
    assert with_gpu.arch_list == '9.0'


def test_wheels_are_cached_per_cuda_version_and_architecture():
    tags = {build_plan(Toolchain(nvcc=NVCC, nvcc_cuda=cuda, torch_cuda=cuda, capabilities=caps)).cache_tag
            for cuda in ('12.1', '12.8') for caps in ([(8, 0)], [(9, 0)])}
    tags.add(build_plan(Toolchain(torch_cuda=None)).cache_tag)
    assert len(tags) == 5 and 'cpu' in tags


@pytest.mark.parametrize('toolchain, reason, tells_how', [
    (Toolchain(torch_cuda=None, capabilities=[]), 'torch is a CPU build', False),
    (Toolchain(nvcc=None, torch_cuda='12.8', capabilities=[(9, 0)]), 'no nvcc found', True),
    (Toolchain(nvcc=None, torch_cuda='12.8'), 'no nvcc found', False),
    (Toolchain(nvcc=NVCC, nvcc_cuda='11.8', torch_cuda='12.8', capabilities=[(9, 0)]), 'major versions must match', True),
    (Toolchain(nvcc=NVCC, nvcc_cuda='12.8', torch_cuda='12.8'), 'no GPU is visible', False),
])
def test_cpu_ops_otherwise_saying_why_and_how_to_get_cuda_ops(toolchain, reason, tells_how):
    plan = build_plan(toolchain)
    assert not plan.cuda and plan.cache_tag == 'cpu' and plan.arch_list is None
    assert reason in plan.note
    assert (INSTALL_HINT in plan.note) == tells_how


def _fake_nvcc(folder: Path, release: str) -> None:
    folder.mkdir()
    nvcc = folder / 'nvcc'
    nvcc.write_text(f'#!/bin/sh\necho "Cuda compilation tools, release {release}, V{release}.1"\n')
    nvcc.chmod(0o755)


def _plan_as_the_setup_script_reads_it(fake_bin: Path) -> dict:
    """``eval "$(python nalaformer/mmcv_build.py plan)"`` as scripts/install_openmmlab.sh does, on this machine's
    torch with a fake nvcc first on PATH and MMCV_CUDA_ARCH set (there is no GPU here)."""
    env = dict(os.environ, PATH=f'{fake_bin}:{os.environ["PATH"]}', MMCV_CUDA_ARCH='9.0')
    env.pop('CUDA_HOME', None)
    script = (f'eval "$("{sys.executable}" "{ROOT / "nalaformer" / "mmcv_build.py"}" plan)"; '
              'echo "$MMCV_BUILD|$FORCE_CUDA|$TORCH_CUDA_ARCH_LIST|$MMCV_CACHE_TAG|$MMCV_PLAN_NOTE"')
    out = subprocess.run(['bash', '-c', script], env=env, capture_output=True, text=True, check=True).stdout
    return dict(zip(('build', 'force', 'arch', 'tag', 'note'), out.strip().split('|')))


@pytest.mark.slow
@pytest.mark.skipif(torch.version.cuda is None, reason='needs a CUDA build of torch (the one requirements.txt pins)')
def test_the_setup_script_reads_the_plan_of_the_real_toolchain(tmp_path):
    _fake_nvcc(tmp_path / 'match', torch.version.cuda)
    plan = _plan_as_the_setup_script_reads_it(tmp_path / 'match')
    assert plan['build'] == 'cuda' and plan['force'] == '1' and plan['arch'] == '9.0'
    assert plan['tag'] == f'cu{torch.version.cuda.replace(".", "")}-sm90'
    _fake_nvcc(tmp_path / 'old', '10.2')
    plan = _plan_as_the_setup_script_reads_it(tmp_path / 'old')
    assert plan['build'] == 'cpu' and plan['force'] == '0' and 'CUDA 10.2' in plan['note']


def _config(path: str):
    from mmengine.config import Config
    return Config.fromfile(str(ROOT / path))


def test_gpu_detection_runs_stop_at_start_up_without_mmcv_cuda_ops():
    det = _config('configs/coco/mask-rcnn_nalaformer-xt_fpn_1x_coco.py')
    with pytest.raises(MmcvOpsError, match='CPU ops only') as err:
        check_mmcv_ops(det, cuda_available=True, cuda_ops=None)
    assert INSTALL_HINT in str(err.value)
    check_mmcv_ops(det, cuda_available=True, cuda_ops='12.8')    # the CUDA build
    check_mmcv_ops(det, cuda_available=False, cuda_ops=None)     # a CPU run of the CPU build
    for path in ('configs/ade20k/upernet_nalaformer-xt_8xb2-160k_ade20k-512x512.py',
                 'configs/nalaformer/nalaformer-t_8xb128_in1k.py'):  # no compiled mmcv op on their path
        check_mmcv_ops(_config(path), cuda_available=True, cuda_ops=None)


def test_the_tools_report_it_as_a_config_error(monkeypatch):
    """tools/train.py and tools/test.py print ConfigErrors as one line: on a GPU machine a detection config
    fails before anything is built when the installed mmcv has CPU ops only (as setup builds them without a
    GPU), and starts when it has CUDA ops."""
    from nalaformer.engine.launch import ConfigError, finalize_config
    from nalaformer.mmcv_build import installed_cuda_ops
    monkeypatch.setattr(torch.cuda, 'is_available', lambda: True)
    det = 'configs/coco/mask-rcnn_nalaformer-xt_fpn_1x_coco.py'
    if installed_cuda_ops() is None:
        with pytest.raises(ConfigError, match='RoIAlign and NMS'):
            finalize_config(_config(det), det, None, 'none')
    else:
        assert finalize_config(_config(det), det, None, 'none').launcher == 'none'


def test_mmcv_with_ops_is_left_alone():
    import mmcv.ops

    from nalaformer.mmcv_build import allow_mmcv_lite
    assert allow_mmcv_lite() is False and sys.modules['mmcv.ops'] is mmcv.ops and hasattr(mmcv.ops, 'RoIAlign')


@pytest.mark.slow
def test_mmcv_lite_gets_the_ops_mmseg_imports_as_stand_ins(tmp_path):
    """A fake mmcv-lite whose mmcv.ops fails to load its compiled extension, as the real one does."""
    (tmp_path / 'mmcv' / 'ops').mkdir(parents=True)
    (tmp_path / 'mmcv' / '__init__.py').write_text('')
    (tmp_path / 'mmcv' / 'ops' / '__init__.py').write_text("import importlib\nimportlib.import_module('mmcv._ext')\n")
    code = '''
import inspect, pytest
from nalaformer.mmcv_build import MmcvOpsError, allow_mmcv_lite
assert allow_mmcv_lite()
from mmcv.ops import point_sample, sigmoid_focal_loss     # mmseg.utils, mmseg's focal loss: unguarded
try:
    from mmcv.ops import PSAMask                          # mmseg's guarded imports fall back
except ModuleNotFoundError:
    PSAMask = None
assert PSAMask is None
inspect.getmodule(point_sample)                           # introspection walks sys.modules
with pytest.raises(MmcvOpsError, match='mmcv-lite'):
    point_sample(None, None)
print('ok')
'''
    env = {**os.environ, 'PYTHONPATH': os.pathsep.join([str(tmp_path), str(ROOT)])}
    proc = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True, env=env)
    assert proc.returncode == 0 and proc.stdout.strip() == 'ok', proc.stderr


@pytest.mark.slow
def test_a_missing_mmcv_is_not_hidden(tmp_path):
    (tmp_path / 'mmcv.py').write_text("raise ModuleNotFoundError('no mmcv', name='mmcv')\n")
    code = 'from nalaformer.mmcv_build import allow_mmcv_lite\nallow_mmcv_lite()\n'
    env = {**os.environ, 'PYTHONPATH': os.pathsep.join([str(tmp_path), str(ROOT)])}
    proc = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True, env=env)
    assert proc.returncode == 1 and "ModuleNotFoundError: no mmcv" in proc.stderr
