"""Triton kernels under test, each behind a launcher that validates its inputs.

Import this package only after the backend is chosen: `triton.jit` decides at definition time
whether a kernel is compiled for the GPU or run by the interpreter (TRITON_INTERPRET=1).
"""
from kernels.attention import decode_attention, flash_attention
from kernels.gemm import matmul, swiglu
from kernels.norms import add_rmsnorm, layernorm, rmsnorm
from kernels.rope import rmsnorm_rope, rope
from kernels.softmax import softmax

__all__ = ["decode_attention", "flash_attention", "add_rmsnorm", "layernorm", "rmsnorm", "rmsnorm_rope", "rope", "softmax", "matmul", "swiglu"]
