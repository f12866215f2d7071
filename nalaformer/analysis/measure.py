"""Measurement helpers shared by the benchmark tools (tools/analysis/benchmark*.py): one timed call, the
statistics of many, this process's resident memory and an iteration's peak memory, the allocator settings and
the machine's contention around a measurement, the device's name, and the formatting of optional figures."""
import ctypes
import gc
import os
import platform
import resource
import statistics
import time
from typing import Callable, Dict, List, Optional

import torch

__all__ = ['Contention', 'device_name', 'format_optional', 'iteration_memory_mb', 'memory_env', 'peak_rss_mb',
           'reset_peak_rss', 'rss_mb', 'summarize', 'synchronize', 'timed', 'tune_malloc']


def synchronize(device: torch.device):
    if device.type == 'cuda':
        torch.cuda.synchronize(device)


def timed(step: Callable[[], None], device: torch.device) -> float:
    """Wall time of one call of ``step`` in ms (the device synchronised before and after)."""
    synchronize(device)
    start = time.perf_counter()
    step()
    synchronize(device)
    return (time.perf_counter() - start) * 1e3


def summarize(samples: List[float], batch: int) -> Dict:
    """Median, quartiles and range (ms), and throughput (img/s) from per-iteration times."""
    q1, median, q3 = statistics.quantiles(samples, n=4, method='inclusive') if len(samples) > 1 else samples * 3
    return dict(median_ms=median, q1_ms=q1, q3_ms=q3, min_ms=min(samples), max_ms=max(samples),
                samples=len(samples), throughput=batch * 1e3 / median)


def peak_rss_mb() -> float:
    """Peak resident memory of this process image (MiB)."""
    # VmHWM, not ru_maxrss: Linux carries ru_maxrss across fork + exec, so a worker started by a
    # large timing process would start at the parent's peak.
    try:
        with open('/proc/self/status') as f:
            return next(int(line.split()[1]) for line in f if line.startswith('VmHWM')) / 1024
    except (OSError, StopIteration):
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def rss_mb() -> Optional[float]:
    """Current resident memory (VmRSS, MiB); None where /proc does not say."""
    try:
        with open('/proc/self/status') as f:
            return next(int(line.split()[1]) for line in f if line.startswith('VmRSS')) / 1024
    except (OSError, StopIteration):
        return None


def reset_peak_rss() -> bool:
    """Reset VmHWM to the current RSS (Linux: write 5 to /proc/self/clear_refs); False where that is refused."""
    try:
        with open('/proc/self/clear_refs', 'w') as f:
            f.write('5')
        return True
    except OSError:
        return False


def iteration_memory_mb(step: Callable[[], None], device: torch.device, baseline_mb: float, warmup: int = 1,
                        iterations: int = 2) -> Dict[str, Optional[float]]:
    """Peak memory (MiB) of ``iterations`` calls of ``step`` after ``warmup`` uncounted ones, in this process.

    ``extra_mb``: the peak above what was allocated (CUDA) or resident (CPU, VmHWM reset by /proc/self/clear_refs)
    after the warm-up, so without the weights, inputs, optimizer state and a first call's one-off allocations;
    None where VmHWM cannot be reset. ``peak_mb``: the whole peak, CUDA ``max_memory_allocated`` or VmHWM above
    ``baseline_mb`` (this process after its imports).
    """
    for _ in range(warmup):
        step()
    synchronize(device)
    gc.collect()
    if device.type == 'cuda':
        torch.cuda.reset_peak_memory_stats(device)
        settled = torch.cuda.memory_allocated(device) / 2 ** 20
    else:
        settled = rss_mb() if reset_peak_rss() else None
    for _ in range(iterations):
        step()
    synchronize(device)
    if device.type == 'cuda':
        peak = torch.cuda.max_memory_allocated(device) / 2 ** 20
        return dict(peak_mb=peak, extra_mb=peak - settled)
    peak = peak_rss_mb()
    return dict(peak_mb=peak - baseline_mb, extra_mb=None if settled is None else peak - settled)


def device_name(device: torch.device) -> str:
    """The GPU's name, or the CPU's model name."""
    if device.type == 'cuda':
        return torch.cuda.get_device_name(device)
    try:
        with open('/proc/cpuinfo') as f:
            return next(line.split(':', 1)[1].strip() for line in f if line.startswith('model name'))
    except (OSError, StopIteration):
        return platform.processor() or 'cpu'


def format_optional(value: Optional[float], spec: str) -> str:
    """``format(value, spec)``, or 'n/a' for None."""
    return 'n/a' if value is None else format(value, spec)


def tune_malloc() -> bool:
    """No mmap per large tensor and no heap trimming in this process (glibc mallopt); False elsewhere."""
    try:
        libc = ctypes.CDLL('libc.so.6')
    except OSError:
        return False
    m_trim_threshold, m_mmap_max = -1, -4  # glibc's parameter numbers; a threshold of -1 disables trimming
    return bool(libc.mallopt(m_mmap_max, 0)) and bool(libc.mallopt(m_trim_threshold, -1))


class Contention:
    """Load averages around a block, and the cores other processes kept busy during it (Linux):
    system busy time (steal included: another VM's use) minus this process's CPU time, per second."""

    def __enter__(self):
        self.load_before = os.getloadavg()
        self.start = (time.perf_counter(), _system_busy_seconds(), _own_cpu_seconds())
        return self

    def __exit__(self, *exc):
        wall, busy, own = (b - a if a is not None and b is not None else None for a, b in
                           zip(self.start, (time.perf_counter(), _system_busy_seconds(), _own_cpu_seconds())))
        self.load_after = os.getloadavg()
        self.other_busy_cores = None if busy is None else max(0.0, (busy - own) / wall)
        return False

    def as_dict(self) -> Dict:
        return dict(load_before=[round(v, 2) for v in self.load_before],
                    load_after=[round(v, 2) for v in self.load_after],
                    other_busy_cores=None if self.other_busy_cores is None else round(self.other_busy_cores, 3))


def _system_busy_seconds() -> Optional[float]:
    try:
        with open('/proc/stat') as f:
            ticks = [int(v) for v in f.readline().split()[1:9]]
    except OSError:
        return None
    user, nice, system, _idle, _iowait, irq, softirq, steal = ticks
    return (user + nice + system + irq + softirq + steal) / os.sysconf('SC_CLK_TCK')


def _own_cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime



def memory_env(mmap_threshold: Optional[int] = None) -> Dict[str, str]:
    """Environment of a memory worker: glibc defaults, or a fixed mmap threshold."""
    env = {k: v for k, v in os.environ.items()
           if k not in ('MALLOC_MMAP_MAX_', 'MALLOC_TRIM_THRESHOLD_', 'MALLOC_MMAP_THRESHOLD_')}
    if mmap_threshold is not None:
        env['MALLOC_MMAP_THRESHOLD_'] = str(mmap_threshold)
    return env
