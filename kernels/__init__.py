"""Fused Triton kernels for NaLa attention, installed as ``nalaformer.kernels``."""
