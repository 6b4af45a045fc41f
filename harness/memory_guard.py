"""Guard regions: out-of-bounds stores and reads of a kernel, seen on any backend.

Each buffer a check hands a kernel lives inside a larger allocation:

    [ margin | buffer | margin ]

- Outputs (and every buffer a launcher allocates through kernels._launch.allocate: outputs it
  makes itself, split partials, workspaces) get margins of a canary byte pattern. After the
  launch the margins must still hold it; a store past either end fails the check, naming the
  buffer, the side, the touched element nearest to the buffer and how many were touched. The
  buffer itself starts as NaN (zeros where the kernel relies on it), so an element the kernel
  never wrote, or a partial it reads before writing, shows up as NaN in the result.
- Inputs are copied flush against margins of NaN (the dtype's largest value for integers), so a
  read past an input's first or last element feeds NaN, or an out-of-range index, into the
  result, and the comparison fails. Views keep their strides, the gaps inside their storage
  and their address alignment modulo ALIGN; inputs that share a storage keep sharing one.
  Their margins are checked too: an in-place kernel must not write past its inputs either.

A wild access further away than the margin is not seen here; compute-sanitizer's memcheck
sees those (harness/sanitize.py, docs/memory-safety.md).
"""
from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass

import os

import torch

from kernels import _launch

ENV = "KERNELCHECK_MEMORY_GUARD"     # "0": no guard regions (compute-sanitizer runs set it)

ALIGN = 256                  # bytes: a guarded buffer keeps its address modulo this
MIN_MARGIN = 4096            # bytes on each side, at least; up to the buffer's own size ...
MAX_MARGIN = 1 << 20         # ... capped at 1 MiB
CANARY = 0xA7                # every margin byte of an output; as fp16 -0.0292, as fp32 -4.6e-15: no
                             # value a kernel stores by accident


@dataclass
class _Region:
    label: str               # "output 'y'", "input 'x'", "buffer 'part_o'"
    storage: torch.Tensor    # the whole allocation, as bytes
    start: int               # bytes: where the guarded span begins ...
    end: int                 # ... and ends (exclusive)
    element_size: int
    before: torch.Tensor     # the margins' expected bytes
    after: torch.Tensor


def enabled() -> bool:
    return os.environ.get(ENV, "1") != "0"


def _margin_bytes(nbytes: int) -> int:
    m = min(max(nbytes, MIN_MARGIN), MAX_MARGIN)
    return -(-m // ALIGN) * ALIGN


def poison_value(dtype: torch.dtype):
    """NaN, or for integers the largest value (an index nothing can use)."""
    if dtype == torch.bool:
        return True
    if dtype.is_floating_point:
        return math.nan
    return torch.iinfo(dtype).max


class MemoryGuard:
    """One check's guarded buffers. Disabled, it hands out plain buffers and checks nothing
    (compute-sanitizer runs want every buffer to be its own allocation)."""

    def __init__(self, enabled: bool = True):
        self.enabled = enabled
        self.regions: list[_Region] = []

    # Allocation ------------------------------------------------------------------------------
    def _guarded(self, label, n, dtype, device, phase=0) -> tuple[torch.Tensor, int]:
        """A flat allocation holding n elements at element offset `start` (returned), with
        canary margins; `phase` bytes put the span at that address offset modulo ALIGN."""
        size = torch.empty((), dtype=dtype).element_size()
        margin = _margin_bytes(n * size)
        total_b = ALIGN + margin + phase + n * size + margin
        raw = torch.full((-(-total_b // size) * size,), CANARY, dtype=torch.uint8, device=device)
        start_b = (-raw.data_ptr()) % ALIGN + margin + phase      # aligned however the allocator aligns
        self.regions.append(_Region(label, raw, start_b, start_b + n * size, size,
                                    raw[:start_b].clone(), raw[start_b + n * size:].clone()))
        return raw.view(dtype), start_b // size

    def output(self, name: str, shape, dtype, device) -> torch.Tensor:
        """A contiguous output buffer full of NaN inside canary margins."""
        return self.buffer(shape, dtype, device, label=f"output '{name}'")

    def buffer(self, shape, dtype, device, *, label: str, zero: bool = False) -> torch.Tensor:
        shape = tuple(shape)
        fill = 0 if zero else poison_value(dtype)
        if not self.enabled:
            return torch.full(shape, fill, dtype=dtype, device=device)
        n = math.prod(shape)
        flat, start = self._guarded(label, n, dtype, device)
        view = flat[start:start + n]
        view.fill_(fill)
        return view.view(shape)

    def allocator(self, shape, dtype, device, *, name: str, zero: bool = False) -> torch.Tensor:
        """kernels._launch.allocate's stand-in during a check's kernel launch."""
        return self.buffer(shape, dtype, device, label=f"buffer '{name}' (allocated by the launcher)", zero=zero)

    @contextlib.contextmanager
    def launcher_allocations(self):
        """Route the launchers' own allocations (outputs without out=, partials, workspaces)
        through the guard for the duration."""
        if not self.enabled:
            yield
            return
        previous = _launch.set_allocator(self.allocator)
        try:
            yield
        finally:
            _launch.set_allocator(previous)

    def inputs(self, inputs: dict, device) -> dict:
        """The inputs with every tensor on `device` moved flush against poisoned margins (same
        values, shapes, strides, aliasing); scalars, other objects and tensors elsewhere (the
        decoder's token ids on the host, say) as they are."""
        if not self.enabled:
            return inputs
        device = torch.device(device)
        groups: dict = {}            # storage address -> [(name, index in a list or None, tensor)]
        for name, value in inputs.items():
            items = list(enumerate(value)) if isinstance(value, (list, tuple)) else [(None, value)]
            for i, t in items:
                if isinstance(t, torch.Tensor) and t.device.type == device.type and t.numel() \
                        and t.layout == torch.strided and not t.requires_grad:
                    groups.setdefault(t.untyped_storage().data_ptr(), []).append((name, i, t))
        moved = {}
        for members in groups.values():
            for (name, i, _), t in zip(members, self._rehome([m[0] for m in members], [m[2] for m in members])):
                moved[(name, i)] = t
        out = {}
        for name, value in inputs.items():
            if isinstance(value, (list, tuple)):
                out[name] = type(value)(moved.get((name, i), v) for i, v in enumerate(value))
            else:
                out[name] = moved.get((name, None), value)
        return out

    def _rehome(self, names, views) -> list:
        """Copy the storage span the views cover into a guarded allocation and rebuild them."""
        size = views[0].element_size()
        spans = []
        for t in views:
            reach = [(s - 1) * st for s, st in zip(t.shape, t.stride())]
            spans.append((t.storage_offset(), t.storage_offset() + sum(reach)))
        lo = min(a for a, _ in spans)
        hi = max(b for _, b in spans)
        n = hi - lo + 1
        first = views[0]
        base_addr = first.data_ptr() - first.storage_offset() * size
        phase = (base_addr + lo * size) % ALIGN
        if phase % size:
            phase = 0
        label = "input " + ", ".join(f"'{n}'" for n in dict.fromkeys(names))
        flat, start = self._guarded(label, n, first.dtype, first.device, phase)
        poison = poison_value(first.dtype)
        flat[:start].fill_(poison)
        flat[start + n:].fill_(poison)
        flat[start:start + n].copy_(first.as_strided((n,), (1,), lo))
        region = self.regions[-1]
        region.before, region.after = (region.storage[:region.start].clone(), region.storage[region.end:].clone())
        return [flat.as_strided(t.shape, t.stride(), start + t.storage_offset() - lo) for t in views]

    # Verification ----------------------------------------------------------------------------
    def verify(self) -> list[str]:
        """A line per buffer whose margins were touched (one host sync when none was)."""
        if not self.regions:
            return []
        flags = [torch.stack([(r.storage[:r.start] != r.before).any(), (r.storage[r.end:] != r.after).any()])
                 for r in self.regions]
        by_device: dict = {}                 # one host sync per device
        for i, f in enumerate(flags):
            by_device.setdefault(f.device, []).append(i)
        touched = [None] * len(flags)
        for idx in by_device.values():
            for i, pair in zip(idx, torch.stack([flags[i] for i in idx]).tolist()):
                touched[i] = pair
        problems = []
        for r, (before, after) in zip(self.regions, touched):
            if before:
                diff = torch.nonzero(r.storage[:r.start] != r.before).flatten()
                nearest = (r.start - int(diff[-1]) + r.element_size - 1) // r.element_size
                problems.append(f"memory guard: the kernel wrote before the start of {r.label}: "
                                f"{diff.numel()} byte(s) of the {r.start}-byte margin changed, the nearest "
                                f"at element -{nearest} (before element 0)")
            if after:
                diff = torch.nonzero(r.storage[r.end:] != r.after).flatten()
                n = (r.end - r.start) // r.element_size
                problems.append(f"memory guard: the kernel wrote past the end of {r.label}: "
                                f"{diff.numel()} byte(s) of the {r.storage.numel() - r.end}-byte margin changed, "
                                f"the nearest at element +{int(diff[0]) // r.element_size} past its last "
                                f"(flat index {n + int(diff[0]) // r.element_size} of {n})")
        return problems
