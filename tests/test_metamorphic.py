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
