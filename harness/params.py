"""pytest parameter lists for the op tests: identical on every xdist worker (no randomness)."""
from __future__ import annotations

import pytest

from harness import registry


def random_params(op_names) -> list:
    """One (op, dtype, config) item per op, dtype and kernel config."""
    out = []
    for name in op_names:
        op = registry.get(name)
        for dtype in op.dtypes:
            for config in op.configs:
                out.append(pytest.param(name, dtype, config, id=f"{name}-{dtype}-{config}", marks=pytest.mark.op(name)))
    return out


def pinned_params(op_names) -> list:
    """Every pinned catalogue case of these ops, in every dtype, each its own test id."""
    out = []
    for name in op_names:
        op = registry.get(name)
        for dtype in op.dtypes:
            out += [pytest.param(case, id=case.id, marks=pytest.mark.op(name)) for case in op.pinned(dtype)]
    return out
