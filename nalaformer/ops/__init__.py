from .nala import (
    apply_rope, linear_attention, nala_cos_feature_maps, nala_feature_maps, norm_and_direction, rope_angles,
    rope_table,
)
from .kernels import (
    ATTENTION_KERNELS, AttentionKernel, build_attention_kernel, kernel_function, register_attention_kernel,
)
from .backend import BACKENDS, nala_backend, use_nala_backend
