"""The registered ops: their names (the `tolerances.toml` keys), dtypes and where their glue lives.

This table imports nothing heavy, so budgets can be validated before the backend is chosen.
The op classes themselves (harness/ops/*.py) are imported on first use.
"""
from __future__ import annotations

import importlib

FLOATS = ("float32", "float16", "bfloat16")

# op name -> (module holding its Op class, dtypes it is checked in)
OPS: dict[str, tuple[str, tuple[str, ...]]] = {
    "rmsnorm": ("harness.ops.norms", FLOATS),
    "layernorm": ("harness.ops.norms", FLOATS),
    "add_rmsnorm": ("harness.ops.norms", FLOATS),
    "rmsnorm_backward": ("harness.ops.norms", FLOATS),     # (dx, dw) of rmsnorm for an upstream dy
    "layernorm_backward": ("harness.ops.norms", FLOATS),   # (dx[, dw][, db]) of layernorm
    "add_rmsnorm_backward": ("harness.ops.norms", FLOATS),  # (dx, dresidual, dw) of add_rmsnorm for dy and du
    "rope": ("harness.ops.rope", FLOATS),
    "rmsnorm_rope": ("harness.ops.rope", FLOATS),
    "rope_backward": ("harness.ops.rope", FLOATS),
    "rmsnorm_rope_backward": ("harness.ops.rope", FLOATS),
    "softmax": ("harness.ops.softmax", FLOATS),
    "softmax_backward": ("harness.ops.softmax", FLOATS),
    "flash_attention": ("harness.ops.attention", FLOATS),
    "flash_attention_backward": ("harness.ops.attention", FLOATS),
    "decode_attention": ("harness.ops.attention", FLOATS),
    "mla_decode": ("harness.ops.mla", FLOATS),
    "adamw": ("harness.ops.adamw", ("float32", "bfloat16")),
    "bias_gelu": ("harness.ops.activations", FLOATS),
    "bias_gelu_backward": ("harness.ops.activations", FLOATS),
    "embedding": ("harness.ops.embedding", FLOATS),     # the dtype is the table's
    "embedding_backward": ("harness.ops.embedding", FLOATS),    # the dtype is dout's (the table's)
    "matmul": ("harness.ops.gemm", FLOATS),
    "swiglu": ("harness.ops.gemm", FLOATS),
    "swiglu_backward": ("harness.ops.gemm", FLOATS),
    "fused_linear_cross_entropy": ("harness.ops.cross_entropy", FLOATS),   # LM head + loss, with dh and dW
    "quantize_fp8": ("harness.ops.fp8", FLOATS),    # the dtype is x's; the fp8 format is a case param
    "fp8_matmul": ("harness.ops.fp8", FLOATS),      # the dtype is the output's
    "fp8_matmul_fast_accum": ("harness.ops.fp8", FLOATS),   # fp8_matmul(..., fast_accum=True)
    "quantize_mxfp4": ("harness.ops.mxfp4", FLOATS),  # the dtype is x's; outputs: uint8 codes and e8m0 scales
    "dequantize_mxfp4": ("harness.ops.mxfp4", FLOATS),  # the dtype is the output's
    "decoder": ("harness.ops.decoder", FLOATS),     # a whole Qwen2-style model (models/); the dtype is the model's
    "gated_delta_rule": ("harness.ops.gated_delta", FLOATS),
    "moe_route": ("harness.ops.moe", FLOATS),       # the dtype is the logits'; moe_permute runs on its ids
    "moe": ("harness.ops.moe", FLOATS),             # the expert layer, routing given; the dtype is x's and the weights'
    "moe_mxfp4": ("harness.ops.moe", FLOATS),       # the expert layer on MXFP4 weights (uint8 codes, e8m0 scales); the dtype is x's
}


def dtypes(op: str) -> tuple[str, ...]:
    return OPS[op][1]


def get(op: str):
    """The Op object for `op` (imports its module, and with it the kernels)."""
    if op not in OPS:
        raise KeyError(f"unknown op {op!r}; registered: {', '.join(OPS)}")
    module = importlib.import_module(OPS[op][0])
    spec = module.OPS[op]
    if tuple(spec.dtypes) != OPS[op][1]:
        raise RuntimeError(f"{op}: dtypes in {OPS[op][0]} {spec.dtypes} differ from the registry {OPS[op][1]}")
    return spec
