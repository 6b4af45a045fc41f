import functools

import torch


def f64(t: torch.Tensor) -> torch.Tensor:
    """A float64 copy of a tensor on its own device (any dtype, strides): contiguous, detached,
    never the input itself, so an oracle may write into it."""
    return t.detach().to(dtype=torch.float64, memory_format=torch.contiguous_format, copy=True)


def one_thread(fn):
    """Run an oracle on one CPU thread, so that its result does not depend on the thread count.

    On the CPU torch splits an elementwise op of over 32768 elements between its threads, and
    computes the last few elements of each part without SIMD, where exp, tanh, erfc, hypot...
    can differ in the last bit: where the parts end depends on how many threads there are.
    GPU results do not depend on it, and the suite's xdist workers run one thread already."""
    @functools.wraps(fn)
    def run(*args, **kwargs):
        threads = torch.get_num_threads()
        if threads == 1:
            return fn(*args, **kwargs)
        torch.set_num_threads(1)
        try:
            return fn(*args, **kwargs)
        finally:
            torch.set_num_threads(threads)
    return run
