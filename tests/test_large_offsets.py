"""Offsets past 2^31 elements: the launchers promise int64 addressing where sizes can pass it.

A table of more than 2^31 elements costs 4 GiB in fp16. torch.empty leaves it uninitialised, so
on the CPU (the interpreter) only the pages of the rows written here are ever backed by memory;
on a GPU it is a real 4 GiB allocation, gone at the end of the test.
"""
import pytest
import torch

import kernels


@pytest.mark.op("embedding")
def test_embedding_reads_rows_past_2_31_elements(backend):
    H = 2048
    V = 2**31 // H + 16                       # row V - 1 starts 2^31 + 30720 elements in
    table = torch.empty(V, H, dtype=torch.float16, device=backend.device)
    ids = torch.tensor([V - 1, 3, V - 2, 2**31 // H, 2**31 // H - 1], device=backend.device)
    g = torch.Generator().manual_seed(0)
    rows = torch.randn(len(ids), H, generator=g).half().to(backend.device)
    table[ids] = rows
    out = kernels.embedding(ids, table)
    # An int32 row offset would wrap to a negative address (a fault, or another row).
    assert torch.equal(out, rows)
    assert torch.equal(kernels.embedding(ids, table, validate=False), rows)


# Row kernels: an output of more than 2^31 elements, so that an int32 row offset (rows * D)
# wraps. Only the last rows are judged (float64 oracle, the op's budget): the rows before them
# are uninitialised memory the kernel runs over. Killed the mutation run's int64 survivors
# (results/mutation/README.md). On the interpreter the kernel would run 2^17 programs: a
# declared gap (interp-huge-rows).
HUGE_D = 16384
HUGE_ROWS = 2**31 // HUGE_D + 2            # the last row starts 2^31 + 16384 elements in
ROW_OPS = ("rmsnorm", "layernorm", "add_rmsnorm", "softmax")


def _huge_inputs(op: str, device):
    g = torch.Generator().manual_seed(1)

    def tall():
        t = torch.empty(HUGE_ROWS, HUGE_D, dtype=torch.float16, device=device)
        t[-3:] = torch.randn(3, HUGE_D, generator=g).half().to(device)
        return t

    x = tall()
    w = torch.randn(HUGE_D, generator=g).half().to(device)
    if op == "rmsnorm":
        return {"x": x, "w": w, "eps": 1e-6}
    if op == "layernorm":
        return {"x": x, "w": w, "b": torch.randn(HUGE_D, generator=g).half().to(device), "eps": 1e-5}
    if op == "add_rmsnorm":
        return {"x": x, "residual": tall(), "w": w, "eps": 1e-6}
    return {"x": x, "scale": 1.0, "causal": False}


@pytest.mark.parametrize("op,dtype,config", [pytest.param(op, "float16", "huge", id=op, marks=pytest.mark.op(op))
                                             for op in ROW_OPS])
def test_row_kernels_write_rows_past_2_31_elements(op, dtype, config, backend, budgets):
    assert backend.name == "gpu", "2^17 programs in the interpreter: hours (declared gap interp-huge-rows)"
    from harness import registry
    from harness.compare import compare

    spec = registry.get(op)
    inp = _huge_inputs(op, backend.device)
    out = {name: torch.empty(HUGE_ROWS, HUGE_D, dtype=torch.float16, device=backend.device) for name in spec.outputs}
    got = spec.kernel(inp, out)
    tail = {k: (v[-3:] if isinstance(v, torch.Tensor) and v.dim() == 2 else v) for k, v in inp.items()}
    expected = spec.oracle(tail)
    scales = spec.error_scale(tail, expected)
    budget = budgets.get(op, dtype, backend.name)
    for name, g, e, sc in zip(spec.outputs, got, expected, scales):
        check = compare(name, g[-3:], e, budget, None, sc)
        assert check.passed, f"{op} output {name}, rows {HUGE_ROWS - 3}..{HUGE_ROWS - 1}: {check.problem}"
    del inp, out, got
    torch.cuda.empty_cache()
