"""Memory of a measurement: resident memory and its peak (VmRSS, VmHWM), an iteration's peak (CUDA or resident),
measured in a fresh process per run (``python -m nalaformer.analysis.memory MODULE:FUNCTION JOB`` prints
``FUNCTION(JOB)``), the memory available, and glibc's allocator settings.
"""
import ctypes
import gc
import importlib
import json
import os
import resource
import subprocess
import sys
from typing import Callable, Dict, List, Optional, Sequence

import torch
from tqdm import tqdm

from .machine import ProcessFailed, child_environment
from .results import Failure, attempt
from .timing import synchronize

__all__ = ['MIB', 'add_worker_memory', 'available_memory_mb', 'call_peak_mb', 'free_memory', 'iteration_memory_mb',
           'malloc_setting', 'memory_env', 'peak_rss_mb', 'reset_peak_rss', 'run_memory_worker', 'tune_malloc',
           'worker_memory']

MIB = 2 ** 20
MALLOC_VARIABLES = ('MALLOC_MMAP_MAX_', 'MALLOC_TRIM_THRESHOLD_', 'MALLOC_MMAP_THRESHOLD_')


def _proc_mb(path: str, field: str) -> Optional[float]:
    """A field of a /proc file in kB (VmHWM of /proc/self/status, ...), in MiB; None where /proc does not say."""
    try:
        with open(path) as f:
            return next(int(line.split()[1]) for line in f if line.startswith(field)) / 1024
    except (OSError, StopIteration):
        return None


def peak_rss_mb() -> float:
    """Peak resident memory of this process image (MiB)."""
    # VmHWM, not ru_maxrss: Linux carries ru_maxrss across fork + exec, so a worker started by a
    # large timing process would start at the parent's peak.
    peak = _proc_mb('/proc/self/status', 'VmHWM')
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024 if peak is None else peak


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
    return _proc_mb('/proc/meminfo', 'MemAvailable')


def free_memory(device: torch.device):
    """Collect what the last run left, and hand CUDA's cached blocks back."""
    gc.collect()
    if device.type == 'cuda':
        torch.cuda.empty_cache()


def call_peak_mb(call: Callable[[], object], device: torch.device) -> Optional[float]:
    """CUDA memory at the peak of one ``call()`` beyond what was allocated before it (MiB); None on CPU."""
    return iteration_memory_mb(call, device, 0.0, warmup=0, iterations=1)['extra_mb'] if device.type == 'cuda' else None


def iteration_memory_mb(step: Callable[[], None], device: torch.device, baseline_mb: float, warmup: int = 1,
                        iterations: int = 2, extra_since: str = 'warmup') -> Dict[str, Optional[float]]:
    """Peak memory (MiB) of ``iterations`` calls of ``step`` after ``warmup`` uncounted ones, in this process:
    ``peak_mb`` (CUDA's, or VmHWM above ``baseline_mb``) and ``extra_mb``, the peak above what was allocated after
    the warm-up (``extra_since='warmup'``) or before it (``'build'``); None where VmHWM cannot be reset."""
    if extra_since not in ('warmup', 'build'):
        raise ValueError(f"extra_since is 'warmup' or 'build', got {extra_since!r}")
    cuda = device.type == 'cuda'

    def allocated() -> Optional[float]:
        synchronize(device)
        gc.collect()
        return torch.cuda.memory_allocated(device) / MIB if cuda else _proc_mb('/proc/self/status', 'VmRSS')

    settled = allocated() if extra_since == 'build' else None
    for _ in range(warmup):
        step()
    if extra_since == 'warmup':
        settled = allocated()
    if cuda:
        torch.cuda.reset_peak_memory_stats(device)
    elif not reset_peak_rss():
        settled = None
    for _ in range(iterations):
        step()
    synchronize(device)
    peak = torch.cuda.max_memory_allocated(device) / MIB if cuda else peak_rss_mb()
    above = 0.0 if cuda else baseline_mb  # CUDA's counts this process's tensors only
    return dict(peak_mb=peak - above, extra_mb=None if settled is None else peak - settled)


def worker_memory(build: Callable[[], Callable[[], None]], device: torch.device,
                  **options) -> Dict[str, Optional[float]]:
    """In a fresh process (:func:`run_memory_worker`): :func:`iteration_memory_mb` of the step ``build()`` returns,
    its ``peak_mb`` above this process after its imports. ``options``: those of :func:`iteration_memory_mb`."""
    baseline = peak_rss_mb()
    step = build()
    gc.collect()
    return iteration_memory_mb(step, device, baseline, **options)


def run_memory_worker(worker: Callable[[Dict], Dict], job: Dict, env: Dict[str, str]) -> Dict:
    """``worker(job)`` in a fresh Python process with environment ``env`` (``python -m nalaformer.analysis.memory``):
    the JSON object it returns. A worker that fails raises :class:`ProcessFailed` with its error."""
    target = f'{worker.__module__}:{worker.__qualname__}'
    process = subprocess.run([sys.executable, '-m', __name__, target, json.dumps(job)], capture_output=True,
                             text=True, env=env)
    lines = process.stdout.strip().splitlines()
    if process.returncode or not lines:
        raise ProcessFailed(f'memory worker {worker.__qualname__}', process)
    return json.loads(lines[-1])


def add_worker_memory(rows: List[Dict], worker: Callable[[Dict], Dict], job: Callable[[Dict], Dict],
                      env: Dict[str, str], keep_going: bool, what: Callable[[Dict], str], keys: Sequence[str]):
    """For each row, ``worker(job(row))`` in a fresh process (:func:`run_memory_worker`): the row gets the result's
    ``keys``, or, where the worker fails (running out of memory; any error with ``keep_going``), ``memory_error``."""
    for row in tqdm(rows, desc='memory (a fresh process each)'):
        memory = attempt(lambda: run_memory_worker(worker, job(row), env), keep_going, what(row))
        if isinstance(memory, Failure):
            row.update(dict.fromkeys(keys), memory_error=f'{memory.status}: {memory.error}')
        else:
            row.update({key: memory[key] for key in keys})


def memory_env(mmap_threshold: Optional[int] = None) -> Dict[str, str]:
    """Environment of a memory worker: glibc defaults (``mmap_threshold`` None or 0), or every allocation over
    ``mmap_threshold`` bytes mapped fresh (and unmapped when freed: resident memory follows the live tensors)."""
    settings = dict(MALLOC_MMAP_THRESHOLD_=str(mmap_threshold)) if mmap_threshold else {}
    return child_environment(MALLOC_VARIABLES, **settings)


def tune_malloc() -> bool:
    """No mmap per large tensor and no heap trimming in this process (glibc mallopt; else high resolutions look
    slower than they are); False elsewhere."""
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


if __name__ == '__main__':  # a memory worker: MODULE:FUNCTION JOB
    module, _, function = sys.argv[1].partition(':')
    print(json.dumps(getattr(importlib.import_module(module), function)(json.loads(sys.argv[2]))))
