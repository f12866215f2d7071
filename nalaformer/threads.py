"""How many CPU threads a tool should use, from the cores this process can actually get.

On a machine where other programs are busy, PyTorch's default (one intra-op thread per core, spinning
while it waits) makes every parallel region wait for the slowest thread, which shares its core with
someone else: a 2-core training step went from 65 ms to 314 ms with one other busy process, against
107 ms with one thread. So the tools count the cores this process may run on (affinity and cgroup
quota), subtract what other processes are using right now, and run that many threads:

    threads = clamp(round(cores - busy elsewhere), 1, cores)

The environment always wins (``OMP_NUM_THREADS`` set by the user or a launcher), then an explicit
request (``--threads N``, a config's ``env_cfg.threads``), then this choice.
"""
import os
import time
from dataclasses import dataclass
from typing import Optional

import torch

__all__ = ['ThreadChoice', 'available_cores', 'busy_elsewhere', 'choose_threads', 'apply_threads']

ENV_VARS = ('OMP_NUM_THREADS', 'MKL_NUM_THREADS')


@dataclass(frozen=True)
class ThreadChoice:
    threads: int
    cores: int
    busy: Optional[float]  # cores' worth of CPU used by other processes while we looked (None: not measured)
    source: str            # 'environment', 'requested' or 'measured'

    def describe(self) -> str:
        if self.source == 'environment':
            reason = f'set by {next(v for v in ENV_VARS if os.environ.get(v))}'
        elif self.source == 'requested':
            reason = 'as requested'
        else:
            reason = f'{self.busy:.1f} of them busy with other processes'
        return (f'CPU threads: {self.threads} ({self.cores} cores available, {reason}; '
                f'override with --threads N or OMP_NUM_THREADS)')


def available_cores() -> int:
    """Cores this process may run on: its CPU affinity, capped by a cgroup v2 CPU quota."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, 'sched_getaffinity') else (os.cpu_count() or 1)
    try:
        with open('/sys/fs/cgroup/cpu.max') as f:
            quota, period = f.read().split()
        if quota != 'max':
            cores = min(cores, max(1, int(int(quota) / int(period) + 0.5)))
    except (OSError, ValueError):
        pass
    return cores


def _system_busy_ticks() -> int:
    with open('/proc/stat') as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
    return sum(fields[:8]) - idle  # user nice system idle iowait irq softirq steal (guest is inside user)


def _process_ticks(pid: int) -> int:
    with open(f'/proc/{pid}/stat') as f:
        fields = f.read().rsplit(')', 1)[1].split()
    return int(fields[11]) + int(fields[12])  # utime, stime


def _own_ticks() -> int:
    """CPU time of this process and its live children (data-loader workers, compile workers)."""
    me = os.getpid()
    total = _process_ticks(me)
    for entry in os.listdir('/proc'):
        if entry.isdigit() and int(entry) != me:
            try:
                with open(f'/proc/{entry}/stat') as f:
                    if int(f.read().rsplit(')', 1)[1].split()[1]) == me:
                        total += _process_ticks(int(entry))
            except (OSError, ValueError, IndexError):
                continue
    return total


def busy_elsewhere(seconds: float = 0.25) -> Optional[float]:
    """Cores' worth of CPU that other processes used over ``seconds`` (None where /proc does not tell)."""
    try:
        ticks_per_s = os.sysconf('SC_CLK_TCK')
        busy0, own0, t0 = _system_busy_ticks(), _own_ticks(), time.monotonic()
        time.sleep(seconds)
        busy1, own1, t1 = _system_busy_ticks(), _own_ticks(), time.monotonic()
    except (OSError, ValueError, IndexError):
        return None
    return max(0.0, ((busy1 - busy0) - (own1 - own0)) / ticks_per_s / (t1 - t0))


def choose_threads(requested: Optional[int] = None) -> ThreadChoice:
    """The thread count to use (see the module docstring); measures the machine for about 0.25 s."""
    cores = available_cores()
    from_env = next((os.environ[v] for v in ENV_VARS if os.environ.get(v)), None)
    if from_env is not None:
        try:
            return ThreadChoice(max(1, int(from_env)), cores, None, 'environment')
        except ValueError:
            pass  # not a number: torch ignores it too
    if requested is not None:
        if requested < 1:
            raise ValueError(f'threads must be at least 1, got {requested}')
        return ThreadChoice(requested, cores, None, 'requested')
    busy = busy_elsewhere()
    threads = cores if busy is None else min(cores, max(1, int(cores - busy + 0.5)))
    return ThreadChoice(threads, cores, busy if busy is not None else 0.0, 'measured')


def apply_threads(requested: Optional[int] = None) -> ThreadChoice:
    """:func:`choose_threads`, then ``torch.set_num_threads`` with it."""
    choice = choose_threads(requested)
    torch.set_num_threads(choice.threads)
    return choice
