"""Triton kernels under test, each behind a launcher that validates its inputs.

Import this package only after the backend is chosen: `triton.jit` decides at definition time
whether a kernel is compiled for the GPU or run by the interpreter (TRITON_INTERPRET=1).
"""
from kernels._launch import raise_deferred_errors
from kernels.adamw import AdamW, adamw
from kernels.activations import bias_gelu
from kernels.attention import FlashAttentionFunction, decode_attention, flash_attention, flash_attention_backward
from kernels.cross_entropy import FusedLinearCrossEntropyFunction, fused_linear_cross_entropy
from kernels.embedding import embedding
from kernels.fp8 import fp8_matmul, quantize_fp8
from kernels.gated_delta import gated_delta_rule, gated_delta_rule_decode
from kernels.gemm import matmul, swiglu
from kernels.mla import mla_decode
from kernels.moe import moe, moe_mxfp4, moe_permute, moe_route
from kernels.mxfp4 import dequantize_mxfp4, quantize_mxfp4
from kernels.norms import add_rmsnorm, layernorm, rmsnorm
from kernels.rope import rmsnorm_rope, rope
from kernels.softmax import softmax

__all__ = ["AdamW", "FlashAttentionFunction", "FusedLinearCrossEntropyFunction", "adamw", "add_rmsnorm", "bias_gelu", "decode_attention", "dequantize_mxfp4", "embedding", "flash_attention", "flash_attention_backward", "fp8_matmul", "fused_linear_cross_entropy", "gated_delta_rule", "gated_delta_rule_decode", "layernorm", "matmul", "mla_decode", "moe", "moe_mxfp4", "moe_permute", "moe_route", "quantize_fp8", "quantize_mxfp4", "raise_deferred_errors", "rmsnorm", "rmsnorm_rope", "rope", "softmax", "swiglu"]
