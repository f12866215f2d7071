"""Mixed precision on CPU: mmengine's AmpOptimWrapper requires an accelerator."""
from contextlib import contextmanager

import torch
from mmengine.optim import OptimWrapper
from mmengine.registry import OPTIM_WRAPPERS


@OPTIM_WRAPPERS.register_module()
class CPUAmpOptimWrapper(OptimWrapper):
    """bfloat16 autocast around forward on CPU (bf16 needs no loss scaling)."""

    def __init__(self, dtype: str = 'bfloat16', **kwargs):
        super().__init__(**kwargs)
        if dtype != 'bfloat16':
            raise ValueError(f'CPU autocast supports dtype="bfloat16" only, got {dtype!r}')
        self.cast_dtype = torch.bfloat16

    @contextmanager
    def optim_context(self, model: torch.nn.Module):
        with super().optim_context(model), torch.autocast('cpu', dtype=self.cast_dtype):
            yield
