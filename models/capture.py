"""CUDA graph capture that no garbage collection can break.

A capture is invalidated (cudaErrorStreamCaptureInvalidated, raised at the next launch) when
another CUDA graph is destroyed while it runs. Python's cyclic collector can do that at any
allocation: a dropped model whose graphs sit in a reference cycle is freed whenever a
collection happens to run, which may be inside someone else's capture. The capture here pauses
the collector until it ends; what was garbage is collected later, outside. (torch.cuda.graph
no longer collects before a capture, torch.compiler.config.force_cudagraph_gc being off by
default: a full collection in a large process costs more than a capture, and is not needed
once none can run inside it.)

Seen in the gpu profile (H100 and H200, 2026-11-28): the generate command's test failed in the
whole suite on both GPUs and passed alone; its worker held the dead models and prefill graphs of
earlier decoder tests (model.prefill_graphs <-> PrefillGraph.model was a cycle then).
"""
from __future__ import annotations

import contextlib
import gc

import torch


@contextlib.contextmanager
def capture(graph: torch.cuda.CUDAGraph):
    """torch.cuda.graph(graph), with no garbage collection inside it."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        with torch.cuda.graph(graph):
            yield
    finally:
        if was_enabled:
            gc.enable()
