"""pytest parameter lists for the op tests: identical on every xdist worker (no randomness)."""
from __future__ import annotations

import pytest

from harness import registry


def random_params(op_names, parts: int = 1) -> list:
    """(op, dtype, config, part) items: `parts` per op, dtype and kernel config. A profile's
    examples of one op, dtype and config come in several parts (the gpu profile's: each part
    its own test and its own fixed seed, harness/plugin.py) so that no single test runs long
    and xdist can spread them over its workers."""
    out = []
    for name in op_names:
        op = registry.get(name)
        for dtype in op.dtypes:
            for config in op.configs:
                if config in op.pinned_configs:
                    continue
                for part in range(1, parts + 1):
                    pid = f"{name}-{dtype}-{config}" + (f"-part{part}of{parts}" if parts > 1 else "")
                    out.append(pytest.param(name, dtype, config, part, id=pid, marks=pytest.mark.op(name)))
    return out


def pinned_params(op_names) -> list:
    """Every pinned catalogue case of these ops, in every dtype, each its own test id."""
    out = []
    for name in op_names:
        op = registry.get(name)
        for dtype in op.dtypes:
            out += [pytest.param(case, id=case.id, marks=pytest.mark.op(name)) for case in op.pinned(dtype)]
    return out
