"""Launch parameters of the fused NaLa kernels: :class:`Tuning`, the default, :func:`use_tuning`,
the operands 'auto' stands for (:func:`resolve_dot`) and the tile sizes that follow from the head
dim (:func:`feature_blocks`).

Free of triton imports, so that tunings can be built and checked (for instance from a model's
``kernel_kwargs``) before the kernels are compiled.
"""
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import Iterator, Optional, Tuple

import torch

__all__ = ['DOT_MODES', 'Tuning', 'check_dot_support', 'current_tuning', 'feature_blocks',
           'float32_matmul_uses_tf32', 'has_tensor_cores', 'resolve_dot', 'use_tuning']

# Operands of the tile products; a Tuning may also say 'auto' (see resolve_dot).
DOT_MODES = ('ieee', 'tf32x3', 'tf32', 'bf16')


@dataclass(frozen=True)
class Tuning:
    """Launch parameters of the fused kernels; they change speed, and only rounding otherwise.

    block_n: tokens per tile (a power of two >= 16). num_warps: warps per program. num_stages:
    software-pipelining depth of the token loops (compiled mode only).
    dot: operands of the tile products, which always accumulate in float32: 'ieee' (float32 on
    the FMA units), 'tf32x3' (three TF32 tensor-core products per product, about float32's
    accuracy), 'tf32' (float32 rounded to TF32 on tensor cores), 'bf16' (rounded to bfloat16
    on tensor cores), or 'auto' (the default): what PyTorch's own matmul would use for the
    inputs, see :func:`resolve_dot`. TF32 needs sm_80 or newer, bf16 tensor cores too. float64
    inputs always use 'ieee'.
    programs: about how many programs each kernel launch runs. The tokens of every head are
    split into ranges of token blocks, one range per program, so that all heads (and value
    blocks) together make about this many; sums over tokens are added up afterwards, and a
    program that multiplies by the state loads it once for its range (head dims up to 64; at
    larger ones such kernels take one token block per program). None: two per SM on a GPU,
    one range per head otherwise.
    """
    block_n: int = 16
    num_warps: int = 8
    num_stages: int = 3
    dot: str = 'auto'
    programs: Optional[int] = None

    def __post_init__(self):
        if self.block_n < 16 or self.block_n & (self.block_n - 1):
            raise ValueError(f'block_n must be a power of two >= 16, got {self.block_n}')
        if self.num_warps not in (1, 2, 4, 8, 16):
            raise ValueError(f'num_warps must be 1, 2, 4, 8 or 16, got {self.num_warps}')
        if self.num_stages < 1:
            raise ValueError(f'num_stages must be >= 1, got {self.num_stages}')
        if self.dot not in ('auto',) + DOT_MODES:
            raise ValueError(f"dot must be 'auto' or one of {DOT_MODES}, got {self.dot!r}")
        if self.programs is not None and self.programs < 1:
            raise ValueError(f'programs must be None or >= 1, got {self.programs}')


# Small token blocks and 8 warps by default. Time grew with the block (H200, d = 64, 'ieee', 4
# warps: forward + backward 22.5 / 10.2 / 3.4 ms at BLOCK_N = 64 / 32 / 16 for 2 heads x 82,944
# tokens), and spills explain it. Compiled for sm_90 (tools/analysis/kernel_resources.py), bf16
# inputs, the kernels spill at d = 64 with 'bf16' products 196 B per thread at 4 warps and none at
# 8 ('ieee': 11 KB and 236 B). At d = 96 (tiles padded to 128) every tuning spills, least 'bf16'
# or 'tf32' with 8 warps (1.1 KB, against 21 KB for 'ieee'). The operands follow the inputs
# ('auto'): only single-pass tensor-core products can come near the bandwidth bound (README).
_current = Tuning()


def current_tuning() -> Tuning:
    """The tuning of fused calls that do not name one."""
    return _current


@contextmanager
def use_tuning(**changes) -> Iterator[Tuning]:
    """Change some :class:`Tuning` fields for the fused calls inside, e.g. ``use_tuning(dot='bf16')``.

    A call's backward uses the tuning its forward ran with.
    """
    global _current
    previous, _current = _current, replace(_current, **changes)
    try:
        yield _current
    finally:
        _current = previous


def feature_blocks(head_dim: int) -> Tuple[int, int, int]:
    """(BLOCK_D, BLOCK_DV, DV_PAD) for a head dim d.

    Each feature half is padded to BLOCK_D, the next power of two >= max(d, 16); the value dim is
    processed in blocks of BLOCK_DV = min(BLOCK_D, 64) columns, DV_PAD of them in all (a multiple
    of BLOCK_DV). A head's state is (2, BLOCK_D, DV_PAD), its key mean (2, BLOCK_D).
    """
    block_d = max(16, 1 << (head_dim - 1).bit_length())
    block_dv = min(block_d, 64)
    return block_d, block_dv, -(-head_dim // block_dv) * block_dv


def float32_matmul_uses_tf32() -> bool:
    """Whether PyTorch multiplies float32 CUDA matrices on TF32 tensor cores now.

    Reads the new-style setting, which the legacy ones (``torch.set_float32_matmul_precision``,
    ``torch.backends.cuda.matmul.allow_tf32``) also set; reading the legacy ones can raise once
    both styles were used.
    """
    for setting in (torch.backends.cuda.matmul.fp32_precision, torch.backends.fp32_precision):
        if setting != 'none':
            return setting == 'tf32'
    return False


def resolve_dot(dot: str, dtype: torch.dtype, capability: Optional[Tuple[int, int]]) -> str:
    """The tile-product operands for inputs of ``dtype`` on a GPU of ``capability`` (None: the interpreter).

    'auto' picks what PyTorch's matmul does for such inputs, at its accuracy: bfloat16 inputs
    multiply as bfloat16 (PyTorch's bf16 matmul) and float16 ones as TF32 (float16's 10 mantissa
    bits with float32's range: the cubed keys can pass float16's 65,504); float32 inputs as TF32
    when PyTorch's float32 matmuls use it (``torch.backends.cuda.matmul.fp32_precision``,
    ``torch.set_float32_matmul_precision('high')``), else 'ieee'. Before sm_80 it is 'ieee'.
    float64 inputs always use 'ieee'; an explicit mode is checked against the GPU.
    """
    if dtype == torch.float64:
        return 'ieee'
    if dot != 'auto':
        if capability is not None:
            check_dot_support(dot, capability)
        return dot
    if capability is not None and not has_tensor_cores(capability):
        return 'ieee'
    if dtype == torch.bfloat16:
        return 'bf16'
    if dtype == torch.float16 or float32_matmul_uses_tf32():
        return 'tf32'
    return 'ieee'


def has_tensor_cores(capability: Tuple[int, int]) -> bool:
    """Whether a GPU of this compute capability multiplies TF32 and bfloat16 on tensor cores (sm_80+)."""
    return tuple(capability) >= (8, 0)


def check_dot_support(dot: str, capability: Tuple[int, int]) -> None:
    """Raise a clear error where a GPU of this compute capability has no tensor cores for ``dot``."""
    if dot != 'ieee' and not has_tensor_cores(capability):
        raise ValueError(
            f"dot={dot!r} needs TF32 / bfloat16 tensor cores (compute capability 8.0 or newer), but this GPU is "
            f"sm_{capability[0]}{capability[1]}: use dot='ieee'")
