"""mla_decode past 2^31 elements: the page table's and the cache's slot strides, and the combine
kernel's rows and sequences (tests/test_large_offsets.py's mla case covers the other indices).

A stride below 2^31 is passed to a kernel as an int32 argument, so an int32 index times it wraps
once the product passes 2^31: only the kernels' int64 casts keep these addresses right. Storage
of 2^31 elements and more comes from torch.empty and is written only where the call reads (on the
CPU nothing else is backed by memory); outputs are judged against the float64 oracle on dense
copies of what was read, under the op's budget (_judge_tail).
"""
import pytest
import torch

import kernels
from harness.gpus import LARGE_MEMORY
from test_large_offsets import _judge_tail, _release

pytestmark = getattr(pytest.mark, LARGE_MEMORY)      # one at a time on a GPU the workers share


# The decode kernel's paged addressing (kernels/mla.py, _mla_decode_kernel): the table entry of
# position p at (p // page_size) x st_p, its cache row at page x sc_p + (p % page_size) x sc_s.
# - table_stride_*: a page table [1, 3] whose page stride is 2^30 (a view of a transposed table
#   of 2^30 sequences, as as_strided makes it): entry 2 sits 2^31 elements in. Kills 128e1d8b6d
#   and f61bf02357 (mla.py:135, page mode 0: 16-position pages against the interpreter's and the
#   GPU's 64-position tiles at L 64) and e673ca3ad0 (mla.py:144, page mode 1: 64-position pages).
# - slot_stride_*: pools stored slot-major ([page_size, num_pages, L] storage used as [num_pages,
#   page_size, L], so the slot stride is num_pages x L = 2^31 / (page_size / 2)): slots from
#   page_size / 2 on sit past 2^31 elements. Kills b36dc6883c and 4db0e954e1 (mla.py:138, mode 0)
#   and 21ae3cd614 and 860f8b0e4a (mla.py:146, mode 1).
# One program, one split (capacity 3 pages): the interpreter runs each in about a second, its lane
# guard raising on the wrapped (negative) address; 8 GiB of storage on a GPU (10 GiB slot_stride).
MLA_PAGED_LAYOUTS = ["table_stride_16", "table_stride_64", "slot_stride_16", "slot_stride_64"]


@pytest.mark.op("mla_decode")
@pytest.mark.parametrize("layout", MLA_PAGED_LAYOUTS)
def test_mla_decode_page_table_and_slots_past_2_31_elements(layout, backend, budgets):
    dev, g = backend.device, torch.Generator().manual_seed(14)
    kind, ps = layout.rsplit("_", 1)[0], int(layout.rsplit("_", 1)[1])
    B, Tq, H, L, R = 1, 2, 4, 64, 16
    n_pages = 3
    T = 2 * ps + ps // 2                    # pages 0 and 1 full, page 2 half: slots up to ps - 1 read

    def dense(*shape):
        return torch.randn(*shape, generator=g).half().to(dev)
    q_nope, q_pe, c_kv, k_pe = dense(B, Tq, H, L), dense(B, Tq, H, R), dense(B, T, L), dense(B, T, R)
    if kind == "table_stride":
        num_pages, pages = 8, [5, 2, 7]
        pool_c = torch.zeros(num_pages, ps, L, dtype=torch.float16, device=dev)
        pool_k = torch.zeros(num_pages, ps, R, dtype=torch.float16, device=dev)
        step = 2**30                        # entry j at j x 2^30: entry 2 starts 2^31 elements in
        table = torch.empty((n_pages - 1) * step + 1, dtype=torch.int32, device=dev).as_strided((B, n_pages),
                                                                                                 (1, step))
        for j, p in enumerate(pages):
            table[0, j] = p
    else:
        # Slot-major pools: slot s of page p at p x L + s x num_pages x L.
        num_pages = 2**31 // ((ps // 2) * L)        # 2^22 pages of 16 slots, 2^20 of 64
        pool_c = torch.empty(ps, num_pages, L, dtype=torch.float16, device=dev).transpose(0, 1)
        pool_k = torch.empty(ps, num_pages, R, dtype=torch.float16, device=dev).transpose(0, 1)
        assert pool_c.stride(1) * (ps // 2) == 2**31 and pool_c.stride(1) < 2**31
        pages = [num_pages - 1, 3, num_pages // 2]
        table = torch.tensor([pages], dtype=torch.int32, device=dev)
    for j, p in enumerate(pages):
        lo, hi = j * ps, min(T, (j + 1) * ps)
        pool_c[p, :hi - lo] = c_kv[0, lo:hi]
        pool_k[p, :hi - lo] = k_pe[0, lo:hi]
    lens = torch.full((B,), T, dtype=torch.int32, device=dev)
    scale = 192 ** -0.5
    o, lse = kernels.mla_decode(q_nope, q_pe, pool_c, pool_k, lens, scale, table, ps)
    same = dict(q_nope=q_nope, q_pe=q_pe, c_kv=c_kv, k_pe=k_pe, lens=lens, softmax_scale=scale, page_table=None,
                page_size=None, num_splits=None)
    _judge_tail("mla_decode", (o, lse), same, budgets.get("mla_decode", "float16", backend.name), layout)
    del pool_c, pool_k, table
    _release(backend)


# The combine kernel (_mla_combine_kernel) reads split partials [B, rows, splits, L] fp32 that the
# launcher allocates contiguous: row r of sequence b at b x rows splits L + r x splits L. With 16
# splits (num_splits) of L 512:
# - rows: 2^18 + 64 heads of one sequence, rows from 2^18 on past 2^31 elements (an int32 row
#   index wraps: mla.py:199, 0fecb761d0 and 61cea0ed80);
# - sequences: 2049 sequences of 128 heads, sequence 2048's partials 2^31 elements in (batch
#   stride 2^20, an int32 argument: mla.py:200, b01aa67a13).
# No smaller input reaches them: o and lse are fresh or contiguous out= buffers (so_r = L, lse's
# row stride 1), and these products pass 2^31 only once the partials buffer holds more than 2^31
# fp32 values, all written by the decode kernel: 8 GiB on a GPU, and hours of programs in the
# interpreter (declared gap interp-huge-rows). About 9 GiB of GPU memory each.
MLA_COMBINE = {"rows": dict(B=1, H=2**18 + 64), "sequences": dict(B=2049, H=128)}


def _combine_case(layout, dev, sizes=None):
    """(inputs of the call, the tail's oracle inputs, slice of the judged outputs): sizes overrides
    MLA_COMBINE's (a scaled-down check of the case's logic)."""
    s = sizes or MLA_COMBINE[layout]
    B, H, Tq, L, R, T = s["B"], s["H"], 1, 512, 64, 256
    g = torch.Generator(device=dev).manual_seed(15)

    def dense(*shape):
        return torch.randn(*shape, generator=g, device=dev, dtype=torch.float16)
    q_nope, q_pe, c_kv, k_pe = dense(B, Tq, H, L), dense(B, Tq, H, R), dense(B, T, L), dense(B, T, R)
    lens = torch.full((B,), T, dtype=torch.int32, device=dev)
    lens[-1] = T - 37                       # a last sequence whose last split reads a partial tile
    scale = 576 ** -0.5
    call = (q_nope, q_pe, c_kv, k_pe, lens, scale)
    if layout == "rows":                    # the last 64 heads
        cut = (slice(None), slice(None), slice(-64, None))
        tail = dict(q_nope=q_nope[cut], q_pe=q_pe[cut], c_kv=c_kv, k_pe=k_pe, lens=lens)
    else:                                   # the last two sequences
        cut = slice(-2, None)
        tail = dict(q_nope=q_nope[cut], q_pe=q_pe[cut], c_kv=c_kv[cut], k_pe=k_pe[cut], lens=lens[cut])
    tail.update(softmax_scale=scale, page_table=None, page_size=None, num_splits=None)
    return call, tail, cut


@pytest.mark.parametrize("op,dtype,config,layout", [
    pytest.param("mla_decode", "float16", "huge", lay, id=lay, marks=pytest.mark.op("mla_decode"))
    for lay in MLA_COMBINE])
def test_mla_combine_reads_partials_past_2_31_elements(op, dtype, config, layout, backend, budgets):
    assert backend.name == "gpu", "hours in the interpreter (declared gap interp-huge-rows)"
    call, tail, cut = _combine_case(layout, backend.device)
    # 16 splits of 16 positions (block_n 16): each split reads its own part of the 256 positions.
    o, lse = kernels.mla_decode(*call, num_splits=16, block_n=16)
    _judge_tail(op, (o[cut], lse[cut]), tail, budgets.get(op, dtype, backend.name), f"{layout}, 16 splits")
    del call, tail, o, lse
    torch.cuda.empty_cache()
