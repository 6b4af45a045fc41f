"""The chunked row paths sum with compensation (Kahan, kernels/_device.py kahan_add), and it
must work: a row that plain fp32 summation gets visibly wrong, judged to a bound that only a
compensated sum meets. The op budgets cannot tell: they allow for an uncompensated sum too.

The row: x[0] = 1 and, at lane 0 of each of the other 1023 chunks of 16, x = 2^-13, zeros
elsewhere. The squares 2^-26 are each below half an ulp of the running sum 1, so a plain
per-lane sum stays at 1 and loses 1023 * 2^-26 = 1.5e-5 of it, moving y by half that, 7.6e-6
relative (64 fp32 ulp). Compensated, the sum is off by ~2u (u = 2^-24); y then carries that
halved, the rsqrt (an approximation on the GPU, within 2 ulp = 4u), and two products (2u): ~7u.
The check allows 16u relative (9.5e-7): eight times below what a lost compensation costs.
"""
import pytest
import torch

import kernels

U = 2.0 ** -24
CHUNK, CHUNKS = 16, 1024


@pytest.mark.op("rmsnorm")
def test_rmsnorm_chunked_sum_is_compensated(backend):
    D = CHUNK * CHUNKS
    x = torch.zeros(1, D, dtype=torch.float64)
    x[0, 0] = 1.0
    x[0, CHUNK::CHUNK] = 2.0 ** -13
    w = torch.ones(D, dtype=torch.float32)
    y = kernels.rmsnorm(x.float().to(backend.device), w.to(backend.device), 0.0, block_cols=CHUNK).cpu().double()
    truth = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True))
    err = ((y - truth).abs() / truth.abs().clamp_min(1e-30)).max().item()
    assert err <= 16 * U, (f"rmsnorm's chunked path (block_cols={CHUNK}, {CHUNKS} chunks) is off by {err:.3g} "
                           f"relative > {16 * U:.3g} (16u): its sum of squares lost the small terms that "
                           f"compensated summation keeps (tests/test_compensated_sums.py)")
