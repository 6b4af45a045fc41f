"""Known gaps of a backend: the one place where a check may be expected to fail.

A gap matches by backend, op, dtype, kernel config, value regime, case params (an FP8 format,
say) and installed versions.
Matching pinned tests are marked as strict xfails at collection, so they still run: a fix
upstream turns the gap into a visible XPASS failure (time to delete the entry). Random tests
leave a gap's value regimes out of their draws. The summary lists both. Tests must never skip
or xfail anything on their own.
"""
from __future__ import annotations

import math

from dataclasses import dataclass


def _version(v: str) -> tuple:
    out = []
    for part in v.split("+")[0].split(".")[:3]:
        digits = "".join(ch for ch in part if ch.isdigit())
        out.append(int(digits or 0))
    return tuple(out)


@dataclass(frozen=True)
class Gap:
    id: str
    backend: str                  # "interpreter" or "gpu"
    reason: str
    link: str
    ops: tuple = ("*",)
    dtypes: tuple = ("*",)
    configs: tuple = ("*",)       # kernel configs it hits ("*": all)
    values: tuple = ("*",)        # input value regimes it hits ("*": all)
    params: tuple = ()            # ((name, value), ...): case params it needs ((): any)
    min_versions: tuple = ()      # ((package, "x.y"), ...): applies at or above
    max_versions: tuple = ()      # ((package, "x.y"), ...): applies below
    cases: object = None          # a predicate over a Case: the cases it hits (None: all). Such a
                                  # gap marks the pinned cases it hits and whole tests without a
                                  # case; a random test's draws are sorted one by one when drawn
                                  # (harness/plugin.py, check), so it never marks that test

    def active(self, backend: str, versions: dict) -> bool:
        """Whether the gap exists on this backend with these installed versions."""
        if backend != self.backend:
            return False
        for pkg, v in self.min_versions:
            if _version(versions.get(pkg, "0")) < _version(v):
                return False
        for pkg, v in self.max_versions:
            if _version(versions.get(pkg, "0")) >= _version(v):
                return False
        return True

    def applies(self, backend: str, op: str, dtype: str | None, config: str | None, versions: dict,
                values: str | None = None, params: dict | None = None, case=None, drawn: bool = False) -> bool:
        if not self.active(backend, versions):
            return False
        if self.params and (params is None or any(params.get(k) != v for k, v in self.params)):
            return False
        if "*" not in self.ops and op not in self.ops:
            return False
        if "*" not in self.dtypes and dtype not in self.dtypes:
            return False
        if "*" not in self.configs and config not in self.configs:
            return False
        if "*" not in self.values and values not in self.values:
            return False
        if self.cases is None:
            return True
        return not drawn and (case is None or self.cases(case))

    def marker_reason(self) -> str:
        return f"[gap:{self.id}] {self.reason} ({self.link})"


GAPS = (
    Gap(id="interp-bf16-dot", backend="interpreter",
        reason="the interpreter multiplies the raw bits of bf16 operands in tl.dot and returns garbage",
        link="https://github.com/triton-lang/triton/issues/11584",
        ops=("flash_attention", "flash_attention_backward", "decode_attention", "mla_decode", "decoder"),
        dtypes=("bfloat16",)),
    # moe's decode route (T k <= E / 4) multiplies on the CUDA cores, no tl.dot: its bf16 cases run
    # and are judged.
    Gap(id="interp-bf16-dot-moe-gemms", backend="interpreter",
        reason="the interpreter multiplies the raw bits of bf16 operands in tl.dot and returns garbage "
               "(moe's grouped GEMMs; its decode route has no tl.dot)",
        link="https://github.com/triton-lang/triton/issues/11584",
        ops=("moe",), dtypes=("bfloat16",), cases=lambda case: _moe_uses_tl_dot(case)),
    # matmul and swiglu of one row with no tiles asked for (a decode step) take the matrix-vector
    # kernel, no tl.dot: those bf16 cases run and are judged. Tiles asked for (the "small"
    # config) always reach tl.dot.
    Gap(id="interp-bf16-dot-gemm-tiles", backend="interpreter",
        reason="the interpreter multiplies the raw bits of bf16 operands in tl.dot and returns garbage "
               "(matmul and swiglu with tiles asked for)",
        link="https://github.com/triton-lang/triton/issues/11584",
        ops=("matmul", "swiglu"), dtypes=("bfloat16",), configs=("small",)),
    Gap(id="interp-bf16-dot-gemm", backend="interpreter",
        reason="the interpreter multiplies the raw bits of bf16 operands in tl.dot and returns garbage "
               "(matmul and swiglu of more than one row; one row takes the matrix-vector kernel)",
        link="https://github.com/triton-lang/triton/issues/11584",
        ops=("matmul", "swiglu"), dtypes=("bfloat16",), cases=lambda case: _gemm_uses_tl_dot(case)),
    # moe_mxfp4's decode route (at most one entry an expert) multiplies on the CUDA cores, no
    # tl.dot: its bf16 cases run and are judged.
    Gap(id="interp-bf16-dot-mxfp4-gemms", backend="interpreter",
        reason="the interpreter multiplies the raw bits of bf16 operands in tl.dot and returns garbage "
               "(moe_mxfp4's GEMM routes; its decode route has no tl.dot)",
        link="https://github.com/triton-lang/triton/issues/11584",
        ops=("moe_mxfp4",), dtypes=("bfloat16",), cases=lambda case: _moe_mxfp4_uses_tl_dot(case)),
    # The same defect where only some configs reach tl.dot: fused_linear_cross_entropy's torch_mm
    # config makes its GEMMs with torch (the row kernel has no tl.dot), so it runs and is judged.
    Gap(id="interp-bf16-dot-triton-gemms", backend="interpreter",
        reason="the interpreter multiplies the raw bits of bf16 operands in tl.dot and returns garbage "
               "(the Triton GEMMs of these configs)",
        link="https://github.com/triton-lang/triton/issues/11584",
        ops=("fused_linear_cross_entropy",), dtypes=("bfloat16",), configs=("auto", "small")),
    Gap(id="interp-no-cuda-graph", backend="interpreter",
        reason="a CUDA graph captures kernels launched on a CUDA device; the interpreter runs them on the CPU",
        link="models/decode_graph.py", ops=("decoder", "decode_attention", "mla_decode"), configs=("cuda_graph",)),
    Gap(id="interp-no-sanitizer", backend="interpreter",
        reason="compute-sanitizer instruments CUDA kernels; the interpreter runs them on the CPU, where the "
               "lane guard (harness/oob_guard.py) checks every load and store instead",
        link="tests/test_memory_safety.py", configs=("sanitizer",)),
    Gap(id="interp-huge-rows", backend="interpreter",
        reason="a kernel over a tensor of more than 2^31 elements (rows, rope, GEMM) runs 2^14 programs or "
               "more: hours in the interpreter; the GPU checks the int64 offsets",
        link="tests/test_large_offsets.py", configs=("huge",)),
    Gap(id="interp-bf16-subnormal-load", backend="interpreter",
        reason="the interpreter's bf16 -> fp32 conversion renormalises bf16 subnormals with fp16-style "
               "exponent arithmetic and returns wrong values (1.0e-39 reads as 4.4e-39); exact on the GPU",
        link="triton/runtime/interpreter.py, _convert_float (Triton 3.9)",
        ops=("rmsnorm", "add_rmsnorm", "rmsnorm_rope", "rope", "quantize_fp8", "moe_route", "rmsnorm_backward",
             "layernorm_backward", "add_rmsnorm_backward", "rope_backward", "rmsnorm_rope_backward", "swiglu_backward",
             "matmul", "swiglu"),
        dtypes=("bfloat16",),
        values=("tiny",)),
    # tl.dot on fp8 operands: the interpreter widens them to fp16 with generic bit arithmetic
    # (_convert_float) that knows neither e4m3fn's NaN nor e5m2's subnormals (e5m2 and fp16 share
    # their exponent, yet the subnormal branch renormalises wrongly). Every other code is exact,
    # tests/test_fp8.py checks all 256 of each format. The quantize kernel never converts to or
    # from fp8 (codes are computed and stored as bytes), so it has no such gap.
    Gap(id="interp-fp8-dot-e4m3fn-nan", backend="interpreter",
        reason="the interpreter's fp8 tl.dot reads the e4m3fn NaN codes 0x7F / 0xFF as +-480, so NaN does not "
               "propagate through the product; correct on the GPU",
        link="triton/runtime/interpreter.py, create_dot -> _convert_float (Triton 3.9)",
        ops=("fp8_matmul", "fp8_matmul_fast_accum"), values=("nonfinite",), params=(("fmt", "e4m3fn"),)),
    Gap(id="interp-fp8-dot-e5m2-subnormal", backend="interpreter",
        reason="the interpreter's fp8 tl.dot reads the e5m2 subnormal codes 0x01-0x03 (and their negatives), "
               "2^-16 x (1, 2, 3), as 0, 0 and 2^-15; correct on the GPU",
        link="triton/runtime/interpreter.py, create_dot -> _convert_float (Triton 3.9)",
        ops=("fp8_matmul", "fp8_matmul_fast_accum"), values=("tiny",), params=(("fmt", "e5m2"),)),
    # Triton's own fp8 conversions, which no kernel here uses: tests/test_fp8.py runs them (the
    # "native_cast" / "native_upcast" configs of its conversion tests) so the interpreter's defects
    # stay on record, and so a GPU run checks the hardware conversions against the oracle.
    Gap(id="interp-fp8-cast", backend="interpreter",
        reason="the interpreter's fp32 -> fp8 x.to(tl.float8e4nv / tl.float8e5) rounds ties up instead of to even, "
               "loses the carry when rounding up crosses a binade (e4m3fn 500 -> 256), truncates fp8 subnormals, "
               "does not saturate past the max (e4m3fn 672 -> 352, inf -> 256; e5m2 -> NaN) and turns NaN into "
               "+-384 in e4m3fn",
        link="triton/runtime/interpreter.py, create_fp_to_fp -> _convert_float (Triton 3.9)",
        ops=("quantize_fp8",), configs=("native_cast",)),
    Gap(id="interp-fp8-upcast", backend="interpreter",
        reason="the interpreter's fp8 -> fp32 x.to(tl.float32) reads the e4m3fn NaN codes as +-480 and the e5m2 "
               "infinities and NaNs as +-65536 ... +-114688; every other code, subnormals included, is exact",
        link="triton/runtime/interpreter.py, create_fp_to_fp -> _convert_float (Triton 3.9)",
        ops=("fp8_matmul",), configs=("native_upcast",)),
    # Triton's fp32 -> bf16 conversion, which dequantize_mxfp4 does not use (it drops the low
    # 16 bits of values that have none): tests/test_mxfp4.py runs it on the decoded fp32
    # subnormals so the defect stays on record, and so a GPU run checks the hardware conversion.
    Gap(id="interp-bf16-subnormal-store", backend="interpreter",
        reason="the interpreter's fp32 -> bf16 x.to(tl.bfloat16) loses fp32 subnormals that bf16 holds exactly "
               "(2^-128 and 2^-127 -> 0, 3 x 2^-128 -> 2^-127); exact on the GPU",
        link="triton/runtime/interpreter.py, _convert_float (Triton 3.9)",
        ops=("dequantize_mxfp4",), configs=("native_bf16_cast",)),
    # tests/test_cpu_independence.py runs the catalogue under two OpenBLAS core types and compares
    # the verdicts: that is the interpreter's tl.dot (NumPy's matmul). A GPU's kernels never go
    # through NumPy's BLAS, so there the test has nothing to vary (it fails at once, as declared).
    Gap(id="gpu-dot-not-numpy-blas", backend="gpu",
        reason="the cross-CPU verdict check forces NumPy's BLAS kernels (OPENBLAS_CORETYPE), which only the "
               "interpreter's tl.dot runs on; on the GPU tl.dot does not depend on the host CPU",
        link="tests/test_cpu_independence.py", configs=("cpu_blas",)),
)


def _gemm_uses_tl_dot(case) -> bool:
    """Whether a matmul / swiglu case reaches tl.dot: all but one row with no tiles asked for
    (kernels/gemm.py gemv_route)."""
    from kernels.gemm import gemv_route
    return not gemv_route(math.prod(case.shape[:-2]), case.torch_dtype, case.config != "auto")


def _moe_uses_tl_dot(case) -> bool:
    """Whether a moe case takes the grouped GEMMs (not the decode route)."""
    from kernels.moe import _moe_gemv_route
    T, _, _, E = case.shape
    return not _moe_gemv_route(T, case.param("top_k", 2), E, case.param("block_m"))


def _moe_mxfp4_uses_tl_dot(case) -> bool:
    """Whether a moe_mxfp4 case takes a route with tl.dot (not the decode route, which also needs
    codes whose rows can be read as int32 words: not the transposed weight layout)."""
    from kernels.moe import _mxfp4_gemv_route
    T, _, _, E = case.shape
    return (case.param("w_layout") == "transposed"
            or not _mxfp4_gemv_route(case.torch_dtype, T, case.param("top_k", 2), E, case.param("block_m")))


def find(backend: str, op: str, dtype: str | None, config: str | None, versions: dict,
         values: str | None = None, params: dict | None = None, case=None, drawn: bool = False) -> Gap | None:
    """The first declared gap that applies; drawn: the item draws its cases (a random test)."""
    for gap in GAPS:
        if gap.applies(backend, op, dtype, config, versions, values, params, case, drawn):
            return gap
    return None
