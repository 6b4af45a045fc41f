"""flash-linear-attention (github.com/fla-org/flash-linear-attention, PyPI fla-core) as an
implementation of the suite's `gated_delta_rule`: `kernelcheck --impl harness.peers.fla:ADAPTERS`.

The adapter takes the launcher's arguments (kernels.gated_delta_rule) and calls fla's chunked
kernel the way a Qwen3-Next / Qwen3.5 port does (`fla.ops.gated_delta_rule.
chunk_gated_delta_rule`, forward only, q and k L2-normalised in the kernel when asked), so the
battery judges fla's outputs against the float64 oracle and the same budgets as ours. fla
supports Hv a multiple of Hk (its "grouped value attention"), the case the suite cares about.
fla is imported on the first call.
"""
from __future__ import annotations

import torch

from harness.peers._common import implementation, load

LIBRARY = "flash-linear-attention (fla-core)"


def _chunk():
    return load("fla.ops.gated_delta_rule", LIBRARY).chunk_gated_delta_rule


def gated_delta_rule(q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False, cu_seqlens=None,
                     use_qk_l2norm=False, **_config):
    """`chunk_gated_delta_rule(q, k, v, g, beta, scale, initial_state, output_final_state,
    use_qk_l2norm_in_kernel, cu_seqlens)` -> (o, final state or None). fla takes cu_seqlens as
    int64; the suite's kernel-config arguments (chunk size) are its own kernels' and dropped."""
    cu = None if cu_seqlens is None else cu_seqlens.to(torch.long)
    o, state = _chunk()(q, k, v, g, beta, scale=scale, initial_state=initial_state,
                        output_final_state=output_final_state, use_qk_l2norm_in_kernel=use_qk_l2norm,
                        cu_seqlens=cu)
    return o, state


ADAPTERS = [implementation("fla", "gated_delta_rule", gated_delta_rule, "chunk_gated_delta_rule")]
