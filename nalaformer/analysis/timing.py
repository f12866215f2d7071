"""Timing helpers shared by the benchmark tools (tools/analysis/benchmark*.py): one timed call, the
statistics of many, the device's name, and the formatting of optional figures."""
import platform
import statistics
import time
from typing import Callable, Dict, List, Optional

import torch

__all__ = ['device_name', 'format_optional', 'summarize', 'synchronize', 'timed']


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
