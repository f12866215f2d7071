from .nala import (
    ATTENTION_KERNELS, AttentionKernel, apply_rope, build_attention_kernel, linear_attention,
    nala_cos_feature_maps, nala_feature_maps, norm_and_direction, register_attention_kernel,
    rope_angles, rope_table,
)
from .backend import BACKENDS, nala_backend, use_nala_backend  # registers nala, nala_cos (and the _triton ones)
