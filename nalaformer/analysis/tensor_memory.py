"""Peak tensor memory of a computation, counted rather than measured: also for runs too large for any machine.

:class:`LiveTensorMemory` counts the bytes of every live tensor storage an operator creates (views and in-place
results are not new; the project's custom operators are counted through their Python implementation); under
``FakeTensorMode`` (:func:`fake_memory`) a model of any size runs in seconds without data. Not seen: library
workspaces, the allocator's rounding and caching (measured and counted agree within 10%: tests/test_sr_benchmark.py).
"""
import gc
import weakref
from dataclasses import dataclass
from typing import Callable, Dict, List

import torch
from torch._library.custom_ops import _maybe_get_opdef
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from .memory import MIB

__all__ = ['LiveTensorMemory', 'TensorMemory', 'fake_memory']

# Custom-operator namespaces whose Python implementation runs inside the mode (their temporaries counted).
DECOMPOSED_NAMESPACES = ('nalaformer',)


def _tensors(tree) -> List[torch.Tensor]:
    return [t for t in tree_leaves(tree) if isinstance(t, torch.Tensor)]


class LiveTensorMemory(TorchDispatchMode):
    """Counts the bytes of the tensor storages created inside it and still referenced.

    ``live_bytes``: now; ``peak_bytes``: the most at any moment since entering or :meth:`reset_peak`.
    Works on real and fake tensors alike.
    """

    def __init__(self):
        super().__init__()
        self.live_bytes = self.peak_bytes = 0
        self._sizes: Dict[int, int] = {}

    def reset_peak(self):
        self.peak_bytes = self.live_bytes

    def _free(self, key: int):
        self.live_bytes -= self._sizes.pop(key)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        opdef = _maybe_get_opdef(func) if func.namespace in DECOMPOSED_NAMESPACES else None
        if opdef is not None:
            with self:  # the implementation's own operators are counted one by one
                out = opdef._init_fn(*args, **kwargs)
        else:
            out = func(*args, **kwargs)
        tensors = _tensors(out)
        if tensors:  # (most calls are metadata queries such as prim.device: nothing to count)
            inputs = {id(t.untyped_storage()) for t in _tensors((args, kwargs))}
            for storage in (t.untyped_storage() for t in tensors):
                key = id(storage)
                if key not in inputs and key not in self._sizes:
                    self._sizes[key] = storage.nbytes()
                    self.live_bytes += storage.nbytes()
                    self.peak_bytes = max(self.peak_bytes, self.live_bytes)
                    weakref.finalize(storage, self._free, key)
        return out


@dataclass
class TensorMemory:
    """MiB of tensor storage at the peak of the counted iterations: ``peak_mb`` all of it (weights, inputs and
    optimizer state included), ``extra_mb`` above what was alive after the warm-up iterations."""
    peak_mb: float
    extra_mb: float


def fake_memory(build: Callable[[], Callable[[], None]], warmup: int = 1, iterations: int = 2) -> TensorMemory:
    """Tensor memory of ``build()``'s step (built on the CPU device) on fake tensors: ``warmup`` iterations (their
    allocations, e.g. optimizer state, stay alive), then ``iterations`` counted ones."""
    tracker = LiveTensorMemory()
    with FakeTensorMode(), tracker:
        step = build()
        for _ in range(warmup):
            step()
        gc.collect()
        settled = tracker.live_bytes
        tracker.reset_peak()
        for _ in range(iterations):
            step()
        memory = TensorMemory(peak_mb=tracker.peak_bytes / MIB, extra_mb=(tracker.peak_bytes - settled) / MIB)
        del step
        gc.collect()
    return memory
