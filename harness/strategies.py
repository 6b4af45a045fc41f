"""Hypothesis building blocks for cases: shapes, layouts, value regimes, seeds.

Hypothesis draws only small integers and choices; tensors are built from a drawn seed with a
torch.Generator (drawing whole arrays trips Hypothesis's health checks and does not shrink
well). Shapes scale with the run's size class: "small" keeps an interpreted case to a few
programs, "large" is for the GPU.
"""
from __future__ import annotations

from hypothesis import strategies as st

from harness import gaps
from harness.cases import LAYOUTS

# The catalogue's feature dims: not powers of two, and powers of two +-1.
CATALOGUE_DIMS = (1, 3, 63, 65, 96, 127, 129, 4095, 4097)

_size = "small"
_backend = ("interpreter", {})          # (backend name, versions): for gaps in value regimes
_parts = 1


def configure(size: str, backend_name: str, versions: dict, parts: int = 1) -> None:
    global _size, _backend, _parts
    if size not in ("small", "large"):
        raise ValueError(f"size: expected small or large, got {size!r}")
    _size, _backend, _parts = size, (backend_name, versions), parts


def size() -> str:
    return _size


def random_parts() -> int:
    """How many test items share the random examples of one op, dtype and config."""
    return _parts


def regimes(op: str, dtype: str, config: str, allowed, params: dict | None = None):
    """Value regimes to draw from, minus those a declared gap says this backend gets wrong (for a
    case with these params, where a gap names params)."""
    keep = [regime for regime in allowed
            if (gap := gaps.find(_backend[0], op, dtype, config, _backend[1], values=regime, params=params)) is None
            or "*" in gap.values]
    return st.sampled_from(keep)


def seeds():
    return st.integers(0, 2**31 - 1)


def layouts(exclude=()):
    return st.sampled_from([layout for layout in LAYOUTS if layout not in exclude])


def feature_dims(size: str):
    if size == "small":
        return st.one_of(st.integers(1, 80), st.sampled_from((96, 127, 128, 129, 255, 257)))
    return st.one_of(st.integers(1, 300), st.sampled_from(CATALOGUE_DIMS + (1024, 2048, 4096, 8192, 16383, 16385)))


# Per case: at most this many elements (the float64 oracle runs on the CPU) and rows (each
# interpreted program costs about half a millisecond).
MAX_ELEMENTS = {"small": 1 << 13, "large": 1 << 21}
MAX_ROWS = {"small": 8, "large": 4096}


def row_budget(size: str, row_len: int) -> int:
    """How many rows of `row_len` elements one case may have."""
    return max(1, min(MAX_ROWS[size], MAX_ELEMENTS[size] // max(row_len, 1)))


@st.composite
def lead_shapes(draw, max_rows: int, max_dims: int = 3, min_dims: int = 1):
    """Leading (row) dims whose product is at most `max_rows`."""
    dims, left = [], max_rows
    for _ in range(draw(st.integers(min_dims, max_dims))):
        d = draw(st.integers(1, max(1, min(left, 64))))
        dims.append(d)
        left = max(1, left // d)
    return tuple(dims)
