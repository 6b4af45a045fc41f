"""Compiled variants by operand alignment: how many specialisations a kernel can compile.

Triton specialises a kernel on every integer argument (== 1, divisible by 16) and on every
pointer (16-byte aligned), and compiles each new combination: a second or more on the GPU. A
kernel with twenty strides and sizes meets hundreds of combinations over the suite's random
layouts (the H100's gpu profile compiled _gemm_kernel 793 times in a third of the suite), while
a production call only needs the specialisations that let loads and stores be vectorised.

`by_alignment(kernel, a="a_ptr sam sak K", ...)` groups each operand's pointer with the
integers of its layout (its strides, the extent of its contiguous dimension). At each call a
group is *aligned* when its pointer is 16-byte aligned and each of its integers is 1 or a
multiple of 16. The variant compiled for a call specialises the members of its aligned groups
as Triton would, and nothing else: an unaligned group's members and the integers of no group
(lengths, counts, offsets) are runtime values. A call whose groups are all aligned, the layout
of production tensors, so compiles the vectorised code it always did; an odd layout shares one
variant (per dtype and compile-time constant) with every other layout unaligned in the same
groups, instead of one per combination of its integers' residues. A tensor argument in no group
is a group of its own (its pointer alone).

On Triton's interpreter nothing is compiled; the same choice is made (so CPU runs exercise it)
and every variant runs the same interpreted function.
"""
from __future__ import annotations

import inspect

import torch
import triton

from kernels._launch import interpreting


class ByAlignment:
    """A @triton.jit kernel that compiles one variant per alignment of its operand groups; used
    as the kernel is: `kernel[grid](*args, **kwargs)`."""

    calls: list | None = None     # a list to note (kernel, key) of every launch in (tests set it)

    def __init__(self, kernel, groups: dict):
        self.kernel = kernel
        self.fn = kernel.fn
        self.__name__ = self.fn.__name__
        params = inspect.signature(self.fn).parameters
        self._runtime = [n for n, p in params.items() if p.annotation is inspect.Parameter.empty]
        self._index = {n: i for i, n in enumerate(params)}
        self.groups = {g: tuple(members.split()) if isinstance(members, str) else tuple(members)
                       for g, members in groups.items()}
        for g, members in self.groups.items():
            unknown = [m for m in members if m not in self._runtime]
            if unknown:
                raise ValueError(f"by_alignment({self.__name__}): group {g!r} names {unknown}, which are not "
                                 f"runtime arguments of the kernel")
        self._grouped = {m for members in self.groups.values() for m in members}
        # (index, name) of each member, per group; then the tensors of no group, one group each
        self._checks = [tuple((self._index[m], m) for m in members) for members in self.groups.values()]
        self._loose = [(self._index[n], n) for n in self._runtime if n not in self._grouped]
        self._members = list(self.groups.values())
        self._check_indices = [tuple(i for i, _ in members) for members in self._checks]
        self._loose_indices = [i for i, _ in self._loose]
        self._last_index = max([i for members in self._check_indices for i in members] + self._loose_indices,
                               default=-1)
        self._variants: dict = {}

    @staticmethod
    def _value(args, kwargs, index, name):
        return args[index] if index < len(args) else kwargs.get(name)

    def key(self, args, kwargs) -> tuple:
        """(aligned bit per group, aligned bit per ungrouped tensor): which variant a call takes.
        Runs at every launch, so it is kept lean (the host's cost of a small backward is its
        launches): exact type tests, arguments by position when the call gives them so."""
        if kwargs and len(args) <= self._last_index:
            args = [self._value(args, kwargs, i, n) for i, n in enumerate(self._index)]
        bits = []
        for members in self._check_indices:
            ok = True
            for index in members:
                v = args[index]
                kind = type(v)
                if kind is int or (kind is not bool and isinstance(v, int)):
                    ok = v == 1 or v % 16 == 0
                elif isinstance(v, torch.Tensor):
                    ok = v.data_ptr() % 16 == 0
                if not ok:
                    break
            bits.append(ok)
        for index in self._loose_indices:
            v = args[index]
            bits.append(not isinstance(v, torch.Tensor) or v.data_ptr() % 16 == 0)
        return tuple(bits)

    def unspecialised(self, key, args, kwargs) -> tuple[list, list]:
        """(integers, pointers) that the variant of `key` does not specialise, from a call's
        argument types: the members of its unaligned groups, the integers of no group and the
        unaligned tensors of none."""
        aligned = {m for ok, members in zip(key, self._members) if ok for m in members}
        ints, pointers = [], []
        for name in self._runtime:
            v = self._value(args, kwargs, self._index[name], name)
            if isinstance(v, torch.Tensor):
                if name not in aligned and not (name not in self._grouped and v.data_ptr() % 16 == 0):
                    pointers.append(name)
            elif isinstance(v, int) and not isinstance(v, bool) and name not in aligned:
                ints.append(name)
        return ints, pointers

    def _variant(self, key, args, kwargs):
        """The jitted function for `key`, made at its first call from that call's argument types."""
        found = self._variants.get(key)
        if found is None:
            if interpreting():
                found = self.kernel       # the interpreter specialises nothing: one function serves
            else:
                ints, pointers = self.unspecialised(key, args, kwargs)
                found = triton.jit(do_not_specialize=ints, do_not_specialize_on_alignment=pointers)(self.fn)
            self._variants[key] = found
        return found

    def variants(self) -> list:
        """The jitted functions made so far, one per alignment key met."""
        return list(self._variants.values())

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            key = self.key(args, kwargs)
            if ByAlignment.calls is not None:
                ByAlignment.calls.append((self, key))
            return self._variant(key, args, kwargs)[grid](*args, **kwargs)
        return launch


def by_alignment(kernel, **groups) -> ByAlignment:
    """`kernel` (a @triton.jit function) compiled per alignment of the named operand groups:
    each keyword names a group, its value the runtime arguments in it (a space-separated string)."""
    return ByAlignment(kernel, groups)
