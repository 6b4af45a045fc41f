"""Input validation and layout helpers shared by every launcher.

Launchers validate before they launch: a bad argument raises TypeError or ValueError naming
the argument, what was expected and what was given. They never return a wrong answer.
"""
from __future__ import annotations

import math
import os

import torch
import triton

FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)

# The whole row stays in registers up to this many elements; longer rows loop over chunks.
MAX_FUSED_BLOCK = 16384


def interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def _fmt_dtype(dtype) -> str:
    return str(dtype).replace("torch.", "")


def check_tensor(name: str, t, *, dtypes=FLOAT_DTYPES, ndim=None, min_ndim=None) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
    if dtypes is not None and t.dtype not in dtypes:
        want = ", ".join(_fmt_dtype(d) for d in dtypes)
        raise TypeError(f"{name}: expected dtype {want}; got {_fmt_dtype(t.dtype)}")
    if ndim is not None and t.dim() != ndim:
        raise ValueError(f"{name}: expected a {ndim}-d tensor, got shape {tuple(t.shape)}")
    if min_ndim is not None and t.dim() < min_ndim:
        raise ValueError(f"{name}: expected at least {min_ndim} dims, got shape {tuple(t.shape)}")
    if t.device.type == "cpu" and not interpreting():
        raise ValueError(f"{name}: is on the CPU; Triton kernels need a CUDA tensor "
                         "(or TRITON_INTERPRET=1 for the interpreter)")


def check_same_device(**tensors) -> None:
    items = [(n, t) for n, t in tensors.items() if t is not None]
    first_name, first = items[0]
    for name, t in items[1:]:
        if t.device != first.device:
            raise ValueError(f"{name}: expected device {first.device} (that of {first_name}), got {t.device}")


def check_same_dtype(**tensors) -> None:
    items = [(n, t) for n, t in tensors.items() if t is not None]
    first_name, first = items[0]
    for name, t in items[1:]:
        if t.dtype != first.dtype:
            raise TypeError(f"{name}: expected dtype {_fmt_dtype(first.dtype)} (that of {first_name}), "
                            f"got {_fmt_dtype(t.dtype)}")


def check_shape(name: str, t: torch.Tensor, shape: tuple) -> None:
    if tuple(t.shape) != tuple(shape):
        raise ValueError(f"{name}: expected shape {tuple(shape)}, got {tuple(t.shape)}")


def check_finite(name: str, value, *, positive=False, nonnegative=False) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name}: expected a float, got {type(value).__name__}")
    value = float(value)
    if not math.isfinite(value):
        raise ValueError(f"{name}: expected a finite number, got {value}")
    if positive and value <= 0:
        raise ValueError(f"{name}: expected a number > 0, got {value}")
    if nonnegative and value < 0:
        raise ValueError(f"{name}: expected a number >= 0, got {value}")
    return value


def check_out(out, shape, dtype, device, name: str = "out") -> None:
    """`out=` buffers must be contiguous with the result's shape, dtype and device."""
    if not isinstance(out, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor, got {type(out).__name__}")
    check_shape(name, out, shape)
    if out.dtype != dtype:
        raise TypeError(f"{name}: expected dtype {_fmt_dtype(dtype)}, got {_fmt_dtype(out.dtype)}")
    if out.device != device:
        raise ValueError(f"{name}: expected device {device}, got {out.device}")
    if not out.is_contiguous():
        raise ValueError(f"{name}: expected a contiguous tensor, got strides {out.stride()}")


# Every buffer a launcher allocates (an output when no out= is given, a split's partial results,
# a workspace) comes from allocate(), so that a test harness can hand out guarded, poisoned
# buffers instead (harness/memory_guard.py): a kernel that reads a partial it never wrote then
# reads NaN, and a store past the buffer lands in a checked margin.
_allocator = None


def set_allocator(allocator):
    """Route allocate() to `allocator(shape, dtype, device, name=, zero=)`, or back to torch
    with None. Returns the previous one."""
    global _allocator
    previous, _allocator = _allocator, allocator
    return previous


def allocate(shape, dtype, device, *, name: str, zero: bool = False) -> torch.Tensor:
    """A contiguous buffer; `zero`: the kernel relies on it starting at zero (a flag, an atomic
    max), otherwise its contents are undefined until the kernel writes them."""
    if _allocator is not None:
        return _allocator(tuple(shape), dtype, device, name=name, zero=zero)
    return (torch.zeros if zero else torch.empty)(tuple(shape), dtype=dtype, device=device)


def new_out(out, shape, dtype, device, name: str = "out") -> torch.Tensor:
    if out is None:
        return allocate(shape, dtype, device, name=name)
    check_out(out, shape, dtype, device, name)
    return out


def collapse_dims(sizes, strides_list):
    """Merge adjacent dims that every tensor in `strides_list` walks as one (row-major order).

    Returns (sizes, [strides per tensor]) with as few dims as the layouts allow; size-1 dims
    drop out. An empty `sizes` means a single row.
    """
    dims = [(s, [st[i] for st in strides_list]) for i, s in enumerate(sizes) if s != 1]
    merged: list = []
    for size, strides in dims:
        if merged:
            psize, pstrides = merged[-1]
            if all(ps == s * size for ps, s in zip(pstrides, strides)):
                merged[-1] = (psize * size, strides)
                continue
        merged.append((size, strides))
    out_sizes = [m[0] for m in merged]
    out_strides = [[m[1][k] for m in merged] for k in range(len(strides_list))]
    return out_sizes, out_strides


def leading_layout(lead_shape, *tensors_strides, max_dims: int = 3):
    """Describe the leading (row) dims of several same-shaped tensors for a row kernel.

    Kernels address row r as i0*s0 + i1*s1 + i2*s2 with (i0, i1, i2) the digits of r in the
    sizes (n0, n1, n2). Returns (n1, n2, [(s0, s1, s2) per tensor]) or None when the layout needs
    more than `max_dims` dims (the caller then copies to a contiguous tensor).
    """
    sizes, strides = collapse_dims(lead_shape, list(tensors_strides))
    if len(sizes) > max_dims:
        return None
    pad = max_dims - len(sizes)
    sizes = [1] * pad + sizes
    strides = [[0] * pad + s for s in strides]
    return sizes[1], sizes[2], [tuple(s) for s in strides]


def row_tile(n_cols: int, block_cols: int | None = None, target: int = 2048):
    """Pick (BLOCK_M, BLOCK_N, single_pass, num_warps) for a kernel that reduces along rows.

    Rows up to MAX_FUSED_BLOCK elements are held whole in registers (one read of the input);
    short rows are packed several to a program so each program moves ~`target` elements.
    `block_cols` forces the chunked path with that chunk width (tests use it to exercise the
    loop on small shapes).
    """
    full = triton.next_power_of_2(max(n_cols, 1))
    if block_cols is not None:
        if block_cols < 1 or block_cols & (block_cols - 1):
            raise ValueError(f"block_cols: expected a power of two >= 1, got {block_cols}")
        block_n = min(block_cols, full)
    else:
        block_n = min(full, MAX_FUSED_BLOCK if full <= MAX_FUSED_BLOCK else 4096)
    single = block_n >= n_cols
    block_m = max(1, min(64, target // block_n)) if single else 1
    # 4 warps up to 4096 elements a program, then more: measured best on an H200 at 32768 x 4096
    # bf16 (layernorm 3966 GB/s with 4 warps, 3753 with 8).
    num_warps = min(16, max(4, block_m * block_n // 1024))
    return block_m, block_n, single, num_warps
