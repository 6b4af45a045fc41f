"""matmul and swiglu have two paths (TMA descriptors for aligned row-major 16-bit operands,
pointer loads for everything else): the layouts choose as documented, and the two agree."""
import pytest
import torch

import kernels
from kernels import gemm


def _spy(monkeypatch):
    taken = []
    for name in ("_launch_tma", "_launch"):
        real = getattr(gemm, name)
        monkeypatch.setattr(gemm, name, lambda *a, _real=real, _name=name, **k: (taken.append(_name), _real(*a, **k))[1])
    return taken


@pytest.mark.op("matmul")
def test_layout_chooses_the_path_and_both_paths_agree(backend, monkeypatch):
    dev = backend.device
    g = torch.Generator().manual_seed(0)
    a = torch.randn(37, 64, generator=g).half().to(dev)
    w = torch.randn(40, 64, generator=g).half().to(dev)
    b = torch.randn(40, generator=g).half().to(dev)
    taken = _spy(monkeypatch)
    y_tma = kernels.matmul(a, w, b, "gelu", block_m=16, block_n=16, block_k=16)
    w_t = w.t().contiguous().t()                     # same values, column-major: pointer path
    y_ptr = kernels.matmul(a, w_t, b, "gelu", block_m=16, block_n=16, block_k=16)
    kernels.matmul(a.float(), w.float())             # fp32: pointer path
    assert taken == ["_launch_tma", "_launch", "_launch"]
    torch.testing.assert_close(y_tma, y_ptr, atol=1e-3, rtol=1e-3)


@pytest.mark.op("matmul")
def test_few_rows_take_the_narrow_pointer_tiles_and_agree_with_tma(backend, monkeypatch):
    """A 16-bit matmul of <= 16 rows with no tiles asked for (a decode step's projection) takes
    the pointer kernel with narrow tiles; asked-for tiles or 17 rows keep the TMA path."""
    dev = backend.device
    g = torch.Generator().manual_seed(2)
    a = torch.randn(17, 96, generator=g).half().to(dev)
    w = torch.randn(40, 96, generator=g).half().to(dev)
    b = torch.randn(40, generator=g).half().to(dev)
    taken = _spy(monkeypatch)
    y_narrow = kernels.matmul(a[:16], w, b)
    y_tma = kernels.matmul(a[:16], w, b, block_m=16, block_n=16, block_k=16)
    y_17 = kernels.matmul(a, w, b)
    assert taken == ["_launch", "_launch_tma", "_launch_tma"]
    torch.testing.assert_close(y_narrow, y_tma, atol=1e-3, rtol=1e-3)
    torch.testing.assert_close(y_narrow, y_17[:16], atol=1e-3, rtol=1e-3)
    assert gemm._small_m_config(151936, 1536)["BLOCK_N"] == 128
    assert gemm._small_m_config(1536, 8960)["BLOCK_K"] == 512


@pytest.mark.op("swiglu")
def test_swiglu_paths_by_weight_layout_agree(backend, monkeypatch):
    """One 3-D descriptor over both weights wherever their distance allows: the halves of one
    tensor in either order, and on a GPU two separate tensors; all of these give the same sums
    (the same tiles, gate and up only swapped back in registers). Transposed weights take the
    pointer kernel, as do separate ones on the interpreter."""
    dev = backend.device
    g = torch.Generator().manual_seed(1)
    x = torch.randn(19, 48, generator=g).half().to(dev)
    wg, wu = (torch.randn(24, 48, generator=g).half().to(dev) for _ in range(2))
    gate_up, up_gate = torch.cat([wg, wu]), torch.cat([wu, wg])      # merged projections, N = 24
    bg, bu = (torch.randn(24, generator=g).half().to(dev) for _ in range(2))
    tiles = dict(block_m=16, block_n=16, block_k=16)
    taken = _spy(monkeypatch)
    y_merged = kernels.swiglu(x, gate_up[:24], gate_up[24:], bg, bu, **tiles)
    y_up_first = kernels.swiglu(x, up_gate[24:], up_gate[:24], bg, bu, **tiles)
    y_apart = kernels.swiglu(x, wg, wu, bg, bu, **tiles)
    y_strided = kernels.swiglu(x, wg.t().contiguous().t(), wu, bg, bu, **tiles)
    y_swapped = kernels.swiglu(x, gate_up[24:], gate_up[:24], bu, bg, **tiles)     # gate and up exchanged
    apart = "_launch_tma" if backend.name == "gpu" else "_launch"
    assert taken == ["_launch_tma", "_launch_tma", apart, "_launch", "_launch_tma"]
    # the same sums; the interpreter's BLAS may order a column's sum by its position (1 ulp)
    torch.testing.assert_close(y_up_first, y_merged, atol=0, rtol=2 ** -10)
    torch.testing.assert_close(y_apart, y_merged, atol=1e-3, rtol=1e-3)
    torch.testing.assert_close(y_merged, y_strided, atol=1e-3, rtol=1e-3)
    assert not torch.allclose(y_swapped, y_merged, atol=1e-2)    # gate and up do not commute


def test_weight_pairs_are_recognised_exactly():
    both = torch.zeros(2 * 24 + 8, 40, dtype=torch.float16)
    base, gap, up_first = gemm._weight_pair(both[:24], both[24:48])
    assert base.shape == (2, 24, 40) and gap == 24 * 40 and not up_first
    assert gemm._weight_pair(both[:24], both[32:56])[1] == 32 * 40              # a gap is fine
    base, gap, up_first = gemm._weight_pair(both[24:48], both[:24])             # up before gate
    assert up_first and gap == 24 * 40 and base.data_ptr() == both.data_ptr()
    assert gemm._weight_pair(both[:24], both[12:36]) is None          # overlapping rows
    assert gemm._weight_pair(both[:24], both[:24]) is None            # one tensor twice
    assert gemm._weight_pair(both[:24], both[24:48].clone()) is None  # two tensors, not on a GPU
    odd = torch.zeros(46, 3, dtype=torch.float16)                     # 23 rows of 3 x 2 bytes
    assert gemm._weight_pair(odd[:23], odd[23:]) is None              # distance not a 16-byte multiple
    assert gemm._weight_pair(both[:24, :20], both[24:48, :20]) is None  # sliced rows


@pytest.mark.op("fp8_matmul")
def test_fp8_paths_agree(backend, monkeypatch):
    from kernels import fp8
    dev = backend.device
    g = torch.Generator().manual_seed(2)
    a8 = torch.randn(21, 64, generator=g).to(torch.float8_e4m3fn).to(dev)
    b8 = torch.randn(40, 64, generator=g).to(torch.float8_e4m3fn).to(dev)
    sa = (torch.rand(21, generator=g) + 0.5).to(dev)
    sb = (torch.rand(40, generator=g) + 0.5).to(dev)
    taken = []
    real = fp8._fp8_matmul_tma_kernel
    monkeypatch.setattr(fp8, "_fp8_matmul_tma_kernel", type("Spy", (), {
        "__getitem__": lambda self, grid: (taken.append("tma"), real[grid])[1]})())
    y_tma = kernels.fp8_matmul(a8, b8, sa, sb, None, torch.float32, block_m=16, block_n=16, block_k=32)
    y_ptr = kernels.fp8_matmul(a8, b8.t().contiguous().t(), sa, sb, None, torch.float32,
                               block_m=16, block_n=16, block_k=32)
    assert taken == ["tma"]
    torch.testing.assert_close(y_tma, y_ptr, atol=1e-5, rtol=1e-5)
