"""Triton kernels under test, each behind a launcher that validates its inputs.

Import this package only after the backend is chosen: `triton.jit` decides at definition time
whether a kernel is compiled for the GPU or run by the interpreter (TRITON_INTERPRET=1).
"""
from kernels._launch import raise_deferred_errors
from kernels.adamw import AdamW, adamw, adamw_multi
from kernels.activations import BiasGeluFunction, bias_gelu, bias_gelu_backward
from kernels.attention import FlashAttentionFunction, decode_attention, flash_attention, flash_attention_backward
from kernels.cross_entropy import FusedLinearCrossEntropyFunction, fused_linear_cross_entropy
from kernels.embedding import EmbeddingFunction, embedding, embedding_backward
from kernels.fp8 import fp8_matmul, quantize_fp8
from kernels.gated_delta import gated_delta_rule, gated_delta_rule_decode
from kernels.gemm import SwiGLUFunction, add_rmsnorm_matmul, add_rmsnorm_qkv_rope, add_rmsnorm_swiglu, matmul, swiglu, swiglu_backward
from kernels.mla import mla_decode
from kernels.moe import moe, moe_mxfp4, moe_permute, moe_route
from kernels.mxfp4 import dequantize_mxfp4, quantize_mxfp4
from kernels.norms import (AddRMSNormFunction, LayerNormFunction, RMSNormFunction, add_rmsnorm, add_rmsnorm_backward,
                           layernorm, layernorm_backward, rmsnorm, rmsnorm_backward)
from kernels.rope import (RMSNormRoPEFunction, RoPEFunction, rmsnorm_rope, rmsnorm_rope_backward, rope, rope_backward,
                          rope_into_cache)
from kernels.softmax import SoftmaxFunction, softmax, softmax_backward

__all__ = ["AdamW", "AddRMSNormFunction", "BiasGeluFunction", "EmbeddingFunction", "FlashAttentionFunction", "FusedLinearCrossEntropyFunction", "LayerNormFunction", "RMSNormFunction", "RMSNormRoPEFunction", "RoPEFunction", "SoftmaxFunction", "SwiGLUFunction", "adamw", "adamw_multi", "add_rmsnorm", "add_rmsnorm_backward", "add_rmsnorm_matmul", "add_rmsnorm_qkv_rope", "add_rmsnorm_swiglu", "bias_gelu", "bias_gelu_backward", "decode_attention", "dequantize_mxfp4", "embedding", "embedding_backward", "flash_attention", "flash_attention_backward", "fp8_matmul", "fused_linear_cross_entropy", "gated_delta_rule", "gated_delta_rule_decode", "layernorm", "layernorm_backward", "matmul", "mla_decode", "moe", "moe_mxfp4", "moe_permute", "moe_route", "quantize_fp8", "quantize_mxfp4", "raise_deferred_errors", "rmsnorm", "rmsnorm_backward", "rmsnorm_rope", "rmsnorm_rope_backward", "rope", "rope_backward", "rope_into_cache", "softmax", "softmax_backward", "swiglu", "swiglu_backward"]
