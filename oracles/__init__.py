"""Float64 ground truth: naive math on upcast inputs, in torch on the inputs' own device.

Oracles share no code and no algorithm with the kernels (no tiling, no online softmax, no
shifted statistics). Each takes torch tensors, computes in float64 on the device they are on
(CPU on the interpreter, the GPU on a GPU run), and returns float64 tensors on that device.
"""
from oracles.adamw import adamw
from oracles.activations import bias_gelu, bias_gelu_backward
from oracles.attention import (decode_attention, decode_out_score_magnitude, decode_tie_allowance, flash_attention,
                               flash_attention_backward, flash_attention_backward_magnitudes,
                               flash_attention_magnitudes, flash_attention_tie_allowance)
from oracles.cross_entropy import fused_linear_cross_entropy, fused_linear_cross_entropy_magnitudes
from oracles.embedding import embedding, embedding_backward
from oracles.fp8 import fp8_matmul, quantize_fp8
from oracles.gated_delta import gated_delta_rule
from oracles.gemm import matmul, swiglu, swiglu_backward
from oracles.mla import mla_decode
from oracles.moe import moe, moe_magnitudes, moe_mxfp4, moe_mxfp4_magnitudes, moe_permute, moe_route
from oracles.mxfp4 import dequantize_mxfp4, quantize_mxfp4
from oracles.norms import (add_rmsnorm, add_rmsnorm_backward, layernorm, layernorm_backward, rmsnorm,
                           rmsnorm_backward)
from oracles.rope import rmsnorm_rope, rmsnorm_rope_backward, rope, rope_backward
from oracles.softmax import softmax, softmax_backward

__all__ = ["adamw", "add_rmsnorm", "add_rmsnorm_backward", "bias_gelu", "bias_gelu_backward", "decode_attention", "decode_out_score_magnitude", "decode_tie_allowance", "dequantize_mxfp4", "embedding", "embedding_backward", "flash_attention", "flash_attention_backward", "flash_attention_backward_magnitudes", "flash_attention_magnitudes", "flash_attention_tie_allowance", "fp8_matmul", "fused_linear_cross_entropy", "fused_linear_cross_entropy_magnitudes", "gated_delta_rule", "layernorm", "layernorm_backward", "matmul", "mla_decode", "moe", "moe_magnitudes", "moe_mxfp4", "moe_mxfp4_magnitudes", "moe_permute", "moe_route", "quantize_fp8", "quantize_mxfp4", "rmsnorm", "rmsnorm_backward", "rmsnorm_rope", "rmsnorm_rope_backward", "rope", "rope_backward", "softmax", "softmax_backward", "swiglu", "swiglu_backward"]
