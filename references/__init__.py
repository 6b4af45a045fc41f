"""What a PyTorch user would write instead of each kernel, run in the input dtype.

References are the baseline for speed and for the error-ratio check (`ref_ratio`): their error
against the oracle is the rounding that the dtype itself forces on that very input.
"""
from references.adamw import adamw
from references.activations import bias_gelu, bias_gelu_backward
from references.attention import decode_attention, flash_attention, flash_attention_backward
from references.cross_entropy import fused_linear_cross_entropy
from references.embedding import embedding, embedding_backward
from references.fp8 import fp8_matmul, quantize_fp8
from references.gated_delta import gated_delta_rule
from references.gemm import matmul, swiglu, swiglu_backward
from references.mla import mla_decode
from references.moe import moe, moe_mxfp4, moe_permute, moe_route
from references.mxfp4 import dequantize_mxfp4, quantize_mxfp4
from references.norms import (add_rmsnorm, add_rmsnorm_backward, layernorm, layernorm_backward, rmsnorm,
                              rmsnorm_backward)
from references.rope import rmsnorm_rope, rmsnorm_rope_backward, rope, rope_backward
from references.softmax import softmax, softmax_backward

__all__ = ["adamw", "add_rmsnorm", "add_rmsnorm_backward", "bias_gelu", "bias_gelu_backward", "decode_attention", "dequantize_mxfp4", "embedding", "embedding_backward", "flash_attention", "flash_attention_backward", "fp8_matmul", "fused_linear_cross_entropy", "gated_delta_rule", "layernorm", "layernorm_backward", "matmul", "mla_decode", "moe", "moe_mxfp4", "moe_permute", "moe_route", "quantize_fp8", "quantize_mxfp4", "rmsnorm", "rmsnorm_backward", "rmsnorm_rope", "rmsnorm_rope_backward", "rope", "rope_backward", "softmax", "softmax_backward", "swiglu", "swiglu_backward"]
