"""Where one iteration's time goes, per class of operator (matrix products, convolutions, element-wise work, ...):
PyTorch's profiler over one call (of three, the one of median total), each operator's self time (its own work, not
its callees') summed by class. On the CPU that is CPU time; on CUDA it is GPU time: the kernels each operator
launched, with 'unattributed kernels' for kernel time the profiler tied to no operator, and 'total' the time the
GPU was busy (against the call's wall time, what is left is the GPU waiting on the CPU to launch work).

A model compiled with :data:`KERNEL_PROFILE` (inductor's ``cpp.enable_kernel_profile``) shows its generated CPU
kernels too, as 'compiled kernels (inductor)'; compiled without it, their time is in no class.

Profiling adds a few microseconds per operator, so a model of many small operators reads a little slower here
than in a plain timing; the classes' shares are what to compare.
"""
from typing import Callable, Dict, Tuple

import torch
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile

__all__ = ['KERNEL_PROFILE', 'OP_CLASSES', 'op_class', 'class_times']

# torch.compile's option that records each of inductor's generated CPU kernels for the profiler.
KERNEL_PROFILE = {'cpp.enable_kernel_profile': True}

# (class, name fragments of ATen operators), first match wins; an operator matching none is 'other'.
# A compiled model's own CPU kernels are named for what inductor fused into them (``cpp_fused_add_gelu_...``): their
# class comes first, before the fragments of those names match an ATen class.
OP_CLASSES: Tuple[Tuple[str, Tuple[str, ...]], ...] = (
    ('compiled kernels (inductor)', ('cpp_fused',)),
    ('attention (fused NaLa kernel)', ('nala_attention',)),
    ('attention (fused softmax)', ('scaled_dot_product', 'flash_attention', 'efficient_attention')),
    ('softmax', ('softmax',)),
    ('matrix product', ('addmm', 'bmm', 'matmul', 'aten::mm', 'linear', 'baddbmm')),
    ('convolution', ('conv', 'mkldnn_convolution')),
    ('normalization', ('layer_norm', 'batch_norm', 'group_norm')),
    ('activation', ('gelu', 'silu', 'relu', 'hardswish', 'sigmoid', 'tanh')),
    ('copy / layout', ('copy_', 'clone', 'contiguous', 'cat', 'stack', 'pad', 'roll', 'index', 'to_copy', 'repeat')),
    ('pooling', ('pool',)),
    ('reduction', ('sum', 'mean', 'norm', 'amax', 'max', 'min', 'cumsum')),
    ('element-wise arithmetic', ('add', 'sub', 'mul', 'div', 'pow', 'abs', 'neg', 'sqrt', 'exp', 'reciprocal',
                                 'clamp', 'where', 'gt', 'lt', 'ge', 'le', 'eq', 'sign', 'square', 'lerp')),
)


def op_class(name: str) -> str:
    """The class of an operator named as the profiler names it (``aten::addmm``)."""
    return next((cls for cls, fragments in OP_CLASSES if any(f in name for f in fragments)), 'other')


def class_times(call: Callable[[], object], device: torch.device = torch.device('cpu'),
                rounds: int = 3) -> Dict[str, float]:
    """Milliseconds of self time per operator class in one ``call()`` on ``device`` (CPU time on the CPU, GPU time
    on CUDA), largest first, then 'total'; classes with no time are left out. Of ``rounds`` profiled calls, the one
    of median total (a call slowed by another process does not decide the shares)."""
    profiles = sorted((_one_call(call, device) for _ in range(rounds)), key=lambda times: times['total'])
    return profiles[len(profiles) // 2]


def _one_call(call: Callable[[], object], device: torch.device) -> Dict[str, float]:
    cuda = device.type == 'cuda'
    with profile(activities=[ProfilerActivity.CPU] + [ProfilerActivity.CUDA] * cuda) as prof:
        call()
        if cuda:
            torch.cuda.synchronize(device)
    times: Dict[str, float] = {}
    kernels_ms = 0.0
    for event in prof.key_averages():
        if event.device_type != DeviceType.CPU:  # a kernel: its time also counts in the operator that launched it
            kernels_ms += event.self_device_time_total / 1000
            continue
        self_us = event.self_device_time_total if cuda else event.self_cpu_time_total
        if self_us > 0:
            cls = op_class(event.key)
            times[cls] = times.get(cls, 0.0) + self_us / 1000
    if cuda and kernels_ms > sum(times.values()):
        times['unattributed kernels'] = kernels_ms - sum(times.values())
    return dict(sorted(times.items(), key=lambda item: -item[1]), total=sum(times.values()))
