"""A decode step captured once in a CUDA graph and replayed for every token.

Eager, a decode step of Qwen2-1.5B is ~300 kernel launches whose Python and driver cost
(validation, Triton's argument binding, descriptors) far exceeds their GPU time at batch 1-16.
Replayed from a graph, the step costs one launch on the host and only its kernels' time on the
GPU. This is possible because Qwen2Decoder.decode_step touches nothing but the cache's tensors
and a token buffer, never reads the device from the host (decode_attention and embedding run
with validate=False), and keeps every shape fixed from step to step (decode_attention's
splits follow the cache's capacity, not the lengths).

What stays on the host, between replays: the cache's page reservations (a paged cache copies
its block table into the same device tensor, which the graph reads at replay time) and the
Python copy of the lengths. The graph owns its intermediate buffers (a private memory pool);
the logits it returns are one static tensor, overwritten by the next replay.
"""
from __future__ import annotations

import torch

from models.capture import capture
from models.kv_cache import _Cache


class DecodeGraph:
    """decode_step(tokens, cache) of `model`, captured for this cache (its batch, capacity and
    tensors). Call it like model.decode: graph(tokens) -> logits [B, V] (a static buffer)."""

    def __init__(self, model, cache: _Cache):
        if torch.device(model.device).type != "cuda":
            raise ValueError(f"model: CUDA graphs need a CUDA device, the model is on {model.device}")
        self.cache = cache          # (not the model: model.decode_graphs keeps this graph, and a cycle
                                    # would leave a dropped model to the cyclic collector, models/capture.py)
        self.tokens = torch.zeros(cache.batch, dtype=torch.int64, device=model.device)
        self.graph = torch.cuda.CUDAGraph()
        # Capture records the kernels without running them, so the cache is left untouched; every
        # Triton kernel of the step must be compiled before (an eager decode at these shapes,
        # which the caller has run: generate() captures after its first decode step).
        with capture(self.graph):
            self.logits = model.decode_step(self.tokens, cache)

    def __call__(self, tokens: torch.Tensor) -> torch.Tensor:
        cache = self.cache
        if tokens.shape != (cache.batch,):
            raise ValueError(f"tokens: expected shape ({cache.batch},) (one per cache row), got {tuple(tokens.shape)}")
        cache.reserve([n + 1 for n in cache.lengths])
        self.tokens.copy_(tokens)
        self.graph.replay()
        cache.advance()
        return self.logits
