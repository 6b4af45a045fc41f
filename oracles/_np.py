import numpy as np
import torch


def f64(t: torch.Tensor) -> np.ndarray:
    """A float64 NumPy copy of a tensor (any device, dtype, strides)."""
    return t.detach().to("cpu", torch.float64).numpy().copy()


def tensor(a: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(a, dtype=np.float64))
