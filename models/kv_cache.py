"""KV caches for decode_attention: one per batch row (contiguous) or a shared pool of pages.

Both keep, per layer, keys and values after RoPE, and the length of every sequence twice: as a
Python list (to plan page allocation without a device sync) and as an int32 device tensor (what
decode_attention reads). Positions past a sequence's length are never read by the kernel; a
cache made with poison=True fills them with NaN so a test would see any such read.
"""
from __future__ import annotations

import math

import torch

from models.config import Qwen2Config


class CacheFull(RuntimeError):
    pass


class _Cache:
    paged = False

    def __init__(self, config: Qwen2Config, batch: int, dtype: torch.dtype, device):
        self.config = config
        self.batch = batch
        self.dtype = dtype
        self.device = torch.device(device)
        self.lengths = [0] * batch
        self.seqlens = torch.zeros(batch, dtype=torch.int32, device=self.device)

    def _alloc(self, shape, poison):
        fill = math.nan if poison else 0.0
        return torch.full(shape, fill, dtype=self.dtype, device=self.device)

    def reserve(self, new_lengths: list) -> None:
        """Make room for every sequence to reach new_lengths (CacheFull if it cannot)."""
        raise NotImplementedError

    def set_lengths(self, new_lengths: list) -> None:
        """Both copies of the lengths. The device tensor is updated in place: a captured decode
        step (models/decode_graph.py) reads and advances that very tensor."""
        self.lengths = list(new_lengths)
        self.seqlens.copy_(torch.tensor(new_lengths, dtype=torch.int32))

    def advance(self) -> None:
        """Host side of a decode step whose kernels already advanced `seqlens` on the device."""
        self.lengths = [n + 1 for n in self.lengths]

    def reset(self) -> None:
        """Empty every sequence, keeping the tensors (a captured decode step reads these very
        tensors: generate() reuses a cache and its graph across calls). What the old sequences
        left in the pages is never read: attention stops at each sequence's length."""
        self.set_lengths([0] * self.batch)

    def write(self, layer: int, k: torch.Tensor, v: torch.Tensor, rows: torch.Tensor, positions: torch.Tensor):
        """Store k, v [N, Hkv, D] at (rows[i], positions[i]); rows and positions are int64 [N]."""
        raise NotImplementedError

    def view(self, layer: int):
        """(k_cache, v_cache, block_table or None) of a layer, as decode_attention takes them."""
        raise NotImplementedError

    def write_prefix(self, k: torch.Tensor, v: torch.Tensor):
        """Store k, v [layers, batch, T, Hkv, D] at positions 0..T-1 of every row and layer."""
        raise NotImplementedError


class ContiguousKVCache(_Cache):
    """[layers, batch, capacity, Hkv, D] keys and values."""

    def __init__(self, config: Qwen2Config, batch: int, capacity: int, dtype: torch.dtype, device,
                 poison: bool = False):
        super().__init__(config, batch, dtype, device)
        self.capacity = capacity
        shape = (config.num_hidden_layers, batch, capacity, config.num_key_value_heads, config.head_dim)
        self.k = self._alloc(shape, poison)
        self.v = self._alloc(shape, poison)

    def reserve(self, new_lengths):
        for b, n in enumerate(new_lengths):
            if n > self.capacity:
                raise CacheFull(f"KV cache: sequence {b} would reach {n} tokens; the cache holds {self.capacity}")

    def write(self, layer, k, v, rows, positions):
        self.k[layer][rows, positions] = k
        self.v[layer][rows, positions] = v

    def view(self, layer):
        return self.k[layer], self.v[layer], None

    def write_prefix(self, k, v):
        T = k.shape[2]
        self.k[:, :, :T] = k
        self.v[:, :, :T] = v


class PagedKVCache(_Cache):
    """A pool of [num_blocks, block_size, Hkv, D] pages per layer and a block table [batch,
    max_blocks]: position p of row b lives in page block_table[b, p // block_size]. Pages are
    handed out as sequences grow, from the top of the pool down, so a sequence's pages are
    neither contiguous nor in order once several sequences grow together."""
    paged = True

    def __init__(self, config: Qwen2Config, batch: int, capacity: int, dtype: torch.dtype, device,
                 block_size: int = 16, num_blocks: int | None = None, poison: bool = False):
        super().__init__(config, batch, dtype, device)
        if block_size < 1:
            raise ValueError(f"block_size: expected >= 1, got {block_size}")
        self.block_size = block_size
        self.max_blocks = -(-capacity // block_size)
        self.capacity = self.max_blocks * block_size
        self.num_blocks = batch * self.max_blocks if num_blocks is None else num_blocks
        shape = (config.num_hidden_layers, self.num_blocks, block_size, config.num_key_value_heads, config.head_dim)
        self.k = self._alloc(shape, poison)
        self.v = self._alloc(shape, poison)
        self.free = list(range(self.num_blocks))          # popped from the end: the top pages first
        self.pages = [[] for _ in range(batch)]           # host copy of the block table
        self.block_table = torch.zeros((batch, self.max_blocks), dtype=torch.int32, device=self.device)

    def reserve(self, new_lengths):
        changed = False
        for b, n in enumerate(new_lengths):
            if n > self.capacity:
                raise CacheFull(f"KV cache: sequence {b} would reach {n} tokens; its block table holds "
                                f"{self.capacity} ({self.max_blocks} pages of {self.block_size})")
            while len(self.pages[b]) * self.block_size < n:
                if not self.free:
                    raise CacheFull(f"KV cache: no free page left for sequence {b} ({self.num_blocks} pages)")
                self.pages[b].append(self.free.pop())
                changed = True
        if changed:
            table = [row + [0] * (self.max_blocks - len(row)) for row in self.pages]
            self.block_table.copy_(torch.tensor(table, dtype=torch.int32))

    def reset(self):
        super().reset()
        self.free = list(range(self.num_blocks))
        self.pages = [[] for _ in range(self.batch)]
        self.block_table.zero_()

    def _page_slot(self, rows, positions):
        return self.block_table[rows, positions // self.block_size].long(), positions % self.block_size

    def write(self, layer, k, v, rows, positions):
        page, slot = self._page_slot(rows, positions)
        self.k[layer][page, slot] = k
        self.v[layer][page, slot] = v

    def view(self, layer):
        return self.k[layer], self.v[layer], self.block_table

    def write_prefix(self, k, v):
        L, B, T = k.shape[:3]
        page, slot = self._page_slot(torch.arange(B, device=self.device).repeat_interleave(T),
                                     torch.arange(T, device=self.device).repeat(B))
        self.k[:, page, slot] = k.reshape(L, B * T, *k.shape[3:])
        self.v[:, page, slot] = v.reshape(L, B * T, *v.shape[3:])


def make_cache(kind: str, config: Qwen2Config, batch: int, capacity: int, dtype, device, *,
               block_size: int = 16, poison: bool = False):
    if kind == "contiguous":
        return ContiguousKVCache(config, batch, capacity, dtype, device, poison=poison)
    if kind == "paged":
        return PagedKVCache(config, batch, capacity, dtype, device, block_size=block_size, poison=poison)
    raise ValueError(f"cache: expected 'contiguous' or 'paged', got {kind!r}")
