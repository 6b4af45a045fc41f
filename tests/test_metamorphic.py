"""Identities between the kernels' own outputs, exact on both backends: what no error budget can
see, because the wrong answer sits within a rounding of the right one.

add_rmsnorm returns u = x + residual rounded to the input dtype and y = rmsnorm(u). y must
normalise that rounded u, as the unfused pair does: normalising the unrounded fp32 sum moves y
by about one rounding of u (inside every 16-bit budget; the mutation run's survivor). Both
kernels reduce a row with the same tile (row_tile), the same loop and the same expressions, so
add_rmsnorm's y equals rmsnorm of its own u bit for bit, on the single-pass and chunked paths.
"""
import pytest
import torch

import kernels

DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}


@pytest.mark.parametrize("op,dtype,config,shape,block_cols", [
    pytest.param("add_rmsnorm", dtype, config, shape, block_cols, id=f"{dtype}-{config}-{'x'.join(map(str, shape))}",
                 marks=pytest.mark.op("add_rmsnorm"))
    for dtype in DTYPES
    for config, shape, block_cols in (("single", (7, 96), None), ("single", (3, 4096), None),
                                      ("chunked", (5, 300), 64), ("chunked", (2, 3, 1000), 256))])
def test_add_rmsnorm_normalises_the_u_it_returns(op, dtype, config, shape, block_cols, backend):
    g = torch.Generator().manual_seed(6)
    dt, dev = DTYPES[dtype], backend.device
    # Residual stream values: a sum x + r that needs more bits than the dtype has.
    x = (torch.randn(shape, generator=g) * 3).to(dt).to(dev)
    r = (torch.randn(shape, generator=g) * 100).to(dt).to(dev)
    w = (torch.rand(shape[-1], generator=g) + 0.5).to(dt).to(dev)
    y, u = kernels.add_rmsnorm(x, r, w, 1e-6, block_cols=block_cols)
    # (u itself is judged by the op's checks: the interpreter truncates bf16 stores.)
    y_of_u = kernels.rmsnorm(u, w, 1e-6, block_cols=block_cols)
    differ = y != y_of_u
    assert not differ.any(), (f"add_rmsnorm's y differs from rmsnorm of its own u in {int(differ.sum())} of "
                              f"{y.numel()} elements (first at {tuple(differ.nonzero()[0].tolist())}): it did not "
                              f"normalise the rounded u it returned")


@pytest.mark.parametrize("op,dtype,config,shape,block_cols", [
    pytest.param("layernorm", "float32", config, shape, block_cols, id=f"{config}-{'x'.join(map(str, shape))}",
                 marks=pytest.mark.op("layernorm"))
    for config, shape, block_cols in (("single", (6, 200), None), ("chunked", (3, 1000), 128))])
def test_layernorm_is_shift_invariant_bit_for_bit(op, dtype, config, shape, block_cols, backend):
    """layernorm takes its statistics of x - x[0] (the shifted-data algorithm). With x on a grid
    of 2^-10 in [-8, 8] and a shift c = 1024, x + c is exact in fp32 and so is every
    (x + c) - (x[0] + c) = x - x[0]: the kernel sees the same numbers, and layernorm(x + c) must
    equal layernorm(x) bit for bit. Statistics of the raw x (or of x + x[0]) would round
    differently at 1024 and at 1. The budget cannot see this: it scales with |x| / std."""
    g = torch.Generator().manual_seed(7)
    dev = backend.device
    x = (torch.randint(-8 * 1024, 8 * 1024, shape, generator=g).float() / 1024).to(dev)
    w = (torch.rand(shape[-1], generator=g) + 0.5).to(dev)
    b = torch.randn(shape[-1], generator=g).to(dev)
    y = kernels.layernorm(x, w, b, 1e-5, block_cols=block_cols)
    y_shifted = kernels.layernorm(x + 1024.0, w, b, 1e-5, block_cols=block_cols)
    differ = y != y_shifted
    assert not differ.any(), (f"layernorm(x + 1024) differs from layernorm(x) in {int(differ.sum())} of {y.numel()} "
                              f"elements: the statistics were not taken of x - x[0]")
