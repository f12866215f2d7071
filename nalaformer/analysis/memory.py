"""Memory of a measurement: this process's resident memory and its peak (VmRSS, VmHWM), the peak of an iteration
(CUDA allocator or resident memory), measured in a fresh process per run (``--memory-worker``), the memory the
machine has available, and glibc's allocator settings (which decide whether freed tensors leave the resident set).

CPU peaks read VmHWM, reset by writing 5 to /proc/self/clear_refs; with glibc's default allocator a second
measurement in the same process under-reports, hence one fresh process per measured run.
"""
import argparse
import ctypes
import gc
import json
import os
import resource
import subprocess
import sys
from pathlib import Path
from typing import Callable, Dict, Optional

import torch

from .machine import ProcessFailed, child_environment

__all__ = ['MIB', 'add_memory_worker_arg', 'answer_memory_worker', 'available_memory_mb', 'call_peak_mb',
           'free_memory', 'iteration_memory_mb', 'malloc_setting', 'memory_env', 'peak_rss_mb', 'reset_peak_rss',
           'rss_mb', 'run_memory_worker', 'tune_malloc', 'worker_memory']

MIB = 2 ** 20
MALLOC_VARIABLES = ('MALLOC_MMAP_MAX_', 'MALLOC_TRIM_THRESHOLD_', 'MALLOC_MMAP_THRESHOLD_')
WORKER_OPTION = '--memory-worker'


def _proc_status_mb(field: str) -> Optional[float]:
    try:
        with open('/proc/self/status') as f:
            return next(int(line.split()[1]) for line in f if line.startswith(field)) / 1024
    except (OSError, StopIteration):
        return None


def peak_rss_mb() -> float:
    """Peak resident memory of this process image (MiB)."""
    # VmHWM, not ru_maxrss: Linux carries ru_maxrss across fork + exec, so a worker started by a
    # large timing process would start at the parent's peak.
    peak = _proc_status_mb('VmHWM')
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024 if peak is None else peak


def rss_mb() -> Optional[float]:
    """Current resident memory (VmRSS, MiB); None where /proc does not say."""
    return _proc_status_mb('VmRSS')


def reset_peak_rss() -> bool:
    """Reset VmHWM to the current RSS (Linux: write 5 to /proc/self/clear_refs); False where that is refused."""
    try:
        with open('/proc/self/clear_refs', 'w') as f:
            f.write('5')
        return True
    except OSError:
        return False


def available_memory_mb() -> Optional[float]:
    """The memory the kernel says is available to new work (MemAvailable, MiB); None where /proc does not say."""
    try:
        with open('/proc/meminfo') as f:
            return next(int(line.split()[1]) for line in f if line.startswith('MemAvailable')) / 1024
    except (OSError, StopIteration):
        return None


def free_memory(device: torch.device):
    """Collect what the last run left, and hand CUDA's cached blocks back."""
    gc.collect()
    if device.type == 'cuda':
        torch.cuda.empty_cache()


def _synchronize(device: torch.device):
    if device.type == 'cuda':
        torch.cuda.synchronize(device)


def call_peak_mb(call: Callable[[], object], device: torch.device) -> Optional[float]:
    """CUDA memory at the peak of one ``call()`` beyond what was allocated before it (MiB); None on CPU."""
    if device.type != 'cuda':
        return None
    _synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)
    before = torch.cuda.memory_allocated(device)
    call()
    _synchronize(device)
    return (torch.cuda.max_memory_allocated(device) - before) / MIB


def iteration_memory_mb(step: Callable[[], None], device: torch.device, baseline_mb: float, warmup: int = 1,
                        iterations: int = 2, extra_since: str = 'warmup') -> Dict[str, Optional[float]]:
    """Peak memory (MiB) of ``iterations`` calls of ``step`` after ``warmup`` uncounted ones, in this process.

    ``peak_mb``: the whole peak of the counted calls, CUDA ``max_memory_allocated`` or VmHWM above ``baseline_mb``
    (this process after its imports). ``extra_mb``: that peak above what was allocated (CUDA) or resident (CPU)
    after the warm-up (``extra_since='warmup'``: without the weights, inputs, optimizer state and a first call's
    one-off allocations) or before it (``'build'``: with what the warm-up leaves, e.g. optimizer state); None where
    VmHWM cannot be reset.
    """
    if extra_since not in ('warmup', 'build'):
        raise ValueError(f"extra_since is 'warmup' or 'build', got {extra_since!r}")

    def allocated() -> Optional[float]:
        _synchronize(device)
        gc.collect()
        return torch.cuda.memory_allocated(device) / MIB if device.type == 'cuda' else rss_mb()

    built = allocated() if extra_since == 'build' else None
    for _ in range(warmup):
        step()
    settled = allocated() if extra_since == 'warmup' else built
    if device.type == 'cuda':
        torch.cuda.reset_peak_memory_stats(device)
    elif not reset_peak_rss():
        settled = None
    for _ in range(iterations):
        step()
    _synchronize(device)
    if device.type == 'cuda':
        peak = torch.cuda.max_memory_allocated(device) / MIB
        return dict(peak_mb=peak, extra_mb=peak - settled)
    peak = peak_rss_mb()
    return dict(peak_mb=peak - baseline_mb, extra_mb=None if settled is None else peak - settled)


def worker_memory(build: Callable[[], Callable[[], None]], device: torch.device,
                  **options) -> Dict[str, Optional[float]]:
    """In a fresh process (a ``--memory-worker``): :func:`iteration_memory_mb` of the step ``build()`` returns,
    its ``peak_mb`` above this process after its imports. ``options``: those of :func:`iteration_memory_mb`."""
    baseline = peak_rss_mb()
    step = build()
    gc.collect()
    return iteration_memory_mb(step, device, baseline, **options)


def add_memory_worker_arg(parser: argparse.ArgumentParser):
    """The hidden option by which :func:`run_memory_worker` hands a tool its job."""
    parser.add_argument(WORKER_OPTION, default=None, metavar='JOB', help=argparse.SUPPRESS)


def answer_memory_worker(measure: Callable[[Dict], Dict], job: str) -> int:
    """In the worker: print what ``measure`` gives for the JSON ``job`` (for :func:`run_memory_worker`); exit code 0."""
    print(json.dumps(measure(json.loads(job))))
    return 0


def run_memory_worker(script: Path, job: Dict, env: Dict[str, str]) -> Dict:
    """Run ``script --memory-worker JSON(job)`` in a fresh Python process with environment ``env``; the JSON object
    it prints last (:func:`answer_memory_worker`). A worker that fails raises :class:`ProcessFailed` with its
    error."""
    process = subprocess.run([sys.executable, str(script), WORKER_OPTION, json.dumps(job)], capture_output=True,
                             text=True, env=env)
    lines = process.stdout.strip().splitlines()
    if process.returncode or not lines:
        raise ProcessFailed(f'memory worker {Path(script).name}', process)
    return json.loads(lines[-1])


def memory_env(mmap_threshold: Optional[int] = None) -> Dict[str, str]:
    """Environment of a memory worker: glibc defaults, or every allocation over ``mmap_threshold`` bytes mapped fresh
    (and unmapped when freed, so that resident memory follows the live tensors)."""
    settings = {} if mmap_threshold is None else dict(MALLOC_MMAP_THRESHOLD_=str(mmap_threshold))
    return child_environment(MALLOC_VARIABLES, **settings)


def tune_malloc() -> bool:
    """No mmap per large tensor and no heap trimming in this process (glibc mallopt); False elsewhere.

    Otherwise glibc maps every tensor over 32 MB fresh on every forward, and high resolutions look slower than
    they are."""
    try:
        libc = ctypes.CDLL('libc.so.6')
    except OSError:
        return False
    m_trim_threshold, m_mmap_max = -1, -4  # glibc's parameter numbers; a threshold of -1 disables trimming
    return bool(libc.mallopt(m_mmap_max, 0)) and bool(libc.mallopt(m_trim_threshold, -1))


def malloc_setting(tuned: bool) -> str:
    """How this process's allocator was set for timing, for a report."""
    if tuned:
        return 'mallopt M_MMAP_MAX=0, M_TRIM_THRESHOLD=-1 (no per-tensor mmap, no trimming)'
    return 'defaults (env: ' + ', '.join(f'{k}={os.environ.get(k)}' for k in MALLOC_VARIABLES[:2]) + ')'
