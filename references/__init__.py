"""What a PyTorch user would write instead of each kernel, run in the input dtype.

References are the baseline for speed and for the error-ratio check (`ref_ratio`): their error
against the oracle is the rounding that the dtype itself forces on that very input.
"""
from references.adamw import adamw
from references.activations import bias_gelu
from references.attention import decode_attention, flash_attention, flash_attention_backward
from references.cross_entropy import fused_linear_cross_entropy
from references.embedding import embedding
from references.fp8 import fp8_matmul, quantize_fp8
from references.gated_delta import gated_delta_rule
from references.gemm import matmul, swiglu
from references.mla import mla_decode
from references.moe import moe, moe_mxfp4, moe_permute, moe_route
from references.mxfp4 import dequantize_mxfp4, quantize_mxfp4
from references.norms import add_rmsnorm, layernorm, rmsnorm
from references.rope import rmsnorm_rope, rope
from references.softmax import softmax

__all__ = ["adamw", "add_rmsnorm", "bias_gelu", "decode_attention", "dequantize_mxfp4", "embedding", "flash_attention", "flash_attention_backward", "fp8_matmul", "fused_linear_cross_entropy", "gated_delta_rule", "layernorm", "matmul", "mla_decode", "moe", "moe_mxfp4", "moe_permute", "moe_route", "quantize_fp8", "quantize_mxfp4", "rmsnorm", "rmsnorm_rope", "rope", "softmax", "swiglu"]
