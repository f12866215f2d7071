"""Measurement helpers shared by the benchmark tools (tools/analysis/benchmark*.py): one timed call, the
statistics of many, this process's resident memory, the device's name, and the formatting of optional figures."""
import platform
import resource
import statistics
import time
from typing import Callable, Dict, List, Optional

import torch

__all__ = ['device_name', 'format_optional', 'peak_rss_mb', 'reset_peak_rss', 'rss_mb', 'summarize', 'synchronize',
           'timed']


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
