"""The machine a measurement runs on: its name, peak memory bandwidth and load, the cores other processes keep busy
during a measurement, a deliberately busy process, and child processes (their environment, their failures)."""
import contextlib
import os
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Collection, Dict, Iterator, List, Optional

import torch

__all__ = ['CHECKOUT', 'CONTENTION_CORES', 'Contention', 'ProcessFailed', 'busy_process', 'child_environment',
           'device_name', 'load_average', 'peak_bandwidth']

# The repository the package runs from (editable install or PYTHONPATH): its tools/ and configs/ for child processes.
CHECKOUT = Path(__file__).resolve().parents[2]
# Samples are flagged when other processes kept more than this many cores busy on average.
CONTENTION_CORES = 0.25
# Peak DRAM bandwidth in GB/s by device-name substring (vendor datasheets), first match wins.
PEAK_BANDWIDTH_GBPS = (
    ('H200', 4800.0), ('H100 PCIe', 2000.0), ('H100', 3350.0), ('A100-SXM4-80GB', 2039.0),
    ('A100 80GB PCIe', 1935.0), ('A100', 1555.0), ('L40S', 864.0), ('A10G', 600.0), ('L4', 300.0),
    ('RTX 4090', 1008.0), ('RTX 3090', 936.0), ('V100', 900.0), ('T4', 320.0))


def device_name(device: torch.device) -> str:
    """The GPU's name, or the CPU's model name."""
    if device.type == 'cuda':
        return torch.cuda.get_device_name(device)
    try:
        with open('/proc/cpuinfo') as f:
            return next(line.split(':', 1)[1].strip() for line in f if line.startswith('model name'))
    except (OSError, StopIteration):
        return platform.processor() or 'cpu'


def peak_bandwidth(device: torch.device) -> Optional[float]:
    """The GPU's peak DRAM bandwidth in GB/s; None on CPU and for GPUs not in :data:`PEAK_BANDWIDTH_GBPS`."""
    name = torch.cuda.get_device_name(device) if device.type == 'cuda' else ''
    return next((gbps for key, gbps in PEAK_BANDWIDTH_GBPS if key in name), None)


def load_average() -> List[float]:
    """The 1, 5 and 15-minute load averages, rounded to 0.01."""
    return [round(v, 2) for v in os.getloadavg()]


class Contention:
    """Load averages around a block, and the cores other processes kept busy during it (Linux): system busy time
    (steal included: another VM's use) minus this process's CPU time, per second."""

    def __enter__(self):
        self.load_before = load_average()
        self.start = (time.perf_counter(), _system_busy_seconds(), time.process_time())
        return self

    def __exit__(self, *exc):
        wall, busy, own = (b - a if a is not None and b is not None else None for a, b in
                           zip(self.start, (time.perf_counter(), _system_busy_seconds(), time.process_time())))
        self.load_after = load_average()
        self.other_busy_cores = None if busy is None else max(0.0, (busy - own) / wall)
        return False

    def as_dict(self) -> Dict:
        return dict(load_before=self.load_before, load_after=self.load_after,
                    other_busy_cores=None if self.other_busy_cores is None else round(self.other_busy_cores, 3))

    def warn(self, what: str):
        """A warning on stderr when other processes kept more than :data:`CONTENTION_CORES` busy during ``what``."""
        if self.other_busy_cores is not None and self.other_busy_cores > CONTENTION_CORES:
            print(f'warning: other processes kept {self.other_busy_cores:.2f} cores busy while {what}; '
                  f'load {self.load_before} -> {self.load_after}', file=sys.stderr)


def _system_busy_seconds() -> Optional[float]:
    """CPU seconds all cores spent busy since boot (/proc/stat: user, nice, system, irq, softirq, steal)."""
    try:
        with open('/proc/stat') as f:
            user, nice, system, _idle, _iowait, irq, softirq, steal = map(int, f.readline().split()[1:9])
    except OSError:
        return None
    return (user + nice + system + irq + softirq + steal) / os.sysconf('SC_CLK_TCK')


@contextlib.contextmanager
def busy_process(settle_s: float = 1.0) -> Iterator[None]:
    """One other process keeping a core busy (a Python loop) for the duration of the block."""
    busy = subprocess.Popen([sys.executable, '-c', 'while True: pass'])
    try:
        time.sleep(settle_s)
        yield
    finally:
        busy.kill()
        busy.wait()


def child_environment(without: Collection[str] = (), **settings: str) -> Dict[str, str]:
    """This process's environment for a child process, less the variables ``without``, plus ``settings``."""
    return {**{k: v for k, v in os.environ.items() if k not in without}, **settings}


class ProcessFailed(RuntimeError):
    """A child process that exited non-zero. The first line names it, its exit code and the last line of its error
    output (for a Python child, the exception); the lines after it are the end of that output."""

    def __init__(self, what: str, process: subprocess.CompletedProcess, tail: int = 3000):
        stderr = (process.stderr or '').strip()
        last = stderr.splitlines()[-1] if stderr else 'no error output'
        super().__init__(f'{what} exited {process.returncode}: {last}\n{stderr[-tail:]}')
        self.returncode = process.returncode
