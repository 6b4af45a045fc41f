"""moe_route and moe_permute properties beyond the battery's cases (tests/test_ops.py): the
permutation on ids the router cannot produce (ids of other ranks, many chunks, int64 and strided
ids), determinism, and the float64-then-fp32 scores on every 16-bit logit."""
import sys

import pytest
import torch

import kernels
import oracles
import references
from harness.cases import TORCH_DTYPES

pytestmark = pytest.mark.op("moe_route")


def _exact(got, want, what):
    assert torch.equal(got.double().cpu(), want.double().cpu()), f"{what}: not the oracle's"


@pytest.mark.parametrize("scan_tile", ["planned", 16])
@pytest.mark.parametrize("T,k,E,block", [(300, 4, 8, 16), (70, 64, 128, 4), (33, 3, 60, 1), (1, 8, 8, 64)])
def test_permute_over_many_chunks_and_scan_tiles(T, k, E, block, scan_tile, backend, monkeypatch):
    """Ids drawn skewed towards a few experts (others get none): more entries than one chunk
    (E 128: 70 chunks of 64 on the interpreter, 35 of 128 on a GPU), exact against the oracle and
    the torch reference; with the scan's tile as planned (all chunks in one pass) and at 16 chunks
    (several passes, each carrying the earlier passes' counts)."""
    if scan_tile != "planned":
        scan = sys.modules["kernels.moe"]._SCAN
        monkeypatch.setitem(scan, "elements", scan["block_x"] * scan_tile)
    gen = torch.Generator().manual_seed(T * k)
    weights = torch.rand(E, generator=gen) ** 4
    ids = torch.multinomial(weights, T * k, replacement=True, generator=gen).reshape(T, k).to(torch.int32)
    ids = ids.to(backend.device)
    got = kernels.moe_permute(ids, E, block)
    want = oracles.moe_permute(ids, E, block)
    ref = references.moe_permute(ids, E, block)
    for name, g, w, r in zip(("sorted_ids", "block_expert", "num_padded", "inv"), got, want, ref):
        _exact(g, w, name)
        _exact(r, w, f"reference {name}")


@pytest.mark.parametrize("T, k, E, block", [(1, 2, 8, 16), (5, 8, 128, 16), (7, 3, 5, 4), (0, 2, 4, 16),
                                         (16, 8, 64, 64), (905, 1, 8, 16)])
def test_one_chunk_permutation_matches_the_four_kernels(T, k, E, block, backend, monkeypatch):
    """Entries that fit one chunk take the one-launch kernel; forced onto the four kernels, the
    same ids give the same bits (bad ids included), and both match the oracle. 905 entries on 8
    experts make a capacity of 1025: the sentinel fill's last block of 1024 slots holds one slot."""
    gen = torch.Generator().manual_seed(T * 131 + E)
    ids = torch.randint(-1, E + 1, (T, k), generator=gen, dtype=torch.int32).to(backend.device)
    one = kernels.moe_permute(ids, E, block)
    monkeypatch.setattr(sys.modules["kernels.moe"], "_ONE_CHUNK_CAPACITY", -1)
    four = kernels.moe_permute(ids, E, block)
    for a, b, what in zip(one, four, ("sorted_ids", "block_expert", "num_padded", "inv")):
        _exact(a, b, what)
    for a, b, what in zip(one, oracles.moe_permute(ids, E, block), ("sorted_ids", "block_expert", "num_padded", "inv")):
        _exact(a, b, what)


def test_permute_drops_ids_of_other_ranks(backend):
    """Ids outside [0, E) (-1, E, huge) take no slot, and their inverse is -1."""
    ids = torch.tensor([[0, -1], [7, 3], [8, 3], [-5, 2**31 - 1], [3, 0]], dtype=torch.int32, device=backend.device)
    got = kernels.moe_permute(ids, 8, 4)
    want = oracles.moe_permute(ids, 8, 4)
    for name, g, w in zip(("sorted_ids", "block_expert", "num_padded", "inv"), got, want):
        _exact(g, w, name)
    inv = got[3].cpu()
    assert inv[[1, 4, 6, 7]].eq(-1).all() and int(got[2]) == 12


def test_permute_int64_and_strided_ids_match(backend):
    """int64 ids (torch.topk's) and a transposed view give the bits of int32 contiguous ids."""
    gen = torch.Generator().manual_seed(3)
    ids = torch.randint(0, 6, (40, 3), generator=gen, dtype=torch.int32).to(backend.device)
    plain = kernels.moe_permute(ids, 6, 8)
    for other in (ids.long(), ids.t().contiguous().t(), ids.long().t().contiguous().t()):
        for a, b in zip(plain, kernels.moe_permute(other, 6, 8)):
            assert torch.equal(a, b)


@pytest.mark.parametrize("scoring", ["softmax", "sigmoid"])
def test_two_runs_give_the_same_bits(scoring, backend):
    x = torch.randn(50, 64, generator=torch.Generator().manual_seed(4)).round().to(backend.device)   # many ties
    bias = torch.zeros(64, device=backend.device) if scoring == "sigmoid" else None
    runs = []
    for _ in range(2):
        ids, w = kernels.moe_route(x, 8, scoring=scoring, bias=bias, renormalize=True)
        runs.append((ids, w, *kernels.moe_permute(ids, 64, 16)))
    for a, b in zip(*runs):
        assert torch.equal(a, b)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_sigmoid_rounds_every_16_bit_logit_as_the_oracle(dtype, backend):
    """The selection key with a bias is fl32(fl32(sigmoid(x)) + bias): kernel and oracle both
    round a float64 sigmoid to fp32, and can disagree only where the float64 value lies within a
    few float64 units of an fp32 midpoint, since their float64 exp comes from different libraries
    (NumPy's or the GPU's libdevice for the kernel, ATen's for the oracle, and ATen's depends on
    the CPU: under OPENBLAS_CORETYPE=Prescott, ATen's scalar path, x = 9.6e-6 rounds the other
    way). Every fp16 / bf16 bit pattern (NaN included), as weights of E = 8, top_k = 8 routing:
    each fp32 score is the oracle's rounding of its float64 sigmoid, or the fp32 neighbour across
    a midpoint that the float64 value sits on (within 2^-44 relative)."""
    bits = torch.arange(-2**15, 2**15, dtype=torch.int32).to(torch.int16)
    x = bits.view(TORCH_DTYPES[dtype]).reshape(-1, 8).to(backend.device)
    if dtype == "bfloat16" and backend.name == "interpreter":
        # The interpreter misreads bf16 subnormals (declared gap interp-bf16-subnormal-load):
        # widen to fp32 on the host, exactly, and route the fp32 logits instead.
        x = x.float()
    ids, w = kernels.moe_route(x, 8, scoring="sigmoid")
    want = oracles.moe_route(x, 8, scoring="sigmoid")
    _exact(ids, want[0], "ids")
    got, exact = w.cpu(), want[1].cpu()
    expected = exact.float()
    assert torch.equal(got.isnan(), expected.isnan()), "NaN where the oracle has none, or the reverse"
    differ = (got != expected) & ~got.isnan()
    neighbour = torch.nextafter(expected, got) == got
    midpoint = (got.double() + expected.double()) / 2
    on_midpoint = (exact - midpoint).abs() <= 2.0**-44 * exact.abs()
    wrong = differ & ~(neighbour & on_midpoint)
    assert not wrong.any(), (f"{int(wrong.sum())} fp32 sigmoids differ from the float64 ones rounded to nearest "
                             f"away from a midpoint, e.g. x = {x.cpu()[wrong.nonzero()[0].tolist()[0]].tolist()}")
    assert int(differ.sum()) <= 4, f"{int(differ.sum())} fp32 sigmoids sit on a rounding midpoint: more than chance"
