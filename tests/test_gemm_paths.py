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
def test_swiglu_takes_tma_only_with_merged_weights_and_the_paths_agree(backend, monkeypatch):
    dev = backend.device
    g = torch.Generator().manual_seed(1)
    x = torch.randn(19, 48, generator=g).half().to(dev)
    both = torch.randn(48, 48, generator=g).half().to(dev)      # [w_gate; w_up], N = 24
    wg, wu = both[:24], both[24:]
    bg, bu = (torch.randn(24, generator=g).half().to(dev) for _ in range(2))
    taken = _spy(monkeypatch)
    y_merged = kernels.swiglu(x, wg, wu, bg, bu, block_m=16, block_n=16, block_k=16)
    y_apart = kernels.swiglu(x, wg.clone(), wu.clone(), bg, bu, block_m=16, block_n=16, block_k=16)
    y_swapped = kernels.swiglu(x, wu, wg, bu, bg, block_m=16, block_n=16, block_k=16)   # up before gate: not merged
    y_strided = kernels.swiglu(x, wg.t().contiguous().t(), wu, bg, bu, block_m=16, block_n=16, block_k=16)
    assert taken == ["_launch_tma", "_launch", "_launch", "_launch"]
    torch.testing.assert_close(y_merged, y_apart, atol=1e-3, rtol=1e-3)
    torch.testing.assert_close(y_merged, y_strided, atol=1e-3, rtol=1e-3)
    assert not torch.allclose(y_swapped, y_merged, atol=1e-2)    # gate and up do not commute


def test_merged_weights_are_recognised_exactly():
    both = torch.zeros(2 * 24 + 8, 40, dtype=torch.float16)
    assert gemm._merged_weights(both[:24], both[24:48]).shape == (2, 24, 40)
    assert gemm._merged_weights(both[:24], both[32:56]).stride() == (32 * 40, 40, 1)   # a gap is fine
    assert gemm._merged_weights(both[24:48], both[:24]) is None          # up before gate
    assert gemm._merged_weights(both[:24], both[12:36]) is None          # overlapping rows
    assert gemm._merged_weights(both[:24], both[24:48].clone()) is None  # two tensors
    odd = torch.zeros(46, 3, dtype=torch.float16)                        # 23 rows of 3 x 2 bytes
    assert gemm._merged_weights(odd[:23], odd[23:]) is None              # gap not a 16-byte multiple
    assert gemm._merged_weights(both[:24, :20], both[24:48, :20]) is None  # sliced rows


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
