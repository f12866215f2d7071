"""Whether Triton runs kernels compiled or in its interpreter.

Triton wraps its language functions for the interpreter when it is first imported with
``TRITON_INTERPRET=1`` (``import timm`` already imports it): the mode is fixed then, and kernels
built later (:mod:`nalaformer.kernels.nala_jit`) must be built in the same mode.
"""
import triton
from triton.runtime.interpreter import InterpretedFunction

__all__ = ['INTERPRETED']

INTERPRETED = isinstance(triton.language.zeros, InterpretedFunction)
