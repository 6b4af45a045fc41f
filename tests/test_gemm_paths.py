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


@pytest.mark.op("swiglu")
def test_swiglu_takes_the_pointer_kernel_for_every_layout(backend, monkeypatch):
    dev = backend.device
    g = torch.Generator().manual_seed(1)
    x = torch.randn(19, 48, generator=g).half().to(dev)
    wg, wu = (torch.randn(24, 48, generator=g).half().to(dev) for _ in range(2))
    taken = _spy(monkeypatch)
    y_tma = kernels.swiglu(x, wg, wu, block_m=16, block_n=16, block_k=16)
    y_ptr = kernels.swiglu(x[:, :48], wg.t().contiguous().t(), wu, block_m=16, block_n=16, block_k=16)
    assert taken == ["_launch", "_launch"]       # SwiGLU: the pointer kernel (faster, bench/NOTES.md)
    torch.testing.assert_close(y_tma, y_ptr, atol=1e-3, rtol=1e-3)


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
