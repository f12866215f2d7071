"""Timing: one call (CUDA events on a GPU, the wall clock on CPU), repeated calls, and several steps timed
alternating (A B C A B C ...), so that drifts of the machine hit all alike, with the contention of other processes
recorded meanwhile; the statistics of the samples."""
import statistics
import time
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional

import torch
from tqdm import tqdm

from .machine import Contention
from .results import Failure, attempt

__all__ = ['Timing', 'summarize', 'synchronize', 'time_repeats', 'time_steps', 'timed']

Step = Callable[[], object]


def synchronize(device: torch.device):
    if device.type == 'cuda':
        torch.cuda.synchronize(device)


def timed(step: Step, device: torch.device) -> float:
    """Time of one call of ``step`` in ms: on a GPU between CUDA events after the device went idle, on CPU by the
    wall clock."""
    synchronize(device)
    if device.type == 'cuda':
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        step()
        end.record()
        end.synchronize()
        return start.elapsed_time(end)
    start = time.perf_counter()
    step()
    return (time.perf_counter() - start) * 1e3


def time_repeats(step: Step, device: torch.device, warmup: int, repeats: int) -> List[float]:
    """Times (ms) of ``repeats`` calls of ``step`` after ``warmup`` untimed ones."""
    warmed = _warmed(step, warmup)
    return [timed(warmed, device) for _ in range(repeats)]


@dataclass
class Timing:
    """What :func:`time_steps` measured: per label its samples (ms) or its :class:`Failure`, the contention during
    the timed rounds (:meth:`Contention.as_dict`), and the steps that ran (their state, e.g. losses)."""
    samples: Dict[str, List[float]]
    failures: Dict[str, Failure]
    contention: Dict
    steps: Dict[str, Step]

    def row(self, label: str, batch: Optional[int] = None) -> Dict:
        """``label``'s statistics (:func:`summarize`, status 'ok'), or its failure with ``median_ms`` None."""
        if label in self.failures:
            return dict(self.failures[label].as_row(), median_ms=None)
        return dict(status='ok', **summarize(self.samples[label], batch))


def time_steps(builders: Dict[str, Callable[[], Step]], device: torch.device, warmup: int, repeats: int,
               keep_going: bool, what: str) -> Timing:
    """Build every step and run its ``warmup`` calls, then time ``repeats`` rounds, each calling every step once; a
    step that fails is handled by :func:`attempt` (left out of the rounds if recorded). ``what`` names the
    measurement in progress bars and warnings (e.g. '224x224 b8')."""
    steps, failures = {}, {}
    for label, build in tqdm(builders.items(), desc=f'build {what}', leave=False):
        result = attempt(lambda: _warmed(build(), warmup), keep_going, f'{label} at {what}')
        (failures if isinstance(result, Failure) else steps)[label] = result
    samples = {label: [] for label in steps}
    with Contention() as contention, tqdm(total=repeats * len(steps), desc=f'time {what}', leave=False) as bar:
        for _ in range(repeats):
            for label, step in list(steps.items()):
                result = attempt(lambda: timed(step, device), keep_going, f'{label} at {what}')
                if isinstance(result, Failure):
                    failures[label] = result
                    del samples[label], steps[label]
                else:
                    samples[label].append(result)
                bar.update()
    contention.warn(f'timing {what}')
    return Timing(samples, failures, contention.as_dict(), steps)


def _warmed(step: Step, warmup: int) -> Step:
    for _ in range(warmup):
        step()
    return step


def summarize(samples: List[float], batch: Optional[int] = None) -> Dict:
    """Median, quartiles and range (ms) of per-iteration times, and the throughput (items/s) of ``batch`` items
    per iteration."""
    q1, median, q3 = statistics.quantiles(samples, n=4, method='inclusive') if len(samples) > 1 else samples * 3
    throughput = {} if batch is None else dict(throughput=batch * 1e3 / median)
    return dict(median_ms=median, q1_ms=q1, q3_ms=q3, min_ms=min(samples), max_ms=max(samples), samples=len(samples),
                **throughput)
