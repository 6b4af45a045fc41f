"""Prefill replayed from CUDA graphs, one graph per padded length (a bucket).

An eager prefill of Qwen2-1.5B is ~230 Triton launches plus the torch ops around them; on the
GPU runner's CPU that host work (~45 ms) exceeds the GPU's at 512 tokens and even at 4096. A
graph replays all of it in one host call. Graphs need fixed shapes, so B prompts of one length
T run padded to Tb = bucket(T) tokens each (a power of two up to 1024, then multiples of 512):
the padding sits after each prompt's last token, and every kernel of the model is row-wise
(GEMMs, norms, RoPE) or causal (attention), so no real token sees a padded one. The keys and
values of the real tokens are copied from the graph's staging buffers into the cache after the
replay (one copy for all layers); the padded ones are dropped.

A graph is captured on the first prompt of its (B, Tb) and kept on the model for the next ones
(the first costs an eager pass at the padded shape plus the capture). It owns its intermediate
buffers (a private memory pool, ~0.3 GB at 4096 tokens of Qwen2-1.5B): callers that see many
buckets can drop them with model.prefill_graphs.clear().
"""
from __future__ import annotations

import weakref

import torch

import kernels
from models.capture import capture

MAX_TOKENS = 8192       # B x Tb above this: eager (GPU-bound there; a graph would only cost memory)


def bucket(T: int) -> int:
    """The padded length of a prompt of T tokens: powers of two up to 1024 (at most 2x the
    tokens where a prefill costs little), then multiples of 512 (at most 512 extra)."""
    if T <= 1024:
        return max(16, 1 << (T - 1).bit_length())
    return -(-T // 512) * 512


class PrefillGraph:
    """The prefill of B prompts of up to Tb tokens each, captured. graph(ids [B, T], cache)
    -> last-token logits [B, V] (a new tensor); the cache (empty, B rows) receives keys and
    values of positions < T."""

    def __init__(self, model, B: int, Tb: int):
        if torch.device(model.device).type != "cuda":
            raise ValueError(f"model: CUDA graphs need a CUDA device, the model is on {model.device}")
        c = model.config
        dev, dtype = model.device, model.dtype
        # A weak reference: the model keeps its graphs (model.prefill_graphs), and a cycle would
        # leave a dropped model and its graphs to the cyclic collector (models/capture.py says why
        # that matters).
        self._model = weakref.ref(model)
        self.B, self.Tb = B, Tb
        self.x = torch.zeros((B * Tb, c.hidden_size), dtype=dtype, device=dev)      # embeddings, written per call
        self.positions = torch.arange(Tb, device=dev).repeat(B)
        self.last = torch.zeros(B, dtype=torch.int64, device=dev)                   # rows of the last real tokens
        stage = (c.num_hidden_layers, B, Tb, c.num_key_value_heads, c.head_dim)
        self.k = torch.zeros(stage, dtype=dtype, device=dev)
        self.v = torch.zeros(stage, dtype=dtype, device=dev)
        self._step()                    # eager, at the graph's shapes: compiles every kernel first
        torch.cuda.synchronize(dev)
        self.graph = torch.cuda.CUDAGraph()
        with capture(self.graph):
            self.logits = self._step()

    @property
    def model(self):
        return self._model()

    def _step(self) -> torch.Tensor:
        model, B, Tb = self.model, self.B, self.Tb

        def attend(i, q, k, v):
            self.k[i].copy_(k.view(B, Tb, *k.shape[1:]))
            self.v[i].copy_(v.view(B, Tb, *v.shape[1:]))
            out = kernels.flash_attention(q.view(B, Tb, *q.shape[1:]), k.view(B, Tb, *k.shape[1:]),
                                          v.view(B, Tb, *v.shape[1:]), True)
            return out.view(q.shape)

        h = model._layers(self.x, self.positions, attend)
        return model.logits(h[self.last])

    def __call__(self, ids: torch.Tensor, cache=None) -> torch.Tensor:
        B, Tb = self.B, self.Tb
        T = ids.shape[1]
        padded = torch.zeros((B, Tb), dtype=torch.int64, device=self.x.device)
        padded[:, :T] = ids
        # Eager, outside the graph: the ids are checked (one host sync, ValueError on a bad id).
        kernels.embedding(padded.view(-1), self.model.embed, out=self.x)
        self.last.copy_(torch.arange(B) * Tb + (T - 1))
        self.graph.replay()
        if cache is not None:
            cache.write_prefix(self.k[:, :, :T], self.v[:, :, :T])
        return self.logits.clone()          # the graph's buffer is overwritten by the next replay
