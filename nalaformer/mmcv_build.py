"""Which mmcv build a machine needs (CPU or CUDA ops), and whether the installed mmcv can run a config here.

mmdet's RoIAlign and NMS are mmcv's compiled ops: a GPU run of a detection config needs mmcv built with
CUDA for that GPU. ``scripts/install_openmmlab.sh`` asks this module for its build plan::

    python -m nalaformer.mmcv_build plan     # shell assignments: MMCV_BUILD, TORCH_CUDA_ARCH_LIST, ...

and ``tools/train.py`` / ``tools/test.py`` call :func:`check_mmcv_ops` at start-up. Only the standard
library and torch are imported, so the plan works before mmcv is installed.

mmcv built without compiled ops (mmcv-lite, ``MMCV_WITH_OPS=0``: a pure-Python wheel, for a machine where
no build fits) is enough for UperNet / FPN segmentors, but mmsegmentation imports two of mmcv's ops
whatever the model: :func:`allow_mmcv_lite` stands in for them.
"""
import os
import re
import shlex
import shutil
import subprocess
import sys
import types
from dataclasses import dataclass, field
from typing import List, Optional, Tuple

__all__ = ['Toolchain', 'BuildPlan', 'probe', 'build_plan', 'installed_cuda_ops', 'needs_compiled_ops',
           'check_mmcv_ops', 'MmcvOpsError', 'lite_ops_module', 'allow_mmcv_lite']

INSTALL_HINT = 'MMCV_FORCE_REBUILD=1 bash scripts/install_openmmlab.sh'


class MmcvOpsError(RuntimeError):
    """The installed mmcv lacks the compiled ops a run needs; the message says how to get them."""


@dataclass
class Toolchain:
    """What decides the build: the CUDA compiler, torch's CUDA, the visible GPUs, an explicit override."""
    nvcc: Optional[str] = None                 # path of nvcc, or None
    nvcc_cuda: Optional[str] = None            # its CUDA release, e.g. '12.8'
    torch_cuda: Optional[str] = None           # torch.version.cuda (None: a CPU build of torch)
    capabilities: List[Tuple[int, int]] = field(default_factory=list)  # of the visible GPUs
    arch_override: Optional[str] = None        # $MMCV_CUDA_ARCH, e.g. '8.0;9.0'


@dataclass
class BuildPlan:
    cuda: bool
    arch_list: Optional[str]  # TORCH_CUDA_ARCH_LIST for a CUDA build
    cache_tag: str            # the wheel cache is keyed by torch version plus this tag
    note: str                 # what was decided and why, for the log

    def shell(self) -> str:
        values = dict(MMCV_BUILD='cuda' if self.cuda else 'cpu', FORCE_CUDA=int(self.cuda),
                      TORCH_CUDA_ARCH_LIST=self.arch_list or '', MMCV_CACHE_TAG=self.cache_tag, MMCV_PLAN_NOTE=self.note)
        return '\n'.join(f'{k}={shlex.quote(str(v))}' for k, v in values.items())


def _nvcc_release(nvcc: str) -> Optional[str]:
    try:
        out = subprocess.run([nvcc, '--version'], capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    match = re.search(r'release (\d+\.\d+)', out)
    return match.group(1) if match else None


def probe() -> Toolchain:
    """The toolchain of this machine (nvcc on PATH or under $CUDA_HOME, torch, visible GPUs, $MMCV_CUDA_ARCH)."""
    import torch
    cuda_home = os.environ.get('CUDA_HOME') or os.environ.get('CUDA_PATH')
    nvcc = shutil.which('nvcc') or (shutil.which('nvcc', path=os.path.join(cuda_home, 'bin')) if cuda_home else None)
    capabilities = sorted({torch.cuda.get_device_capability(i) for i in range(torch.cuda.device_count())}) \
        if torch.cuda.is_available() else []
    return Toolchain(nvcc=nvcc, nvcc_cuda=_nvcc_release(nvcc) if nvcc else None, torch_cuda=torch.version.cuda,
                     capabilities=capabilities, arch_override=os.environ.get('MMCV_CUDA_ARCH') or None)


def build_plan(tc: Toolchain) -> BuildPlan:
    """CUDA ops when nvcc matches torch's CUDA major version and there is an architecture to build for
    (a visible GPU, or ``MMCV_CUDA_ARCH``); CPU ops otherwise, with a note on how to get the CUDA build."""
    cpu = 'cpu'
    gpu_wanted = bool(tc.capabilities or tc.arch_override)
    get_it = (f'detection on GPUs (RoIAlign, NMS) needs the CUDA build: install the CUDA toolkit (nvcc) for torch\'s '
              f'CUDA {tc.torch_cuda or "?"}, then run {INSTALL_HINT}')
    if tc.torch_cuda is None:
        return BuildPlan(False, None, cpu, 'CPU ops: torch is a CPU build (a CUDA build of torch is needed for GPU ops)')
    if tc.nvcc is None:
        note = 'CPU ops: no nvcc found (PATH, $CUDA_HOME/bin)'
        return BuildPlan(False, None, cpu, f'{note}; {get_it}' if gpu_wanted else note)
    if tc.nvcc_cuda is None or tc.nvcc_cuda.split('.')[0] != tc.torch_cuda.split('.')[0]:
        return BuildPlan(False, None, cpu, f'CPU ops: nvcc {tc.nvcc} is CUDA {tc.nvcc_cuda or "unknown"}, torch was '
                                           f'built with CUDA {tc.torch_cuda} (the major versions must match); {get_it}')
    if not gpu_wanted:
        return BuildPlan(False, None, cpu, 'CPU ops: nvcc found but no GPU is visible; set MMCV_CUDA_ARCH (e.g. 9.0 '
                                           'for H100/H200) to build CUDA ops for a GPU of another machine')
    arch_list = tc.arch_override or ';'.join(f'{major}.{minor}' for major, minor in tc.capabilities)
    archs = re.sub(r'[^0-9;]', '', arch_list).replace(';', '-')
    tag = f'cu{tc.torch_cuda.replace(".", "")}-sm{archs}'
    source = 'MMCV_CUDA_ARCH' if tc.arch_override else 'the visible GPUs'
    return BuildPlan(True, arch_list, tag, f'CUDA ops for architectures {arch_list} ({source}), nvcc CUDA '
                                          f'{tc.nvcc_cuda}, torch CUDA {tc.torch_cuda}')


def installed_cuda_ops() -> Optional[str]:
    """The CUDA version the installed mmcv's ops were compiled with, or None (CPU ops only, or no mmcv ops)."""
    try:
        from mmcv.ops import get_compiling_cuda_version
    except ImportError:
        return None
    version = get_compiling_cuda_version()
    return None if version in ('', 'not available') else version


def needs_compiled_ops(cfg) -> bool:
    """Detection configs (mmdet's scope) use mmcv's RoIAlign / NMS; classification and UperNet/FPN segmentation
    use none of mmcv's compiled ops."""
    return cfg.get('default_scope') == 'mmdet'


def check_mmcv_ops(cfg, cuda_available: Optional[bool] = None, cuda_ops: Optional[str] = '?') -> None:
    """Raise :class:`MmcvOpsError` when a GPU run of ``cfg`` would need mmcv CUDA ops that the installed mmcv
    lacks (it would otherwise fail inside the first RoI or NMS call). ``cuda_available`` / ``cuda_ops``
    default to this machine's."""
    if not needs_compiled_ops(cfg):
        return
    if cuda_available is None:
        import torch
        cuda_available = torch.cuda.is_available()
    if not cuda_available:
        return
    if cuda_ops == '?':
        cuda_ops = installed_cuda_ops()
    if cuda_ops is None:
        raise MmcvOpsError(
            'this detection config runs on the GPU, but the installed mmcv has CPU ops only (its RoIAlign and NMS '
            f'have no CUDA implementation). Build mmcv with CUDA ops: {INSTALL_HINT} (needs nvcc for torch\'s CUDA '
            'version; MMCV_CUDA_ARCH overrides the architectures), or run on the CPU with CUDA_VISIBLE_DEVICES=.')


# What mmsegmentation 1.x imports from mmcv.ops unguarded (mmseg.utils, its focal loss) whatever the model;
# its other imports of mmcv.ops fall back when they raise ModuleNotFoundError.
MMSEG_UNGUARDED_OPS = ('point_sample', 'sigmoid_focal_loss')


def lite_ops_module() -> types.ModuleType:
    """A stand-in ``mmcv.ops`` for an mmcv without compiled ops: the ops of ``MMSEG_UNGUARDED_OPS`` raise
    :class:`MmcvOpsError` when called; importing any other name raises ModuleNotFoundError, as the real
    ``mmcv.ops`` of such an mmcv does."""
    module = types.ModuleType('mmcv.ops', 'A stand-in for mmcv-lite (no compiled ops): see nalaformer.mmcv_build')

    def missing(name):
        def op(*args, **kwargs):
            raise MmcvOpsError(f'mmcv.ops.{name} is a compiled op and this mmcv has none (mmcv-lite): '
                               f'build mmcv with ops ({INSTALL_HINT})')
        op.__name__ = name
        return op

    def getattr_(name):
        if name.startswith('__'):  # module attributes that introspection (inspect, pickle) looks for
            raise AttributeError(name)
        raise ModuleNotFoundError(f'mmcv.ops.{name}: this mmcv has no compiled ops (mmcv-lite)', name='mmcv._ext')

    for name in MMSEG_UNGUARDED_OPS:
        setattr(module, name, missing(name))
    module.__getattr__ = getattr_
    return module


def allow_mmcv_lite() -> bool:
    """Install :func:`lite_ops_module` as ``mmcv.ops`` where mmcv has no compiled ops, so that mmsegmentation
    imports; True if it did, False where ``mmcv.ops`` imports (nothing changes). Call before importing mmseg."""
    try:
        import mmcv.ops  # noqa: F401
        return False
    except ModuleNotFoundError as e:
        if e.name != 'mmcv._ext':  # no mmcv at all, or something else missing: not ours to hide
            raise
    import mmcv
    sys.modules['mmcv.ops'] = mmcv.ops = lite_ops_module()
    return True


def main(argv=None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args != ['plan']:
        print('usage: python -m nalaformer.mmcv_build plan', file=sys.stderr)
        return 2
    print(build_plan(probe()).shell())
    return 0


if __name__ == '__main__':
    sys.exit(main())
