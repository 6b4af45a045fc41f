"""How an op plugs into the harness: one `Op` subclass per op, in harness/ops/<family>.py.

An Op says how to build a case's inputs, and how to call the kernel, the reference and the
oracle on them. The generic runner (harness/run.py) does the rest: poisoned output buffers,
comparison against the budget, audit records, failure messages.
"""
from __future__ import annotations

from harness.cases import Case
from harness.registry import FLOATS


class Op:
    name: str = ""
    dtypes: tuple = FLOATS
    outputs: tuple = ("y",)
    # Named kernel configurations every case can be run under; "auto" is the launcher's own
    # choice. Tests draw among them so each code path is exercised explicitly.
    configs: dict = {"auto": {}}
    # Configs that only pinned cases name (no random test of their own): a path that a few long
    # cases take, say one row of 4097 in wide chunks.
    pinned_configs: tuple = ()

    @property
    def launcher(self) -> str | None:
        """The kernels.<launcher> that kernel() calls: what an --impl implementation stands in for
        (harness/impls.py); None for an op that composes several kernels."""
        return self.name

    def inputs(self, case: Case, device) -> dict:
        """Named tensors and scalars for the case; tensors on `device`."""
        raise NotImplementedError

    def output_shapes(self, inputs: dict) -> dict:
        """name -> shape of each output (all in the case dtype)."""
        return {name: tuple(inputs["x"].shape) for name in self.outputs}

    def output_dtype(self, name: str, case: Case):
        """The dtype of an output (the case dtype unless an op says otherwise)."""
        return case.torch_dtype

    def kernel(self, inputs: dict, out: dict, **config) -> tuple:
        """Run the kernel writing into the (poisoned) buffers `out`; return the outputs in order."""
        raise NotImplementedError

    def reference(self, inputs: dict) -> tuple:
        raise NotImplementedError

    def oracle(self, inputs: dict) -> tuple:
        raise NotImplementedError

    def error_scale(self, inputs: dict, expected: tuple) -> tuple:
        """Per output, the magnitude that rtol is relative to (None: |expected|)."""
        return (None,) * len(self.outputs)

    # Case generation ------------------------------------------------------------------------
    def cases(self, dtype: str, size: str, config: str):
        """A Hypothesis strategy of random Cases in `dtype` and kernel `config`; `size` is
        "small" (interpreter) or "large" (GPU)."""
        raise NotImplementedError

    def pinned(self, dtype: str) -> list:
        """The adversarial catalogue's cases for this op, run on every run."""
        raise NotImplementedError
