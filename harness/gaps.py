"""Known gaps of a backend: the one place where a check may be expected to fail.

A gap matches by backend, op, dtype, kernel config, value regime, case params (an FP8 format,
say) and installed versions.
Matching pinned tests are marked as strict xfails at collection, so they still run: a fix
upstream turns the gap into a visible XPASS failure (time to delete the entry). Random tests
leave a gap's value regimes out of their draws. The summary lists both. Tests must never skip
or xfail anything on their own.
"""
from __future__ import annotations

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
                values: str | None = None, params: dict | None = None) -> bool:
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
        return "*" in self.values or values in self.values

    def marker_reason(self) -> str:
        return f"[gap:{self.id}] {self.reason} ({self.link})"


GAPS = (
    Gap(id="interp-bf16-dot", backend="interpreter",
        reason="the interpreter multiplies the raw bits of bf16 operands in tl.dot and returns garbage",
        link="https://github.com/triton-lang/triton/issues/11584",
        ops=("flash_attention", "decode_attention", "matmul", "swiglu"), dtypes=("bfloat16",)),
    Gap(id="interp-runtime-loop-numpy25", backend="interpreter",
        reason="Triton 3.6's interpreter fails on loops with a runtime bound under NumPy >= 2.5",
        link="FIELD-NOTES.md, Triton's interpreter",
        configs=("chunked",), min_versions=(("numpy", "2.5"),), max_versions=(("triton", "3.7"),)),
    Gap(id="interp-bf16-subnormal-load", backend="interpreter",
        reason="the interpreter's bf16 -> fp32 conversion renormalises bf16 subnormals with fp16-style "
               "exponent arithmetic and returns wrong values (1.0e-39 reads as 4.4e-39); exact on the GPU",
        link="triton/runtime/interpreter.py, _convert_float (Triton 3.9)",
        ops=("rmsnorm", "add_rmsnorm", "rmsnorm_rope", "rope"), dtypes=("bfloat16",), values=("tiny",)),
)


def find(backend: str, op: str, dtype: str | None, config: str | None, versions: dict,
         values: str | None = None, params: dict | None = None) -> Gap | None:
    for gap in GAPS:
        if gap.applies(backend, op, dtype, config, versions, values, params):
            return gap
    return None
